"""Fault injection: one task of a running job is SIGKILLed and restarted, the job still ends well.

For each victim (the ps, the chief worker0, the non-chief worker1) a local cluster of
1 ps + 2 workers is started by hand (``python -m tfps run`` with the classic flags of
``tfps.cluster.local_plan``). At a global step drawn at
random (a fixed seed per case) between the first and the last periodic checkpoint, the
victim gets SIGKILL and, a second later, is started again with the same command line and
environment, the way a container restart policy would. Then:

* the job completes at the requested global step (results.json says succeeded) and its
  SavedModel loads and predicts;
* exactly one completion message reaches a real SMTP server (the chief's APPRISE_URLS):
  a killed chief sent none, its successor sends one;
* at most one checkpoint interval of steps is redone: the global step at the kill minus
  the step training resumed from (the checkpoint that the restarted chief, or the chief
  repopulating a restarted ps, logs "restored checkpoint of step N" for; a lost non-chief
  worker rolls nothing back);
* no process of the cluster is left.

The ps-sync case also writes delta checkpoints (``--delta_checkpoint_secs 1``, workers paced
so that one lands between two full checkpoints): the ps is killed once a delta is on disk,
and the chief restores the newest full checkpoint with its deltas (tfps.task.output.delta), at the
newest delta's step, not the full checkpoint's.

Each case adds a row (recovered, seconds from the kill to the first progress line after
the restart, steps redone) to a table that the end of the module writes to
``tests/integration/.faults-table.txt`` and to the terminal. In async mode worker1 trains
on while the chief is away; its note says how far, and where the restarted chief joined.
The table, the restore parsing and the checks are shared with the compose and Ansible
matrices (tests/faults.py).

The cases (``CASES``) are the ones no other local job covers, one per victim, each restarted
by hand (as a container's restart policy does: a new process that the chief sees as a lost
peer, with no supervisor to say why):

* ``ps-sync``: the ps of a sync job, repopulated from the newest checkpoint;
* ``worker1-sync``: a non-chief worker of a sync job, whose gradient every step needs;
* ``chief-backup``: the chief of a sync job with a backup worker (the workers waiting for
  the step the killed chief did not finish must be let go), which also is the sync chief
  restarted by hand that joins the live variables.

The other cases of the old matrix run in other jobs: every victim of an async job is killed
in tests/integration/test_chaos.py's job (a ps restored from the checkpoint, a chief that
joined and redid nothing, a worker that trained again and lost nothing, the model's
accuracy, one message, nothing left), under ``tfps run --restarts``; the ps and then the
chief of a sync job, in tests/integration/test_story.py.
"""

from __future__ import annotations

import json
import random
import re
import signal
import time
from pathlib import Path

import faults
import numpy as np
import pytest
from faults import Row
from integration_helpers import (
    Proc,
    Processes,
    assert_nothing_left,
    base_env,
    checkpoint_step,
    load_and_predict,
    load_csv,
    poll,
    read_results,
)

pytestmark = pytest.mark.integration

TRAIN_STEPS = 600
CHECKPOINT_STEPS = 100
LOG_STEPS = 10
SYNC_TIMEOUT = 120
#: Pause before the restart, like a container restart policy's first back-off.
RESTART_DELAY = 1.0
#: The non-chief case slows the chief's steps (tests/fixtures/paced_model.py) so that the
#: job is still running when the restarted worker has started TensorFlow (~5-10 s, 20 s and
#: more on a loaded machine). Sync: the chief alone takes every token of a step (2
#: gradients), so after a kill at step 150 it needs 450 x 2 x 0.05 s = 45 s, while with the
#: restarted worker the rest takes 450 x 0.05 s.
PACED_MODEL = "tests.fixtures.paced_model:model_fn"
PACED_CHIEF_STEP_SECS = {"sync": 0.05}
#: Every other worker sleeps this long per step: unpaced, the demo runs at 500 steps/s and
#: more, and a kill drawn at step 300 could land after the last step (an async ps case once
#: killed the ps at step 600, while the chief was exporting, and worker1 had ended).
BASE_STEP_SECS = 0.01
#: The case with delta checkpoints (every DELTA_SECS s): its workers' pace puts deltas between
#: the full checkpoints (100 sync steps take 5 s at least).
DELTA_CASE, DELTA_SECS, DELTA_STEP_SECS = ("ps0", "sync"), 1, 0.05

TABLE_FILE = Path(__file__).with_name(".faults-table.txt")
VICTIMS = {"ps0": "ps", "worker0": "chief (worker0)", "worker1": "non-chief (worker1)"}
#: One case per victim (see the module's docstring for where the others went). "backup": a
#: sync job with a backup worker (2 workers, each step aggregates 1).
CASES = [("ps0", "sync"), ("worker1", "sync"), ("worker0", "backup")]
CASE_IDS = [f"{'ps' if v == 'ps0' else 'chief' if v == 'worker0' else 'worker1'}-{m}" for v, m in CASES]

fault_table = faults.table_fixture(
    f"fault injection: 1 ps + 2 workers, {TRAIN_STEPS} steps, a checkpoint every {CHECKPOINT_STEPS}; "
    f"SIGKILL, restart after {RESTART_DELAY:.0f} s", TABLE_FILE)


# ----------------------------------------------------------------------------- helpers
def delta_steps(model_dir: Path) -> list[int]:
    """The steps of the delta checkpoints on disk of the newest full checkpoint (tfps.task.output.delta's
    manifests; a full save removes the older ones just after it is the newest)."""
    base = f"model.ckpt-{checkpoint_step(model_dir)}"
    return [m["step"] for m in (json.loads(p.read_text()) for p in model_dir.glob("deltas/*/manifest.json"))
            if m["base"] == base]


def progress_steps(*procs: Proc, since: dict[str, int] | None = None) -> list[int]:
    """Global steps of the progress lines ("workerN: step S/M") in the processes' logs."""
    return [step for p in procs for step in faults.progress_steps(p.output()[(since or {}).get(p.name, 0):])]


def exits(proc: Proc, timeout: float) -> int:
    rc = proc.wait(timeout)
    assert rc == 0, f"{proc.name} exited with {rc}:\n{proc.tail()}"
    return rc


# ----------------------------------------------------------------------------- the cases
@pytest.mark.parametrize("victim,mode", CASES, ids=CASE_IDS)
def test_killed_task_restarts_and_job_completes(victim, mode, procs: Processes, tmp_path, smtp_server, demo_dir,
                                                fault_table):
    from tfps.cluster import local_plan
    from tfps.models import demo

    row = Row(VICTIMS[victim], mode)
    fault_table.append(row)
    t_case = time.monotonic()
    case_id = CASE_IDS[CASES.index((victim, mode))]
    target = faults.kill_target(TRAIN_STEPS, CHECKPOINT_STEPS, rng=random.Random(case_id))
    paced = victim == "worker1" and mode in PACED_CHIEF_STEP_SECS
    deltas = (victim, mode) == DELTA_CASE

    model_dir = tmp_path / "model"
    plan = local_plan(1, 2)
    argv: dict[str, list[str]] = {}
    env: dict[str, dict[str, str]] = {}
    tasks: dict[str, Proc] = {}
    for t in plan.tasks:
        argv[t.name] = ["run", *plan.task_ref(t).to_flags(), "--model_dir", str(model_dir),
                        "--train_steps", str(TRAIN_STEPS), "--checkpoint_steps", str(CHECKPOINT_STEPS),
                        "--log_steps", str(LOG_STEPS), "--tf_threads", "1", "--sync_timeout", str(SYNC_TIMEOUT),
                        *(["--sync_replicas"] if mode in ("sync", "backup") else []),
                        *(["--backup_workers", "1"] if mode == "backup" else []),
                        "--model", PACED_MODEL,
                        *(["--delta_checkpoint_secs", str(DELTA_SECS)] if deltas else [])]
        extra = {"APPRISE_URLS": smtp_server.url()} if t.name == "worker0" else {}
        if t.name.startswith("worker"):
            extra["TFPS_TEST_STEP_SECS"] = str(PACED_CHIEF_STEP_SECS[mode] if paced and t.name == "worker0"
                                               else DELTA_STEP_SECS if deltas else BASE_STEP_SECS)
        env[t.name] = base_env(**extra)
        tasks[t.name] = procs.tfps(t.name, *argv[t.name], env=env[t.name])
    ports = [t.port for t in plan.tasks]
    workers = [tasks["worker0"], tasks["worker1"]]

    try:
        # Kill at the first progress line at or past the drawn step (after the first checkpoint).
        def reached():
            steps = progress_steps(*workers)
            done = steps and max(steps) >= target and checkpoint_step(model_dir) >= CHECKPOINT_STEPS \
                and (not deltas or delta_steps(model_dir))
            return steps if done else None

        seen = poll(reached, 240, f"global step {target}", *tasks.values())
        tasks[victim].signal(signal.SIGKILL)
        t_kill = time.monotonic()
        # The chief may begin its restore (blocking until the ps is back, then logging
        # "restored checkpoint of step N") before the ps is restarted: look for it from the kill on.
        chief_log_at_kill = len(tasks["worker0"].output())
        assert tasks[victim].wait(10) == -signal.SIGKILL
        # The step at the kill: the last one logged, or the newest checkpoint if that is newer.
        ckpt_at_kill = checkpoint_step(model_dir)
        delta_at_kill = max(delta_steps(model_dir), default=0)
        row.kill_step = max(max(seen), ckpt_at_kill, delta_at_kill)
        assert ckpt_at_kill >= CHECKPOINT_STEPS, f"no periodic checkpoint before the kill at {row.kill_step}"

        time.sleep(RESTART_DELAY)
        logs_at_restart = {name: len(tasks[name].output()) for name in ("worker0", "worker1")}
        again = procs.tfps(f"{victim}-restarted", *argv[victim], env=env[victim])
        chief = again if victim == "worker0" else tasks["worker0"]
        others = [p for name, p in tasks.items() if name not in (victim, "worker0")] + \
                 ([again] if victim != "worker0" else [])

        # Recovery: the first progress line after the restart, of the restarted worker (a
        # worker was killed) or of either worker (the ps was killed and repopulated: worker1
        # may train the rest of the job while the chief, which also checkpoints, logs no line);
        # for the chief, its line "joined the live variables on the ps at step N".
        watched = (again,) if victim != "ps0" else (chief, tasks["worker1"])
        since = None if victim != "ps0" else logs_at_restart
        if victim == "worker0":
            # Async: worker1 trains on while the chief is away; the restarted chief joins the
            # live variables of the surviving ps, so nothing of that is lost.
            joined = poll(lambda: faults.JOINED.search(again.output()), 240, "the restarted chief joining the ps",
                          again)
            peak = max(progress_steps(tasks["worker1"]), default=0)
            if peak > row.kill_step + 2 * LOG_STEPS:
                row.note = f"worker1 reached step {peak} meanwhile; the chief joined at {joined.group(1)}"
            # Recovered once it joined: worker1 may have trained the rest meanwhile, and then
            # the chief has no step left to log.
            first = int(joined.group(1))
        else:
            first = min(poll(lambda: progress_steps(*watched, since=since), 240,
                             f"progress of {' or '.join(p.name for p in watched)} after the restart", *watched, chief))
        row.recover_s = round(time.monotonic() - t_kill, 1)

        # The rest of the job, every task ending by itself.
        exits(chief, 300)
        for p in others:
            exits(p, 60)

        # Where training resumed: the checkpoint the chief restored after the kill, if any.
        chief_after_kill = chief.output() if victim == "worker0" else \
            tasks["worker0"].output()[chief_log_at_kill:]
        row.resumed_from = faults.resumed_from(chief_after_kill, victim == "worker1", row.kill_step, VICTIMS[victim])
        if victim == "worker1":
            assert first >= row.kill_step - 2 * LOG_STEPS, (first, row.kill_step)
            # The restarted worker really trained: it logged its first step and a progress line
            # at a global step past the one at which its predecessor died.
            assert again.lines(r"worker1: first training step done"), again.tail()
            assert max(progress_steps(again)) > row.kill_step, (progress_steps(again), row.kill_step)
        elif victim == "worker0":
            # The ps survived: the restarted chief took up the live variables, at or past the kill.
            assert row.resumed_from >= row.kill_step, f"the chief rolled the model back to {row.resumed_from}"
            assert not faults.RESTORED.search(chief.output()), "the chief restored a checkpoint over the live ps"
            assert chief.lines(r"resuming from the newest checkpoint"), chief.tail()
            assert row.redone == 0
        else:
            assert row.resumed_from == max(ckpt_at_kill, delta_at_kill), "restored an older step than the newest save"
            if deltas:   # full + its deltas, at the newest delta's step
                row.note = f"full checkpoint of step {ckpt_at_kill} + deltas to step {delta_at_kill}"
                assert delta_at_kill > ckpt_at_kill, row.note
                assert re.search(rf"restoring step {delta_at_kill} from model\.ckpt-{ckpt_at_kill} \+ \d+ delta",
                                 chief_after_kill), chief_after_kill[-3000:]
            # The step fetched with the train op is read before the update lands (in sync mode, before
            # the chief's aggregation), so the first line after a restore can repeat the restored step.
            assert first >= row.resumed_from, f"training restarted instead of resuming: {first} < {row.resumed_from}"
        # kill_step >= ckpt_at_kill == resumed_from, so nothing negative is clamped away here.
        faults.assert_redone_at_most(row, CHECKPOINT_STEPS)

        res = read_results(model_dir)
        assert res["status"] == "succeeded", res.get("error")
        assert res["mode"] == ("sync" if mode == "backup" else mode)
        assert res["global_step"] >= TRAIN_STEPS, res["global_step"]
        assert res["export_complete"] is True
        # The story: one failure, of the victim (restarted by hand, so the cause is not known).
        faults.assert_story(res, victim, row, None)

        x, y = load_csv(demo.demo_globs("mlp", str(demo_dir))[1])
        out = load_and_predict(res["export_dir"], x)
        assert out["probabilities"].shape == (len(x), 3)
        np.testing.assert_allclose(out["probabilities"].sum(axis=1), 1.0, atol=1e-5)
        assert (out["classes"] == y).mean() > 0.8

        # Only the chief sends, and it has exited: the count is final.
        faults.assert_one_success_message([str(m["Subject"]) for m in smtp_server.messages])

        assert_nothing_left(ports, *tasks.values(), again)
        row.recovered = "yes"
    except BaseException as e:
        row.note = (str(e).strip().splitlines() or [type(e).__name__])[0][:100]
        raise
    finally:
        row.case_s = time.monotonic() - t_case
