"""A ps on its own: SIGTERM does not end it (the chief may still be saving), a second one does;
a ps started again under ``tfps run --restarts`` remembers the workers that already finished."""

from __future__ import annotations

import os
import signal
import time

import pytest
from integration_helpers import (
    _stat,
    assert_nothing_left,
    base_env,
    kill_task,
    poll,
    read_results,
    run_flags,
    task_child,
)

from tfps.timeouts import STOP_WINDOW_SECS

pytestmark = pytest.mark.integration


def start_ps(procs, *flags):
    """ps0 of a 1 ps + 2 worker cluster, alone (its workers never start), once it serves.
    Returns (the process, its port, every port of the cluster)."""
    from tfps.cluster import local_plan
    plan = local_plan(1, 2)
    ps = plan.tasks[0]
    proc = procs.tfps("ps0", "run", *plan.task_ref(ps).to_flags(), "--tf_threads", "1", *flags)
    proc.wait_for(r"ps0 serving on port %d" % ps.port, 60)
    return proc, ps.port, [t.port for t in plan.tasks]


def report_done(port: int, worker: int) -> None:
    """What a worker does at its end: put its index in ps 0's done queue."""
    import tensorflow as tf

    from tfps.task.runtime.donequeue import done_queue
    graph = tf.Graph()
    with graph.as_default():
        enqueue = done_queue(0, 2).enqueue(worker)
    config = tf.compat.v1.ConfigProto(device_filters=["/job:ps/task:0"])
    with tf.compat.v1.Session(f"grpc://127.0.0.1:{port}", graph=graph, config=config) as sess:
        sess.run(enqueue, options=tf.compat.v1.RunOptions(timeout_in_ms=30_000))


def test_ps_keeps_serving_after_sigterm_and_exits_on_the_second(procs):
    # Its workers never start: the ps must not wait for them to answer before it can
    # react to signals.
    proc, _, ports = start_ps(procs, "--final_save_timeout", 60)
    time.sleep(1.0)
    proc.signal(signal.SIGTERM)
    proc.wait_for(r"received SIGTERM: finishing", 10)
    time.sleep(3.0)
    assert proc.returncode is None, "the ps left during the final-save grace:\n" + proc.tail()
    proc.signal(signal.SIGTERM)
    t0 = time.monotonic()
    assert proc.wait(15) == 137, proc.tail()          # ExitCode.KILLED: a deliberate second signal
    assert time.monotonic() - t0 < 5
    assert "exiting now, without the final save" in proc.output()
    assert_nothing_left(ports, proc)


def test_a_ps_started_again_remembers_the_workers_that_finished(procs):
    """worker1 finishes, then the ps is SIGKILLed and started again: the new process must not
    wait for worker1 (which will never report again) but exit 0 as soon as the chief is done."""
    proc, port, ports = start_ps(procs, "--restarts", 1, "--sync_timeout", 600)
    report_done(port, 1)
    proc.wait_for(r"ps0: worker 1 is done \(1/2\)", 30)
    kill_task(proc)
    proc.wait_for(r"worker\(s\) \[1\] reported done to this task's previous process", 90)
    report_done(port, 0)
    assert proc.wait(30) == 0, proc.tail()
    out = proc.output()
    assert "starting it again (1/1)" in out
    assert "ps0: worker 0 is done (2/2)" in out and "every worker is done" in out, proc.tail()
    assert_nothing_left(ports, proc)


def test_a_stop_after_the_chiefs_final_save_ends_the_ps_with_0(procs):
    """The chief is done, worker1 never reports (dead, or gone before a ps restart): the stop
    that the orchestrator sends at the job's end is no failure of the ps."""
    proc, port, ports = start_ps(procs, "--sync_timeout", 600, "--final_save_timeout", 600)
    report_done(port, 0)
    proc.wait_for(r"ps0: worker 0 is done \(1/2\)", 30)
    proc.signal(signal.SIGTERM)
    assert proc.wait(30) == 0, proc.tail()
    assert "stop requested after the chief's final save" in proc.output()
    assert_nothing_left(ports, proc)


def test_a_worker_waiting_for_the_chief_through_a_ps_restart_joins_and_exits(procs, tmp_path):
    """Issue 51's chaos job: worker1, started again mid-job, waited for the chief in a session
    whose ps was then started again too. Every run of that session failed from then on
    (AbortedError: the ps "was probably restarted"), the wait took that for "not ready yet" and
    never ended: the worker trained no step again, its restart never reached results.json, and
    ``tfps local`` had to end it after the job. Here worker1 waits (no chief yet), ps0's task
    process is SIGKILLed and started again by its supervisor, then the chief starts: worker1
    must wait in a new session, join, and every task exit 0 by itself."""
    from tfps.cluster import local_plan
    plan = local_plan(1, 2)
    # Paced steps (0.05 s): the job lasts long enough for a worker that joins to train in it.
    flags = run_flags(tmp_path / "model", "--model", "tests.fixtures.paced_model:model_fn", steps=100)
    env = base_env(TFPS_TEST_STEP_SECS="0.05")
    task = {t.name: t for t in plan.tasks}
    ps = procs.tfps("ps0", "run", *plan.task_ref(task["ps0"]).to_flags(), *flags, "--restarts", 1)
    ps.wait_for(r"ps0 serving on port", 120)
    worker1 = procs.tfps("worker1", "run", "-v", *plan.task_ref(task["worker1"]).to_flags(), *flags, env=env)
    worker1.wait_for(r"the ps answered; waiting for the chief to initialise the model", 180)
    kill_task(ps)
    poll(lambda: len(ps.lines(r"ps0 serving on port")) >= 2, 120, "ps0 serving again", ps)
    chief = procs.tfps("worker0", "run", *plan.task_ref(task["worker0"]).to_flags(), *flags, env=env)
    assert chief.wait(300) == 0, chief.tail()
    assert worker1.wait(120) == 0, worker1.tail()
    assert ps.wait(60) == 0, ps.tail()
    out = worker1.output()
    assert "a ps was started again while this worker waited for the chief" in out, worker1.tail()
    assert "worker1: first training step done" in out, worker1.tail()   # it joined the job, not only left it
    assert "ps0: worker 1 is done" in ps.output(), ps.tail()
    assert [r["task"] for r in read_results(tmp_path / "model")["restarts"]] == ["ps0"]
    assert_nothing_left([t.port for t in plan.tasks], ps, worker1, chief)


def test_a_stop_to_a_supervised_tasks_group_reaches_the_task_once(procs):
    """``tfps local`` (and ``timeout``, a terminal) signal a ``tfps run --restarts`` supervisor's
    whole process group. The task process shared that group and took each stop twice, directly
    and through its supervisor's forward; a supervisor slow to forward on a loaded machine made
    the copy read as a deliberate second stop (exit 137, no final save). The task now has a
    group of its own: a stop to the supervisor's group reaches it once, and only a real second
    stop after the window ends it at once."""
    proc, _, ports = start_ps(procs, "--restarts", 1, "--final_save_timeout", 60)
    child = poll(lambda: task_child(proc), 30, "the ps's task process", proc)
    assert os.getpgid(child) != os.getpgid(proc.pid)
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait_for(r"received SIGTERM: finishing", 30)
    time.sleep(STOP_WINDOW_SECS + 0.5)
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(30) == 137, proc.tail()
    received = proc.lines(r"received SIGTERM")
    assert len(received) == 2 and "past the 2 s window" in received[1].string, proc.tail()
    assert_nothing_left(ports, proc)


def test_a_supervised_task_dies_with_its_supervisor(procs):
    """Out of its supervisor's group, a SIGKILL of the group no longer reaches the task process:
    it must die with its supervisor all the same (PR_SET_PDEATHSIG)."""
    proc, _, ports = start_ps(procs, "--restarts", 1)
    child = poll(lambda: task_child(proc), 30, "the ps's task process", proc)
    os.kill(proc.pid, signal.SIGKILL)
    poll(lambda: (lambda st: st is None or st[0] == "Z")(_stat(child)), 30, "the task process's end")
    assert_nothing_left(ports, proc)
