"""Backup workers, and a sync job without them: a sync worker frozen (SIGSTOP) while the others go on.

Real local clusters (``python -m tfps run`` per task, ``tfps.cluster.local_plan``), the
paced MLP (every step sleeps a little, so that the job outlasts the freeze) and a real
webhook (tests/servers.py):

* with ``--backup_workers 1`` each step aggregates the first two gradients: the chief keeps
  stepping while worker2 is frozen (worker2 is thawed once the chief has made 100 steps
  without it), the job ends by itself and every task exits 0;
* without backup workers every step needs worker2's gradient, and one job shows both ends
  of a freeze: first a short one, which the chief waits out (no step, the "stalled"
  message; worker2 is thawed once it has come and the chief has made no step for at least
  ``HELD_SECS``) and after which training goes on with every gradient counted; then one
  past ``--sync_timeout``, which fails the job once: one final message, the step the job
  reached, the frozen task called unresponsive (not "another program").

Each freeze ends on what it waits for, not after a fixed time, and each job has the steps
it needs around its freeze and no more.
"""

from __future__ import annotations

import signal
import time

import pytest
from integration_helpers import Proc, Processes, assert_nothing_left, base_env, poll, read_results, run_flags

from tfps.timeouts import STOP_WINDOW_SECS

pytestmark = pytest.mark.integration

PACED_MODEL = "tests.fixtures.paced_model:model_fn"
#: With a backup worker: the chief's steps while worker2 is frozen before it is thawed; the
#: job's steps: 50 before the freeze, at most ~100 while the first step of the freeze
#: settles, these, and enough after it for worker2's late gradient to arrive while it runs.
STEPS_WITHOUT_WORKER2 = 100
BACKUP_STEPS = 400
#: Without backup workers: the stall threshold, how long (at least) the chief's steps are
#: counted during the short freeze, and the sync timeout that the second freeze outlasts
#: (well past the short freeze, which ends once its stalled message has come, under load).
STALL_SECS = 6
HELD_SECS = 6
SYNC_TIMEOUT = 20


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


def test_a_frozen_sync_worker_with_a_backup_worker_is_left_behind(procs, tmp_path, webhook_server):
    model_dir = tmp_path / "model"
    tasks, ports = start_cluster(procs, model_dir, "--backup_workers", 1, "--stall_timeout", 6, steps=BACKUP_STEPS,
                                 chief_env={"APPRISE_URLS": webhook_server.url()})
    chief, frozen = tasks["worker0"], tasks["worker2"]
    everyone = list(tasks.values())
    running = [p for p in everyone if p is not frozen]
    poll(lambda: chief_step(chief) >= 50, 300, "the chief's first steps", *everyone)

    frozen.signal(signal.SIGSTOP)
    try:
        time.sleep(2)   # a step already under way when the freeze began may still complete
        before = chief_step(chief)
        poll(lambda: chief_step(chief) - before >= STEPS_WITHOUT_WORKER2, 120,
             f"{STEPS_WITHOUT_WORKER2} steps of the chief while worker2 is frozen", *running)
        during = chief_step(chief) - before
    finally:
        frozen.signal(signal.SIGCONT)
    for p in everyone:
        assert p.wait(300) == 0, f"{p.name}:\n{p.tail()}"
    res = read_results(model_dir)
    assert res["status"] == "succeeded", res.get("error")
    assert res["global_step"] >= BACKUP_STEPS
    workers = res["workers"]
    assert all("dropped_gradients" in w for w in workers.values()), workers
    # Two gradients per step: worker0 and worker1 alone keep the job going, and worker2's
    # gradient of the step it froze in arrived long after that step: dropped, and counted.
    assert during >= STEPS_WITHOUT_WORKER2, f"the chief made {during} steps while worker2 was frozen"
    assert workers["worker2"]["dropped_gradients"] >= 1, workers
    assert "sync: each step aggregates 2 of 3 gradients" in chief.output(), chief.tail()
    assert_nothing_left(ports, *everyone)


def test_a_frozen_sync_worker_holds_the_job_and_past_sync_timeout_fails_it_once(procs, tmp_path, webhook_server):
    model_dir = tmp_path / "model"
    # Far more steps than the job makes: the second freeze ends it.
    tasks, ports = start_cluster(procs, model_dir, "--stall_timeout", STALL_SECS, "--sync_timeout", SYNC_TIMEOUT,
                                 steps=5000, chief_env={"APPRISE_URLS": webhook_server.url()})
    chief, frozen = tasks["worker0"], tasks["worker2"]
    everyone = list(tasks.values())
    running = [p for p in everyone if p is not frozen]
    poll(lambda: chief_step(chief) >= 50, 300, "the chief's first steps", *everyone)

    def titles() -> list[str]:
        return [str(m.get("title")) for m in webhook_server.bodies()]

    # 1. A short freeze: every step waits for worker2, so the job holds and shows as a stall
    # (a stalled message of this freeze: one may have come earlier, as the job started under load).
    frozen.signal(signal.SIGSTOP)
    try:
        n_before = len(titles())
        time.sleep(2)   # a step already under way when the freeze began may still complete
        before, since = chief_step(chief), time.monotonic()
        poll(lambda: any("stalled" in t for t in titles()[n_before:]), 120, "the stalled message", *running)
        time.sleep(max(0.0, HELD_SECS - (time.monotonic() - since)))
        during = chief_step(chief) - before
    finally:
        frozen.signal(signal.SIGCONT)
    assert during <= 10, f"the chief made {during} steps while a needed worker was frozen"
    # ... and once worker2 is thawed, the job goes on.
    thawed_at = chief_step(chief)
    poll(lambda: chief_step(chief) >= thawed_at + 30, 120, "the chief's steps after worker2 was thawed", *everyone)

    # 2. A freeze past --sync_timeout: the chief's watchdog fails the job.
    reached = chief_step(chief)
    frozen.signal(signal.SIGSTOP)
    try:
        assert chief.wait(SYNC_TIMEOUT * 2 + 60) == 1, chief.tail()
    finally:
        # Thawed as soon as the chief has ended (only the chief reports): its step times out
        # and it tells the ps, still up, that it is done, instead of finding it gone and
        # waiting out the bound on its end RPCs.
        frozen.signal(signal.SIGCONT)
    # The chief's watchdog ended it without "done" tokens (the job cannot go on): the ps and
    # the other workers are ended as every orchestrator ends them after a failed chief
    # (tfps local, compose's --exit-code-from, the play): SIGTERM, and a deliberate second
    # one past the stop window.
    others = [p for p in everyone if p is not chief]
    for p in others:
        p.signal(signal.SIGTERM)
    time.sleep(STOP_WINDOW_SECS + 0.5)
    for p in others:
        p.signal(signal.SIGTERM)
    for p in others:
        p.wait(120)

    # Only the chief sends, and it has exited: the messages are all there is.
    titles_now = titles()
    ended = [t for t in titles_now if "FAILED" in t.upper() or "SUCCEEDED" in t.upper() or "STOPPED" in t.upper()]
    assert len(ended) == 1 and "FAILED" in ended[0].upper(), titles_now
    res = read_results(model_dir)
    assert res["status"] == "failed", res
    assert res["global_step"] >= reached, (res["global_step"], reached)   # not the checkpoint's step
    assert "Graph execution error" not in res["error"]["message"], res["error"]
    assert "another program" not in chief.output() or "unresponsive" in chief.output(), chief.tail()
    # Every gradient of the short freeze counted: only a worker's gradient sent on a start-up
    # token can be stale.
    workers = res["workers"]
    assert all(w["dropped_gradients"] <= 3 for w in workers.values()), workers
    assert "worker2" in [s["task"] for s in res["stalls"]], res["stalls"]
    assert_nothing_left(ports, *everyone)
