"""A sync step that waits past --sync_timeout names the workers it waited for (issue 51): the
workers whose boards stand below the job's step did not send their gradients; when every
board stands at the same step, each worker is named with when its steps last moved."""

from __future__ import annotations

import time

import pytest

from tfps.task.monitor.watch import _WatchedWorker, is_step_timeout, sync_wait_line


def _worker(name: str, global_step: int, idle: float, now: float) -> _WatchedWorker:
    w = _WatchedWorker(name)
    w.started, w.global_step, w.changed_at = 1.0, global_step, now - idle
    return w


def test_the_worker_whose_board_stands_behind_is_named():
    now = time.monotonic()
    workers = [_worker("worker0", 57, 300, now), _worker("worker1", 57, 300, now), _worker("worker2", 56, 301, now)]
    assert sync_wait_line(workers, now) == ("the gradients of worker2 (its last step at global step 56, 301 s ago) "
                                            "did not arrive")


def test_when_every_board_stands_at_one_step_each_worker_is_named_with_when_it_was_last_seen():
    now = time.monotonic()
    workers = [_worker("worker0", 57, 300, now), _worker("worker1", 57, 305, now), _WatchedWorker("worker2")]
    assert sync_wait_line(workers, now) == ("last seen: worker1 at global step 57, 305 s ago, "
                                            "worker0 at global step 57, 300 s ago")


def test_a_step_past_its_operation_timeout_is_a_sync_timeout():
    tf = pytest.importorskip("tensorflow")
    v1 = tf.compat.v1
    with tf.Graph().as_default():
        queue = v1.FIFOQueue(1, tf.int32, shapes=[[]])
        with v1.Session(config=v1.ConfigProto(operation_timeout_in_ms=200)) as sess, \
                pytest.raises(tf.errors.OpError) as e:
            sess.run(queue.dequeue())   # nobody enqueues: a sync step whose token never comes
    assert is_step_timeout(e.value)
    try:
        raise RuntimeError("wrapped") from e.value
    except RuntimeError as wrapped:
        assert is_step_timeout(wrapped)
    assert not is_step_timeout(RuntimeError("Timed out"))


def test_the_chiefs_report_of_a_sync_timeout_names_the_worker_behind():
    """The line results.json, the summary and the message carry (``JobWatch.sync_timeout``),
    with TensorFlow's own error kept as its cause."""
    import types

    from tfps.cluster.spec import ClusterSpec, TaskRef
    from tfps.config import RunConfig
    from tfps.outcome.report import format_error
    from tfps.task.monitor.watch import JobWatch
    cfg = RunConfig(sync_replicas=True, sync_timeout=300).validate()
    task = TaskRef(ClusterSpec(("127.0.0.1:1",), ("127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4")), "worker", 0)
    watch = JobWatch(types.SimpleNamespace(cfg=cfg, task=task), None, None, None, None, None)
    now = time.monotonic()
    for w, step in zip(watch.workers, (57, 57, 56)):
        w.started, w.global_step, w.changed_at = 1.0, step, now - 300
    cause = RuntimeError("Timed out waiting for notification")
    info = format_error(watch.sync_timeout(cause, 57, cfg.sync_timeout))
    assert info.message.startswith("no sync step ended within --sync_timeout (300 s) at global step 57: the "
                                   "gradients of worker2 (its last step at global step 56, 300 s ago) did not "
                                   "arrive. "), info.message
    assert "Timed out waiting for notification" in info.traceback_tail
