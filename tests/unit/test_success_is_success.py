"""A success is a success (issue 35), in-process: the error line of a TensorFlow run-time
error, one report per job, the highest step, the row of a non-finite value, and a model
that fails to build refused before start."""

from __future__ import annotations

import types

import pytest

from tfps.outcome.report import error_line, format_error

TF_MESSAGE = ("Graph execution error:\n\nDetected at node 'DecodeCSV' defined at (most recent call last):\n"
              "    File \"/x/worker.py\", line 6, in <module>\nNode: 'DecodeCSV'\n"
              "Field 1 in record 0 is not a valid float: abc\n\t [[{{node DecodeCSV}}]]\n\n"
              "Original stack trace for 'DecodeCSV':\n  File \"/x/worker.py\", line 6")


class FakeOpError(Exception):
    def __init__(self, message, node_def=None):
        super().__init__(message)
        self.message, self.node_def = message, node_def


def test_a_run_time_tensorflow_error_is_its_first_meaningful_line_with_the_op_and_its_input():
    node = types.SimpleNamespace(name="DecodeCSV", op="DecodeCSV", input=["batch_lines", "^ctrl"])
    line = error_line(FakeOpError(TF_MESSAGE, node))
    assert line == "Field 1 in record 0 is not a valid float: abc (op 'DecodeCSV', input 'batch_lines')"
    info = format_error(FakeOpError(TF_MESSAGE))
    assert info.message == "Field 1 in record 0 is not a valid float: abc (op 'DecodeCSV')"
    assert "Graph execution error" not in info.message
    several = ("Graph execution error:\n\nDetected at node 'x/CheckNumerics' defined at:\n  File \"a\"\n"
               "2 root error(s) found.\n  (0) INVALID_ARGUMENT: data holds a NaN\n\t [[{{node x/CheckNumerics}}]]")
    assert error_line(FakeOpError(several)) == "data holds a NaN (op 'x/CheckNumerics')"
    assert error_line(RuntimeError("first\nsecond")) == "first"


def _chief(tmp_path, step=0, watched_step=0):
    from tfps.task.chief import Chief
    chief = Chief.__new__(Chief)
    chief._report_guard, chief.reported = __import__("threading").Lock(), False
    chief.last_seen_step = step
    chief.watch = types.SimpleNamespace(job_step=watched_step, summary=lambda: {"workers": {}, "stalls": [],
                                                                                "resumed": []})
    return chief


def test_the_job_is_reported_once_whoever_sees_its_end(tmp_path, monkeypatch):
    chief = _chief(tmp_path)
    assert chief.claim_report() is True
    # The watchdog comes second: nothing is written or sent, and it says so.
    assert chief.report_untrained_failure(RuntimeError("late"), 1, write_results=True) is False


def test_the_watchdog_leaves_a_job_reported_by_the_training_loop_alone(monkeypatch):
    from tfps.task.runtime import watchdog
    job = types.SimpleNamespace(
        task=types.SimpleNamespace(name="worker0", is_chief=True),
        cfg=types.SimpleNamespace(sync_timeout=1.0, startup_timeout=1.0), last_seen_step=131, claimed=True,
        report_untrained_failure=lambda *a, **k: False)
    monkeypatch.setattr(watchdog, "probe_tasks", lambda task: [("worker1", "127.0.0.1:1", "is unresponsive: x")])
    exits = []
    monkeypatch.setattr(watchdog.os, "_exit", exits.append)
    if hasattr(watchdog, "real_os_exit"):
        monkeypatch.setattr(watchdog, "real_os_exit", exits.append)
    monkeypatch.setattr(watchdog.logging, "shutdown", lambda: None)   # pytest's own handlers stay open
    dog = watchdog.StartupWatchdog(job)
    dog.training, dog.deadline = True, 0.0
    dog._watch()
    assert exits == []
    # Reported by the watchdog itself: the process ends.
    job.report_untrained_failure = lambda *a, **k: True
    dog._watch()
    assert exits == [1]


def test_the_report_keeps_the_highest_step_seen(tmp_path):
    chief = _chief(tmp_path, step=120, watched_step=205)
    assert chief.highest_step(2) == 205   # a lost ps took the job back to its checkpoint of step 2
    chief.watch = None
    assert chief.highest_step(2, 130) == 130


def test_the_row_and_column_of_a_non_finite_value_in_a_workers_shard(tmp_path, monkeypatch):
    from tfps.data import dataset as data_mod
    from tfps.task.runtime import datafault
    monkeypatch.setattr(data_mod, "CSV_SCAN_ROWS", 2)
    f = tmp_path / "train.csv"
    f.write_text("a,name,b,label\n1,x,2,0\n1,inf,2,1\n3,y,4,0\n5,z,nan,1\n6,w,inf,0\n")
    schema = types.SimpleNamespace(fmt="csv", files=[str(f)], string_columns=("name",))
    # One file, two workers: data row k is worker k % 2's; "inf" in the string column is text.
    assert datafault.locate_nonfinite(schema, 2, 1) == (
        f"{f}:5 has a non-finite value (nan) in column 'b'; fix or remove that row (it lies past the first "
        "2 rows checked before start)")
    assert datafault.locate_nonfinite(schema, 2, 0).startswith(f"{f}:6 has a non-finite value (inf) in column 'b'")
    assert datafault.locate_nonfinite(types.SimpleNamespace(fmt="npz", files=[]), 1, 0) is None
    err = FakeOpError("Graph execution error:\nNode: 'x'\nthe training data holds a non-finite value (NaN or "
                      "infinity) beyond the rows checked before start")
    assert datafault.is_nonfinite_data_error(err) and not datafault.is_nonfinite_data_error(RuntimeError("x"))


def test_a_refusal_of_the_estimate_survives_the_trip_between_processes():
    from tfps.launch import estimate
    answer = estimate._answer(estimate.ModelRefused("model: m raised X"))
    back = estimate._from_answer(answer)
    assert isinstance(back, estimate.ModelRefused) and back == "model: m raised X"
    assert not isinstance(estimate._from_answer(estimate._answer("TensorFlow is not installed here")),
                          estimate.ModelRefused)


@pytest.mark.parametrize("name,words", [
    ("raises", "this model_fn refuses to build"),
    ("lambda_metric", "'<lambda>' is not a valid scope name"),
    ("steps_per_execution", "steps_per_execution"),
    ("returns_none", "returns_none returned None (no return statement?) in train mode; a model_fn must return "
                     "tfps.models.ModelSpec(loss, predictions, metrics)"),
])
def test_a_model_that_raises_while_its_graph_is_built_is_refused_not_advice(tmp_path, name, words):
    pytest.importorskip("tensorflow")
    from tfps.config import RunConfig
    from tfps.launch import estimate
    cfg = RunConfig(model=f"tests.fixtures.estimate_refusals:{name}", model_dir=str(tmp_path)).validate()
    reason = estimate.try_estimate(cfg, 1, 2)
    assert isinstance(reason, estimate.ModelRefused) and words in reason, reason
    assert reason.startswith("model: ")


def test_a_failure_inside_tfps_or_tensorflow_is_no_refusal():
    from tfps.launch import estimate
    try:
        import json
        json.loads("{")
    except ValueError as e:
        assert estimate._raised_in_user_code(e) is True   # this test's own frame is "user" code
        e.__traceback__ = e.__traceback__.tb_next        # from json on: the standard library only
        assert estimate._raised_in_user_code(e) is False


def test_an_out_of_range_gather_on_a_ps_is_its_cause_not_the_task_that_relayed_it():
    """A real ps + worker in this process: an out-of-range ``tf.gather`` of a variable on the ps.
    TensorFlow's message holds "INVALID_ARGUMENT: From /job:worker/...:" and "From /job:ps/...:"
    on lines of their own (results.json once said "From /job:ps/replica:0/task:0:")."""
    tf = pytest.importorskip("tensorflow")
    from tfps.cluster.single_host import free_ports
    v1 = tf.compat.v1
    ports = free_ports(2, "127.0.0.1")
    cluster = tf.train.ClusterSpec({"ps": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"]})
    servers = [tf.distribute.Server(cluster, job_name=job, task_index=0) for job in ("ps", "worker")]
    with tf.Graph().as_default():
        with tf.device("/job:ps/task:0"):
            table = v1.get_variable("table", [10, 2])
            rows = tf.gather(table, tf.constant([0, 1, 2, 99]))
        with tf.device("/job:worker/task:0"):
            total = tf.reduce_sum(rows)
        with v1.Session(servers[1].target) as sess:
            sess.run(v1.global_variables_initializer())
            with pytest.raises(tf.errors.InvalidArgumentError) as e:
                sess.run(total)
    line = format_error(e.value).message
    assert line.startswith("indices[3] = 99 is not in [0, 10) (op 'Gather' of type ResourceGather"), line
    assert line.endswith(", on ps0)"), line


@pytest.mark.parametrize("message", [
    "From /job:ps/replica:0/task:0:\nindices[3] = 99 is not in [0, 10)\n\t [[{{node embedding_lookup}}]]",
    "2 root error(s) found.\n  (0) INVALID_ARGUMENT: From /job:ps/replica:0/task:0:\nindices[3] = 99 is not in "
    "[0, 10)\n\t [[{{node embedding_lookup}}]]\n  (1) CANCELLED: Step was cancelled\n0 successful operations.",
])
def test_a_tensorflow_message_that_begins_with_the_task_is_its_cause(message):
    assert error_line(FakeOpError(message)) == "indices[3] = 99 is not in [0, 10) (op 'embedding_lookup', on ps0)"


def test_a_message_of_ours_in_capitals_is_left_as_it_is():
    assert error_line(RuntimeError("NOTE: the ps is gone\nmore")) == "NOTE: the ps is gone"
