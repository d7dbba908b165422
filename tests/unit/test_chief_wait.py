"""A non-chief's wait for the chief (tfps.task.runtime.hooks.wait_for_chief), on a real TensorFlow server.

Issue 51's chaos job: a worker restarted mid-job never trained again. Its wait for the chief
knew neither that the job had ended (it waited past the chief's end, and ``tfps local`` had to
end it) nor told the chief of its restart before it trained (results.json missed the kill).
Here the model is never ready (its variable stays uninitialised): the wait must still publish
the worker's ledger once the ps answers, and end with ``JobOver`` once the job is over.
"""

from __future__ import annotations

import socket
import threading

import pytest


@pytest.fixture
def tf():
    """TensorFlow, its graphs built in ``tf.Graph`` contexts: eager execution stays on for the
    tests after these (disabling it is for the whole process)."""
    import tensorflow as tf
    return tf


def ps_server(tf):
    """A real TensorFlow server that is ``/job:ps/task:0`` (where the stop flag and ledgers live)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return tf.distribute.Server({"ps": [f"127.0.0.1:{port}"]}, job_name="ps", task_index=0, start=True)


def test_a_waiting_worker_publishes_its_ledger_and_leaves_a_job_that_is_over(tf, monkeypatch):
    from tfps import timeouts
    from tfps.task.monitor.board import ledger_variable
    from tfps.task.runtime.donequeue import stop_flag
    from tfps.task.runtime.hooks import JobOver, wait_for_chief
    v1 = tf.compat.v1
    monkeypatch.setattr(timeouts, "GIVE_UP_POLL_SECS", 0.05)
    server = ps_server(tf)
    graph = tf.Graph()
    with graph.as_default():
        v1.get_variable("w", initializer=1.0)            # the chief never initialises it
        ready = v1.report_uninitialized_variables()
        ledger = ledger_variable("worker1")
        publish = ledger.assign('[{"time":1.0,"signal":9}]').op
        flag = stop_flag()
    over = threading.Event()
    answers = []

    def answered():
        answers.append(1)
        if len(answers) == 5:   # the job reaches its end while this worker still waits
            over.set()

    result: list = []

    def wait():
        with v1.Session(server.target, graph=graph) as sess:
            try:
                wait_for_chief(sess, ready, flag=flag, stopped=lambda: False, job_over=over.is_set,
                               answered=answered, publish=publish)
                result.append("returned")
            except JobOver:
                result.append("job over")
            except BaseException as e:  # noqa: BLE001 - the assertion below names it
                result.append(repr(e))

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    thread.join(60)
    assert result == ["job over"], result or "still waiting 60 s after the job was over"
    with v1.Session(server.target, graph=graph) as sess:
        # The chief learns of the restart before the worker ever trained.
        assert sess.run(ledger) == b'[{"time":1.0,"signal":9}]'


def test_a_stop_or_the_chief_giving_up_ends_the_wait(tf, monkeypatch):
    from tfps import timeouts
    from tfps.task.runtime.donequeue import stop_flag
    from tfps.task.runtime.hooks import ChiefWaitEnded, wait_for_chief
    v1 = tf.compat.v1
    monkeypatch.setattr(timeouts, "GIVE_UP_POLL_SECS", 0.05)
    server = ps_server(tf)
    graph = tf.Graph()
    with graph.as_default():
        v1.get_variable("w", initializer=1.0)
        ready = v1.report_uninitialized_variables()
        flag = stop_flag()
        with v1.Session(server.target, graph=graph) as sess:
            with pytest.raises(ChiefWaitEnded) as stopped:
                wait_for_chief(sess, ready, flag=flag, stopped=lambda: True, job_over=lambda: False)
            assert stopped.value.why == "stopped"
            sess.run(flag.assign(True))   # the chief gave up (bad input) before the model was ready
            with pytest.raises(ChiefWaitEnded) as gave_up:
                wait_for_chief(sess, ready, flag=flag, stopped=lambda: False, job_over=lambda: False)
            assert gave_up.value.why == "gave up"
