"""A restarted chief whose probe of the ps gets no answer in time asks again, and joins.

Issue 51: "a chief restart rolled the ps back": one chief SIGKILL was recorded as
``how: restored`` thousands of steps back while the ps still held the variables. The chief
asks the ps whether they hold every variable (tfps.task.runtime.rejoin); a probe that got no answer
within its timeout (a ps slow on an overloaded host) used to send it down the checkpoint path,
restoring the checkpoint over the live variables. Here a real in-process TensorFlow server
plays the ps, the live variables are ahead of the newest checkpoint, and the first probe is
made slower than its timeout: the chief must ask again and join the live variables.
"""

from __future__ import annotations

import time

import pytest


@pytest.fixture
def tf():
    # A graph of its own (as a task builds one), never eager execution turned off for the
    # whole process: the tests after this one load SavedModels eagerly.
    import tensorflow as tf
    with tf.Graph().as_default():
        yield tf


def test_a_probe_without_an_answer_is_asked_again_and_the_chief_joins_the_live_variables(tf, tmp_path, monkeypatch):
    from tfps import timeouts
    from tfps.task.runtime.rejoin import LiveJoiningChiefSessionCreator
    v1 = tf.compat.v1
    monkeypatch.setattr(timeouts, "REJOIN_PROBE_TIMEOUT_MS", 500)
    monkeypatch.setattr(timeouts, "GIVE_UP_POLL_SECS", 0.05)
    server = tf.distribute.Server.create_local_server()
    slow = {"probes": 0}

    def answer(names):
        slow["probes"] += 1
        if slow["probes"] == 1:
            time.sleep(3)   # the ps, overloaded: no answer within the probe's 0.5 s
        return names

    graph = tf.Graph()
    with graph.as_default():
        step = v1.train.get_or_create_global_step()
        w = v1.get_variable("w", initializer=1.0)
        probe = v1.numpy_function(answer, [v1.report_uninitialized_variables()], tf.string)
        scaffold = v1.train.Scaffold(ready_for_local_init_op=probe, saver=v1.train.Saver())
        # The newest checkpoint: step 10, w = 1. The live variables on the "ps": step 42, w = 5.
        with v1.Session(server.target) as s:
            s.run(v1.global_variables_initializer())
            s.run(step.assign(10))
            scaffold.saver.save(s, str(tmp_path / "model.ckpt"), global_step=10)
            s.run([step.assign(42), w.assign(5.0)])
        sessions = []
        creator = LiveJoiningChiefSessionCreator(
            scaffold=scaffold, master=server.target, checkpoint_dir=str(tmp_path), global_step=step,
            on_session=lambda how, at, lost: sessions.append((how, at, lost)))
        session = creator.create_session()
        assert sessions == [("joined", 42, [])], sessions
        assert session.run([step, w]) == [42, 5.0]   # nothing rolled back
        assert slow["probes"] >= 2
