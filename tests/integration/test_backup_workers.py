"""Backup workers: one of three sync workers frozen (SIGSTOP) while the others go on.

Real local clusters (``python -m tfps run`` per task, ``tfps.cluster.local_plan``), the
paced MLP (every step sleeps a little, so that the job outlasts the freeze) and a real
webhook (tests/servers.py):

* with ``--backup_workers 1`` each step aggregates the first two gradients: the chief keeps
  stepping while worker2 is frozen (worker2 is thawed once the chief has made 100 steps
  without it), the job ends by itself and every task exits 0;
* without backup workers every step needs worker2's gradient: the chief stops stepping and
  the freeze shows as a stall (the "stalled" message; worker2 is thawed once it has come
  and the chief has made no step for at least ``HELD_SECS``), and the job still ends by
  itself once worker2 is thawed.

Each freeze ends on what it waits for, not after a fixed time, and each job has the steps
it needs around its freeze and no more: 50 before it, a few dozen after it.
"""

from __future__ import annotations

import signal
import time

import pytest
from integration_helpers import Proc, Processes, assert_nothing_left, base_env, poll, read_results, run_flags

pytestmark = pytest.mark.integration

PACED_MODEL = "tests.fixtures.paced_model:model_fn"
#: Without backup workers: the chief's steps are counted over at least this long of the freeze.
HELD_SECS = 10
#: With a backup worker: the chief's steps while worker2 is frozen before it is thawed.
STEPS_WITHOUT_WORKER2 = 100
#: Steps of each job: 50 before the freeze, the chief's steps during it (at most ~100 while
#: the first step of the freeze settles, then STEPS_WITHOUT_WORKER2 with a backup worker),
#: and enough after it for worker2's late gradient to arrive while the job still runs.
STEPS = {1: 400, 0: 150}


def start_cluster(procs: Processes, model_dir, *extra, steps: int, chief_env: dict[str, str]):
    from tfps.cluster import local_plan
    plan = local_plan(1, 3)
    tasks: dict[str, Proc] = {}
    for t in plan.tasks:
        env = {"TFPS_TEST_STEP_SECS": "0.03", **(chief_env if t.name == "worker0" else {})}
        tasks[t.name] = procs.tfps(t.name, "run", *plan.task_ref(t).to_flags(),
                                   *run_flags(model_dir, "--model", PACED_MODEL, "--sync_replicas",
                                              "--log_steps", 10, *extra, steps=steps),
                                   env=base_env(**env))
    return tasks, [t.port for t in plan.tasks]


def chief_step(chief: Proc) -> int:
    import faults
    steps = faults.progress_steps(chief.output())
    return max(steps) if steps else 0


@pytest.mark.parametrize("backup", [1, 0], ids=["one-backup", "no-backup"])
def test_a_frozen_sync_worker(backup, procs, tmp_path, webhook_server):
    model_dir = tmp_path / "model"
    extra = ["--backup_workers", backup] if backup else []
    tasks, ports = start_cluster(procs, model_dir, *extra, "--stall_timeout", 6, steps=STEPS[backup],
                                 chief_env={"APPRISE_URLS": webhook_server.url()})
    chief, frozen = tasks["worker0"], tasks["worker2"]
    everyone = list(tasks.values())
    running = [p for p in everyone if p is not frozen]
    poll(lambda: chief_step(chief) >= 50, 300, "the chief's first steps", *everyone)

    def titles() -> list[str]:
        return [str(m.get("title")) for m in webhook_server.bodies()]

    frozen.signal(signal.SIGSTOP)
    try:
        time.sleep(2)   # a step already under way when the freeze began may still complete
        before, since = chief_step(chief), time.monotonic()
        if backup:
            poll(lambda: chief_step(chief) - before >= STEPS_WITHOUT_WORKER2, 120,
                 f"{STEPS_WITHOUT_WORKER2} steps of the chief while worker2 is frozen", *running)
        else:
            poll(lambda: any("stalled" in t for t in titles()), 120, "the stalled message", *running)
            time.sleep(max(0.0, HELD_SECS - (time.monotonic() - since)))
        during = chief_step(chief) - before
        seen = titles()
    finally:
        frozen.signal(signal.SIGCONT)
    for p in everyone:
        assert p.wait(300) == 0, f"{p.name}:\n{p.tail()}"
    res = read_results(model_dir)
    assert res["status"] == "succeeded", res.get("error")
    assert res["global_step"] >= STEPS[backup]
    workers = res["workers"]
    assert all("dropped_gradients" in w for w in workers.values()), workers
    if backup:
        # Two gradients per step: worker0 and worker1 alone keep the job going, and worker2's
        # gradient of the step it froze in arrived long after that step: dropped, and counted.
        assert during >= STEPS_WITHOUT_WORKER2, f"the chief made {during} steps while worker2 was frozen"
        assert workers["worker2"]["dropped_gradients"] >= 1, workers
        assert "sync: each step aggregates 2 of 3 gradients" in chief.output(), chief.tail()
    else:
        # Every step waits for worker2: the freeze holds the job and shows as a stall.
        assert during <= 10, f"the chief made {during} steps while a needed worker was frozen"
        assert any("stalled" in t for t in seen), seen
        # Every gradient counts: only a worker's gradient sent on a start-up token can be stale.
        assert all(w["dropped_gradients"] <= 3 for w in workers.values()), workers
    assert_nothing_left(ports, *everyone)
