"""An asynchronous job through ``tfps local``: it trains, exports, reports and ends by itself.

One job (1 ps + 2 workers, 1200 steps on the demo data: the first tutorial's command, with this
test's model_dir and steps after it) is shared by every test here;
each test checks one promise about its outcome. The job is started as a user would start it
from a shell that holds another cluster's TF_CONFIG, and the launcher forks its tasks (the
default): what the processes look like while it runs is recorded for the tests too. Its
output goes to a pipe (a log file): the piped console of tests/integration/test_watch_a_run.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from pathlib import Path

import docblocks
import numpy as np
import pytest
from integration_helpers import (
    FinishedJob,
    _cmdline,
    assert_nothing_left,
    assert_progressive,
    base_env,
    first_step_secs,
    launcher_ports,
    load_and_predict,
    load_csv,
    maps_tensorflow,
    read_history,
    run_flags,
    task_exit,
    tasks_of,
)
from test_watch_a_run import assert_a_piped_console

from tfps.task.output.checkpoint import checkpoint_step

pytestmark = pytest.mark.integration

#: The chief records the history as it runs steps; a job of a few hundred async steps can
#: end (the other worker training most of them) before the chief has made five runs.
STEPS = 1200


#: `tfps local ...` as the first tutorial gives it ("Train"): this job is that command.
FIRST_JOB = ["local", *docblocks.tfps_args("tutorials/first-job.md", "tests/integration/test_async_job.py", "local")]

#: A TF_CONFIG left in the user's shell (another cluster's): tfps local gives each task its own.
STRAY_TF_CONFIG = '{"cluster": {"worker": ["example.invalid:1"]}, "task": {"type": "worker", "index": 0}}'


@dataclasses.dataclass
class AsyncJob(FinishedJob):
    #: The launcher's task processes while the job ran: name -> (pid, command line, session id).
    tasks: dict = dataclasses.field(default_factory=dict)
    #: Whether the launcher had TensorFlow mapped while its tasks ran (it forks them).
    launcher_maps_tensorflow: bool | None = None


@pytest.fixture(scope="module")
def job(module_procs, tmp_path_factory) -> AsyncJob:
    model_dir = tmp_path_factory.mktemp("async") / "model"
    # The demo problem is easy: with a small learning rate and progress every 5 steps the
    # history starts before it is learnt, so that "the loss fell" means something.
    # The command of the first tutorial (docs/tutorials/first-job.md), with this test's settings after it.
    proc = module_procs.tfps("tfps-local-async", *FIRST_JOB,
                             *run_flags(model_dir, "--log_steps", 5, "--learning_rate", 0.001, steps=STEPS),
                             env=base_env(TF_CONFIG=STRAY_TF_CONFIG))
    ports = launcher_ports(proc)
    tasks = {name: (pid, _cmdline(pid), os.getsid(pid)) for name, pid in tasks_of(proc.pid, 60).items()}
    maps = maps_tensorflow(proc.pid)
    rc = proc.wait(300)
    return AsyncJob(proc, model_dir, ports, rc, tasks=tasks, launcher_maps_tensorflow=maps)


def test_job_succeeds_at_the_requested_step(job):
    assert job.rc == 0, job.proc.tail()
    res = job.results
    assert res["status"] == "succeeded"
    assert res["exit_code"] == 0
    assert res["mode"] == "async"
    assert res["global_step"] >= STEPS
    assert res["export_complete"] is True
    assert Path(res["export_dir"], "tfps_export.json").is_file()
    assert "error" not in res


def test_loss_falls(job):
    history = read_history(job.model_dir)
    assert len(history) >= 5, history
    steps = [r["step"] for r in history]
    assert steps == sorted(steps) and steps[0] > 0
    assert all(np.isfinite(r["loss"]) for r in history)
    first = history[0]["loss"]
    last = np.median([r["loss"] for r in history[-5:]])
    assert last < 0.6 * first, f"loss went from {first} to {last}"


def test_eval_accuracy_well_above_chance(job):
    ev = job.results["eval_metrics"]
    assert ev["accuracy"] > 0.8, ev      # 3 classes: chance is 0.33
    assert np.isfinite(ev["loss"])


def test_progressive_validation_of_three_classes_is_log_loss_and_accuracy(job):
    """The demo MLP (3 classes): each batch scored before it trained, over the job's window."""
    block = assert_progressive(job.model_dir, job.results, {"log_loss", "accuracy"})
    assert "auc" not in block and block["accuracy"] > 0.4, block      # chance is 0.33
    assert block["examples"] <= 64 * (job.results["global_step"] + 2), block


def test_saved_model_serves_the_eval_data(job, demo_dir):
    from tfps.models import demo
    _, eval_glob = demo.demo_globs("mlp", str(demo_dir))
    x, y = load_csv(eval_glob)
    out = load_and_predict(job.results["export_dir"], x)
    probs, classes = out["probabilities"], out["classes"]
    assert probs.shape == (len(x), 3)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(classes, probs.argmax(axis=1))
    assert (classes == y).mean() > 0.8


def test_export_marker_and_graph_are_local(job):
    res = job.results
    marker = json.loads(Path(res["export_dir"], "tfps_export.json").read_text())
    assert marker["global_step"] == checkpoint_step(res["checkpoint"]) >= STEPS   # the final checkpoint
    assert marker["inputs"] == {"features": [None, 8]}
    # Exported from a fresh local graph: no op is pinned to the (gone) ps.
    assert b"/job:ps" not in Path(res["export_dir"], "saved_model.pb").read_bytes()


def test_ps_and_workers_exit_by_themselves(job):
    out = job.proc.output()
    assert task_exit(job.proc, "ps0") == "0 (OK)"
    assert task_exit(job.proc, "worker1") == "0 (OK)"
    assert task_exit(job.proc, "worker0") == "0 (OK)"
    assert "ending tasks that did not exit by themselves" not in out
    assert "[ps0]" in out and "every worker is done" in out


def test_non_chief_joins_within_seconds(job):
    # Both tasks start at the same moment in tfps local, and each logs the seconds from
    # its own start to its first step: the difference is how long worker1 lagged.
    chief = first_step_secs(job.proc, "worker0")
    other = first_step_secs(job.proc, "worker1")
    assert 0 < chief and 0 < other
    assert other - chief < 3.0, f"worker1 trained {other - chief:.1f} s after the chief"


def test_each_task_is_a_forked_process_of_its_own(job):
    """Forked from a launcher that imported TensorFlow once (the default), each task is its
    own process, the leader of its own session, showing its ``tfps run`` command line."""
    assert set(job.tasks) == {"ps0", "worker0", "worker1"}, job.tasks
    assert len({pid for pid, _, _ in job.tasks.values()}) == 3
    for name, (pid, cmd, sid) in job.tasks.items():
        assert " -m tfps run " in cmd and f"127.0.0.1:{job.ports[0]}" in cmd, (name, cmd)
        assert sid == pid, f"{name} is not the leader of its own session"
    assert job.launcher_maps_tensorflow is True


def test_a_stray_tf_config_is_ignored_with_one_warning(job):
    assert len(job.proc.lines(r"ignoring the TF_CONFIG of this shell")) == 1, job.proc.tail()
    assert job.rc == 0 and job.results["status"] == "succeeded"


def test_nothing_left_running(job):
    assert_nothing_left(job.ports, job.proc)


# What `tfps local` may print without -v: its tasks' tfps lines ("[worker0] 19:44:03 I ..."),
# its own ("19:43:52 I tfps local: ..."), and the summary at the end.
TFPS_LINE = re.compile(r"^(\[(ps|worker)\d+\] )?\d\d:\d\d:\d\d [DIWE] \S")
SUMMARY_LINE = re.compile(r"^(job \S+ (SUCCEEDED|STOPPED|FAILED) at global step |  (final loss|progressive|start-up|checkpoint|"
                          r"export|results|plots|curves) |  \d+ step\(s\) past --train_steps )")


def test_console_shows_only_tfps_lines(job):
    lines = job.proc.output().splitlines()
    assert any(line.startswith("[worker0] ") for line in lines), lines
    foreign = [line for line in lines if not (TFPS_LINE.match(line) or SUMMARY_LINE.match(line))]
    assert foreign == [], "\n".join(foreign[:20])


def test_in_a_pipe_every_task_line_is_prefixed_and_the_counts_add_up(job):
    assert_a_piped_console(job.proc.output(), STEPS, job.results)


# -v (TensorFlow's own lines back): the spawned job of tests/integration/test_local_launch.py.


def _shape(line: str) -> str:
    """A summary line's words, its numbers and paths left out: what stays from run to run."""
    return re.sub(r"( \+_)+$", "", re.sub(r"\S*/\S*|-?\d[\d.,e+-]*", "_", line).strip())


def test_the_first_tutorials_output_is_this_commands(job):
    # docs/tutorials/first-job.md shows the summary of a real run of this command (written by
    # `make docs-outputs`): the summary this run printed has the same lines, in the same order.
    sys.path.insert(0, str(docblocks.DOCS))
    import gen_outputs
    page = gen_outputs.blocks("tutorials/first-job.md")["first-job"]
    printed = gen_outputs.OUTPUTS["first-job"].keep(job.proc.output())
    # The line on steps past --train_steps comes and goes with the workers' timing.
    def shapes(text):
        return [_shape(x) for x in text.splitlines() if "past --train_steps" not in x]
    assert shapes(page) == shapes(printed), \
        f"the summary changed: run python docs/gen_outputs.py --only first-job\n{printed}"
