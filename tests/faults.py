"""What the three fault-injection matrices share: the table, the restore parsing, the checks.

tests/integration/test_faults.py (local processes), tests/system/test_compose.py (one box)
and tests/system/test_ansible.py (three hosts) each SIGKILL the ps, the chief or a non-chief
worker at a step between the first and the last periodic checkpoint, in async and sync
mode, and add one row per case to a table: fault, mode, recovered, seconds to recover, the
step at the kill, the checkpoint training resumed from, the steps redone (at most one
checkpoint interval).

Where training resumed is read from tfps's own chief lines ``restored checkpoint of step N
from PATH`` (tfps/task/runtime/hooks.py, logged each time the chief's session is created from a
checkpoint, including when it recovers from a lost ps) and ``joined the live variables on
the ps at step N`` (tfps/task/runtime/rejoin.py: a restarted chief whose ps kept the variables
restores nothing, so nothing is redone), never from TensorFlow's INFO text.

tests/ is on sys.path (pytest inserts the directory of tests/conftest.py), so every suite
imports this module as ``faults``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
import re
import sys
from pathlib import Path

import pytest

#: tfps's progress line, "worker0: step 220/1000 ...".
PROGRESS = re.compile(r"\b(worker\d+): step (\d+)/(\d+)\b")
#: tfps's chief line after its session restored a checkpoint.
RESTORED = re.compile(r"restored checkpoint of step (\d+)")
#: tfps's chief line after it joined the live variables of the ps (a restarted chief, the ps survived).
JOINED = re.compile(r"joined the live variables on the ps at step (\d+)")
#: Either: where the chief's session took training up.
TOOK_UP = re.compile(rf"{RESTORED.pattern}|{JOINED.pattern}")


@dataclasses.dataclass
class Row:
    """One case of a fault matrix."""

    fault: str
    mode: str
    recovered: str = "no"
    recover_s: float | None = None
    kill_step: int | None = None
    resumed_from: int | None = None
    case_s: float | None = None
    note: str = ""

    @property
    def redone(self) -> int | None:
        """Steps trained again: from the step at the kill back to where training resumed.

        A history record or progress line can precede the checkpoint written just before
        the kill: nothing was redone then, not a negative number of steps."""
        if self.kill_step is None or self.resumed_from is None:
            return None
        return max(self.kill_step - self.resumed_from, 0)


def _fmt(value, spec: str = "") -> str:
    return "-" if value is None else format(value, spec)


def render_table(title: str, rows: list[Row]) -> str:
    head = ("fault", "mode", "recovered", "recover s", "killed at", "resumed from", "redone", "case s", "note")
    body = [(r.fault, r.mode, r.recovered, _fmt(r.recover_s, ".1f"), _fmt(r.kill_step), _fmt(r.resumed_from),
             _fmt(r.redone), _fmt(r.case_s, ".0f"), r.note) for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip() for line in [head, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join([title, *lines]) + "\n"


def write_table(config, table: str, table_file: Path | None = None) -> None:
    """The table to ``table_file`` (if given) and to the terminal, past pytest's output
    capture so that it shows without -s as well."""
    if table_file is not None:
        table_file.write_text(table)
    plugins = config.pluginmanager
    reporter, capman = plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager")
    with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
        if reporter is not None:
            reporter.write_line("")
            for line in table.splitlines():
                reporter.write_line(line)
        else:
            print(table, file=sys.stderr)


def table_fixture(title: str, table_file: Path | None = None):
    """A module-scoped fixture that collects the module's rows and writes the table at its end.

    Use: ``fault_table = faults.table_fixture("compose fault injection: ...")`` in the module."""

    @pytest.fixture(scope="module")
    def fault_table(request):
        rows: list[Row] = []
        yield rows
        if rows:
            write_table(request.config, render_table(title, rows), table_file)

    return fault_table


def kill_target(steps: int, checkpoint: int, margin: int = 0, rng: random.Random | None = None) -> int:
    """A random global step between the first and the last periodic checkpoint (``margin``
    steps inside them)."""
    return (rng or random).randint(checkpoint + margin, steps - checkpoint - margin)


def progress_steps(text: str) -> list[int]:
    """Global steps of the progress lines ("workerN: step S/M") in a task's log."""
    return [int(m.group(2)) for m in PROGRESS.finditer(text)]


def log_since_step(chief_log: str, step: int) -> str:
    """The chief's log from its last progress line at or before global ``step`` on (all of it
    when there is none). ``step`` comes from the history, which follows the job's global
    step, so it need not be a step the chief itself logged. Only lines before the first
    rollback count: after a restore the chief logs the same steps again."""
    start, previous = None, -1
    for m in PROGRESS.finditer(chief_log):
        logged = int(m.group(2))
        if logged < previous:
            break
        if logged <= step:
            start = m.start()
        previous = logged
    return chief_log if start is None else chief_log[start:]


def training_restores(chief_log: str) -> list[int]:
    """Steps the chief's sessions took training up from in ``chief_log``: the ``restored
    checkpoint of step N`` and ``joined the live variables on the ps at step N`` lines
    before its last progress line."""
    # (A chief that joined the live ps after the others trained the last step logs no progress.)
    # (A log that also holds the killed process's lines, as a container's does, has progress
    # lines before the kill only: the join after them is then the one to count.)
    last_progress = max((m.end() for m in PROGRESS.finditer(chief_log)), default=len(chief_log))
    took_up = [int(m.group(1) or m.group(2)) for m in TOOK_UP.finditer(chief_log, 0, last_progress)]
    return took_up or [int(m.group(1) or m.group(2)) for m in TOOK_UP.finditer(chief_log)]


def resumed_from(chief_log: str, lost_non_chief: bool, kill_step: int, what: str) -> int:
    """The step training resumed from after ``what`` was killed, from the chief's log since
    the kill: the first checkpoint it restored, or the step at the kill when a non-chief
    worker was lost (the model must not be rolled back then)."""
    restored = training_restores(chief_log)
    if lost_non_chief:
        assert not restored, f"losing a non-chief worker rolled the model back to {restored}"
        return kill_step
    assert restored, f"the chief neither restored nor joined after {what} was killed:\n{chief_log[-3000:]}"
    return restored[0]


def assert_redone_at_most(row: Row, interval: int) -> None:
    """At most one checkpoint interval of steps was trained again."""
    assert row.redone is not None and row.redone <= interval, \
        f"{row.redone} steps redone after the restart, more than one checkpoint interval ({interval})"


def assert_story(results: dict, victim: str, row: Row, cause: str | None) -> None:
    """results.json tells the failure: one restart of ``victim`` (``ps0``, ``worker0``,
    ``worker1``), with ``cause`` when the supervisor saw it; a chief whose ps survived
    joined the live variables and redid nothing."""
    restarts = results["restarts"]
    assert [r["task"] for r in restarts] == [victim], restarts
    if victim == "ps0":
        assert restarts[0]["cause"].startswith("lost peer"), restarts
    elif cause is not None:
        assert restarts[0]["cause"] == cause, restarts
    if victim == "worker0":
        assert row.redone == 0, f"the restarted chief redid {row.redone} steps although the ps survived"
        assert restarts[0]["how"] == "joined" and restarts[0]["steps_redone"] == 0, restarts
    assert results["started_at"] <= results["attempt_started_at"]


def history(text: str) -> list[dict]:
    """Records of the chief's history.jsonl (lines that are not JSON objects are skipped)."""
    return [json.loads(line) for line in text.splitlines() if line.strip().startswith("{")]


def step_at(records: list[dict], t: float) -> int | None:
    """The newest step the chief recorded at or before wall time ``t``."""
    return max((r["step"] for r in records if r["time"] <= t), default=None)


def recovered_after(records: list[dict], t_kill: float) -> float | None:
    """Seconds from the kill to the chief's first record stamped more than a second after it."""
    later = [r["time"] for r in records if r["time"] > t_kill + 1]
    return round(min(later) - t_kill, 1) if later else None


def predict_script(export_dir: str) -> str:
    """Python for a fresh tfps container: load the SavedModel, predict a batch of 4 random
    rows, print the batch size of every output as JSON."""
    return (f"import json, numpy as np, tensorflow as tf; m = tf.saved_model.load('{export_dir}'); "
            "f = m.signatures['serving_default']; "
            "shape = [d if d else 4 for d in f.structured_input_signature[1]['features'].shape.as_list()]; "
            "out = f(features=tf.constant(np.random.default_rng(0).normal(size=shape), tf.float32)); "
            "print(json.dumps({k: v.numpy().shape[0] for k, v in out.items()}))")


def assert_predicts(output: str) -> None:
    """The output of ``predict_script``: every output has a row per example."""
    predictions = json.loads(output.strip().splitlines()[-1])
    assert predictions and all(n == 4 for n in predictions.values()), predictions


def assert_one_success_message(subjects: list[str], job: str | None = None) -> None:
    """Exactly one completion message, and it says the job succeeded."""
    assert len(subjects) == 1, subjects
    assert "succeeded" in subjects[0] and "FAILED" not in subjects[0], subjects
    if job is not None:
        assert f"job {job}" in subjects[0], subjects
