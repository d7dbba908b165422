"""Tasks killed with SIGKILL mid-run and started again with the same command line.

Each task is started by hand (``python -m tfps run`` with the classic flags of
``tfps.cluster.local_plan``), the way a container restart policy would restart it.
Asynchronous training, so that the job keeps going while one worker is away.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from integration_helpers import (
    Proc,
    Processes,
    assert_nothing_left,
    base_env,
    checkpoint_step,
    read_history,
    read_results,
    run_flags,
)

pytestmark = pytest.mark.integration

LOG_STEPS = 10
#: The worker test needs the job to outlast a restart (a new task needs ~5 s to start
#: TensorFlow and join, much longer on a loaded machine): the chief's steps are paced
#: (tests/fixtures/paced_model.py) so that it alone cannot finish the job meanwhile; the
#: chief test restores and trains the rest itself.
WORKER_TEST_STEPS = 2000
CHIEF_TEST_STEPS = 400
PACED_MODEL = "tests.fixtures.paced_model:model_fn"
PACED_CHIEF_STEP_SECS = 0.05


def start_cluster(procs: Processes, model_dir: Path, *extra: str, steps: int, chief_env: dict | None = None):
    from tfps.cluster import local_plan
    plan = local_plan(1, 2)
    argv = {}
    tasks: dict[str, Proc] = {}
    for t in plan.tasks:
        argv[t.name] = ["run", *plan.task_ref(t).to_flags(),
                        *run_flags(model_dir, "--log_steps", LOG_STEPS, *extra, steps=steps)]
        env = base_env(**chief_env) if chief_env and t.name == "worker0" else None
        tasks[t.name] = procs.tfps(t.name, *argv[t.name], env=env)
    ports = [t.port for t in plan.tasks]
    return tasks, argv, ports


def sigkill(proc: Proc) -> None:
    proc.signal(signal.SIGKILL)
    assert proc.wait(10) == -signal.SIGKILL


def wait_until(predicate, timeout: float, what: str, *procs: Proc):
    end = time.monotonic() + timeout
    while not predicate():
        for p in procs:
            if p.returncode is not None:
                pytest.fail(f"{p.name} exited with {p.returncode} while waiting for {what}:\n{p.tail()}")
        if time.monotonic() > end:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_killed_worker_rejoins_and_job_completes(procs, tmp_path):
    model_dir = tmp_path / "model"
    tasks, argv, ports = start_cluster(procs, model_dir, "--model", PACED_MODEL, steps=WORKER_TEST_STEPS,
                                       chief_env={"TFPS_TEST_STEP_SECS": str(PACED_CHIEF_STEP_SECS)})
    tasks["worker1"].wait_for(r"worker1: first training step done", 120)
    wait_until(lambda: any(r["step"] >= 60 for r in read_history(model_dir)), 60, "training progress",
               tasks["worker0"], tasks["worker1"])
    sigkill(tasks["worker1"])
    killed_at = max(r["step"] for r in read_history(model_dir))

    again = procs.tfps("worker1-restarted", *argv["worker1"])
    chief_rc = tasks["worker0"].wait(300)
    assert chief_rc == 0, tasks["worker0"].tail()
    assert again.wait(60) == 0, again.tail()
    assert tasks["ps0"].wait(60) == 0, tasks["ps0"].tail()   # by itself: nobody signalled it

    res = read_results(model_dir)
    assert res["status"] == "succeeded"
    assert res["global_step"] >= WORKER_TEST_STEPS
    assert res["export_complete"] is True
    # The restarted worker really trained: it logged its first step and a progress line
    # at a global step past the one at which its predecessor died.
    again.wait_for(r"worker1: first training step done", 0)
    progress = [int(m.group(1)) for m in again.lines(r"worker1: step (\d+)/%d" % WORKER_TEST_STEPS)]
    assert progress, again.tail()
    assert max(progress) > killed_at
    assert_nothing_left(ports, *tasks.values(), again)


def test_killed_chief_joins_the_live_ps_and_loses_nothing(procs, tmp_path):
    model_dir = tmp_path / "model"
    tasks, argv, ports = start_cluster(procs, model_dir, "--checkpoint_steps", 50, steps=CHIEF_TEST_STEPS)
    # The first periodic checkpoint (the chief's first save, right after its first step, is not one).
    wait_until(lambda: checkpoint_step(model_dir) >= 50, 120, "a checkpoint at step 50 or later",
               tasks["worker0"], tasks["worker1"])
    sigkill(tasks["worker0"])
    checkpointed = checkpoint_step(model_dir)
    assert checkpointed >= 50
    killed_at = max([checkpointed] + [r["step"] for r in read_history(model_dir)])

    chief = procs.tfps("worker0-restarted", *argv["worker0"])
    assert chief.wait(300) == 0, chief.tail()
    assert chief.lines(r"resuming from the newest checkpoint"), chief.tail()
    # The ps kept the variables: the chief takes them up as they are (worker1 may have trained
    # on meanwhile) instead of restoring its older checkpoint over them.
    joined = [int(m.group(1)) for m in chief.lines(r"joined the live variables on the ps at step (\d+)")]
    assert joined and joined[0] >= killed_at, (joined, killed_at, chief.tail())
    assert not chief.lines(r"restored checkpoint of step"), chief.tail()
    # (worker1 may well have trained the rest of the job meanwhile: the chief then only saves.)
    assert tasks["worker1"].wait(60) == 0, tasks["worker1"].tail()
    assert tasks["ps0"].wait(60) == 0, tasks["ps0"].tail()

    res = read_results(model_dir)
    assert res["status"] == "succeeded"
    assert res["global_step"] >= CHIEF_TEST_STEPS
    assert res["export_complete"] is True
    # The story: one failure, the chief's, with nothing redone.
    assert [(r["task"], r["how"], r["steps_redone"]) for r in res["restarts"]] == [("worker0", "joined", 0)], \
        res["restarts"]
    assert_nothing_left(ports, *tasks.values(), chief)
