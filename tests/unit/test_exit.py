"""A task's end with a helper thread still inside TensorFlow (tfps.task.runtime.signals.left_in_tensorflow).

A non-chief's watch for the job's end calls TensorFlow from a daemon thread. If such a
call returns while the interpreter shuts down, the interpreter ends the thread from
inside TensorFlow's C++ frames, and the process aborts (exit -6) after a job that
succeeded. So the task waits a moment for the thread; a thread still in TensorFlow then
makes the process end without the interpreter's shutdown (tfps.task.entry).
"""

from __future__ import annotations

import threading
import time

import pytest

from tfps.task.runtime import signals


@pytest.fixture
def fresh_abandon_flag(monkeypatch):
    monkeypatch.setattr(signals, "_abandoned_rpc", False)


def blocked_in_tensorflow(timeout_ms: int) -> tuple[threading.Thread, list, object]:
    """A daemon thread in a real TensorFlow call: a dequeue from an empty queue, bounded;
    and the call that lets it out (an enqueue)."""
    tf = pytest.importorskip("tensorflow")
    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        queue = tf.queue.FIFOQueue(1, tf.int32)
        dequeue, enqueue = queue.dequeue(), queue.enqueue(1)
    session = v1.Session(graph=graph)
    outcome: list = []

    def call():
        try:
            outcome.append(int(session.run(dequeue, options=v1.RunOptions(timeout_in_ms=timeout_ms))))
        except tf.errors.DeadlineExceededError:
            outcome.append("deadline")

    thread = threading.Thread(target=call, name="tfps-job-end", daemon=True)
    thread.start()
    return thread, outcome, lambda: session.run(enqueue)


def test_a_thread_still_in_tensorflow_is_abandoned_and_the_process_ends_without_shutdown(fresh_abandon_flag):
    thread, outcome, release = blocked_in_tensorflow(60_000)
    t0 = time.monotonic()
    assert signals.left_in_tensorflow(thread, 0.5) is True
    assert 0.4 < time.monotonic() - t0 < 5
    assert thread.is_alive() and not outcome
    assert signals.rpc_abandoned()   # tfps.task.entry then ends the process with os._exit
    release()   # not left for this test process's own shutdown
    thread.join(30)
    assert outcome == [1]


def test_a_thread_that_leaves_tensorflow_in_time_is_waited_for(fresh_abandon_flag):
    thread, outcome, _ = blocked_in_tensorflow(200)
    assert signals.left_in_tensorflow(thread, 30) is False
    assert not thread.is_alive() and outcome == ["deadline"]
    assert not signals.rpc_abandoned()
