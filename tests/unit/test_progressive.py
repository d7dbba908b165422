"""Progressive validation (tfps.task.monitor.progressive): each training batch scored before it trains,
over the last N examples, against reference computations in NumPy; and a real worker's step
(an in-process cluster) whose window holds the scores of the weights before its update."""

from __future__ import annotations

import numpy as np
import pytest

from tfps.config import RunConfig
from tfps.models.modelspec import ModelSpec
from tfps.task.monitor import progressive

tf = pytest.importorskip("tensorflow")
v1 = tf.compat.v1


def _auc(score, label) -> float:
    """The exact AUC: the chance that a positive outscores a negative, ties counting half."""
    score, label = np.asarray(score, np.float64), np.asarray(label)
    pos, neg = score[label == 1], score[label == 0]
    wins = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(wins / (len(pos) * len(neg)))


def _log_loss(p, y) -> float:
    p = np.clip(np.asarray(p, np.float64), 1e-7, 1 - 1e-7)
    return float(np.mean(-(y * np.log(p) + (1 - y) * np.log(1 - p))))


class _Feeder:
    """A Window fed batches by hand: the model's predictions and labels as placeholders."""

    def __init__(self, kind: str, size: int, num_workers: int = 1, classes: int = 3):
        self.graph = tf.Graph()
        with self.graph.as_default():
            self.labels = v1.placeholder(tf.int64 if kind != "loss" else tf.float32, [None])
            if kind == "binary":
                self.pred = v1.placeholder(tf.float32, [None])
                spec = ModelSpec(tf.constant(0.0), {"probability": self.pred})
            elif kind == "classes":
                self.pred = v1.placeholder(tf.float32, [None, classes])
                spec = ModelSpec(tf.constant(0.0), {"probabilities": self.pred})
            else:   # a regression: the batch's loss and metric
                self.pred = v1.placeholder(tf.float32, [None])
                err = self.pred - self.labels
                spec = ModelSpec(tf.reduce_mean(tf.square(err)), {"predictions": self.pred},
                                 {"mae": tf.reduce_mean(tf.abs(err))})
            self.window = progressive.Window(size, num_workers, "/cpu:0")
            self.step = self.window.attach(tf.no_op(), spec, self.labels)
            self.summary = self.window.summarize()
            init = v1.local_variables_initializer()
        self.sess = v1.Session(graph=self.graph)
        self.sess.run(init)

    def feed(self, pred, labels) -> None:
        self.sess.run(self.step, {self.pred: pred, self.labels: labels})

    def vector(self) -> np.ndarray:
        return self.sess.run(self.summary)


def test_binary_figures_are_those_of_the_last_n_examples_and_old_ones_drop_out():
    rng = np.random.default_rng(5)
    n, window = 1500, 1000
    y = rng.integers(0, 2, n)
    # The first 500 examples are scored backwards (AUC near 0), the rest well: the window's
    # figures are those of its last 1000 examples only, once the old ones have dropped out.
    score = 1 / (1 + np.exp(-(2 * y - 1) * rng.normal(1.0, 1.5, n)))
    score[:500] = 1 - score[:500]
    f = _Feeder("binary", window)
    seen = 0
    for size in (64, 300, 7, 1, 500, 128, 500):   # batches of every size, one larger than what is left
        f.feed(score[seen:seen + size], y[seen:seen + size])
        seen += size
        got = f.window.figures(f.vector())
        last = slice(max(0, seen - window), seen)
        assert got["examples"] == min(seen, window) and got["window"] == window
        assert got["log_loss"] == pytest.approx(_log_loss(score[last], y[last]), rel=1e-5)
        assert got["accuracy"] == pytest.approx(np.mean((score[last] > 0.5) == y[last]), abs=1e-9)
        if len(set(y[last])) == 2:
            # The bucketed AUC is the exact one of the bucketed scores, and within 2e-3 of the exact one.
            b = progressive.bucket_of(score[last])
            assert got["auc"] == pytest.approx(_auc(b, y[last]), abs=1e-9)
            assert got["auc"] == pytest.approx(_auc(score[last], y[last]), abs=2e-3)
    assert seen == n
    assert _auc(score[:500], y[:500]) < 0.3 and got["auc"] > 0.75   # the backward part has gone


def test_the_jobs_window_sums_each_workers_share():
    rng = np.random.default_rng(7)
    window, workers = 900, 2
    shares = [_Feeder("binary", window, workers) for _ in range(workers)]
    assert shares[0].window.size == 450
    scores, labels = [], []
    for f in shares:
        y = rng.integers(0, 2, 600)
        s = 1 / (1 + np.exp(-(y - 0.5) * rng.normal(2, 2, 600)))
        for i in range(0, 600, 50):
            f.feed(s[i:i + 50], y[i:i + 50])
        scores.append(s[-450:])
        labels.append(y[-450:])
    s, y = np.concatenate(scores), np.concatenate(labels)
    job = shares[0].window.figures([f.vector() for f in shares])
    assert job["examples"] == 900 and job["window"] == 900
    assert job["auc"] == pytest.approx(_auc(progressive.bucket_of(s), y), abs=1e-9)
    assert job["log_loss"] == pytest.approx(_log_loss(s, y), rel=1e-5)
    # One worker's own figures: its share.
    own = shares[1].window.figures(shares[1].vector(), own=True)
    assert own["window"] == own["examples"] == 450
    assert own["log_loss"] == pytest.approx(_log_loss(scores[1], labels[1]), rel=1e-5)


def test_several_classes_give_log_loss_and_accuracy_of_the_window():
    rng = np.random.default_rng(9)
    logits = rng.normal(size=(400, 3))
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    y = rng.integers(0, 3, 400)
    f = _Feeder("classes", 250)
    for i in range(0, 400, 32):
        f.feed(probs[i:i + 32], y[i:i + 32])
    got = f.window.figures(f.vector())
    assert set(got) == {"window", "examples", "log_loss", "accuracy"}
    last = slice(150, 400)
    assert got["log_loss"] == pytest.approx(-np.mean(np.log(probs[last][np.arange(250), y[last]])), rel=1e-5)
    assert got["accuracy"] == pytest.approx(np.mean(probs[last].argmax(axis=1) == y[last]))


def test_another_model_reports_its_own_loss_and_metrics_weighted_by_examples():
    f = _Feeder("loss", 30)
    batches = [(np.full(20, 1.0), np.zeros(20)), (np.full(10, 3.0), np.zeros(10)), (np.full(5, 2.0), np.zeros(5))]
    for pred, labels in batches:
        f.feed(pred, labels)
    got = f.window.figures(f.vector())
    # The last 30 examples: 15 of the first batch (loss 1), 10 of the second (9), 5 of the third (4).
    assert got["examples"] == 30
    assert got["loss"] == pytest.approx((15 * 1 + 10 * 9 + 5 * 4) / 30)
    assert got["metrics"] == {"mae": pytest.approx((15 * 1 + 10 * 3 + 5 * 2) / 30)}
    assert "auc" not in got and "log_loss" not in got


def test_the_figures_read_as_one_line_and_as_results_json_reads_them():
    from tfps.outcome.contract import Progressive, parse, progressive_line
    figs = {"window": 100, "examples": 100, "auc": 0.71234, "log_loss": 0.5, "accuracy": 0.8, "step": 40}
    assert progressive_line(figs) == "progressive auc 0.7123 log_loss 0.5000 accuracy 0.8000 over the last 100 examples"
    assert progressive_line({**figs, "examples": 40}).endswith("over 40 examples (window 100)")
    p = parse(Progressive, figs, "progressive")
    assert (p.window, p.examples, p.auc, p.step) == (100, 100, 0.71234, 40)
    assert progressive_line(p) == progressive_line(figs)
    assert progressive_line(None) == progressive_line({"window": 100, "examples": 0}) == ""


def test_a_window_of_0_is_off_and_a_bad_one_is_refused():
    from tfps.errors import ConfigError
    assert not progressive.Window(0, 2, "/cpu:0").on
    for bad in (-1, 1.5, True, 10**9):
        with pytest.raises(ConfigError, match="progressive_window"):
            RunConfig(progressive_window=bad).validate()


def test_a_workers_step_scores_its_batch_with_the_weights_before_its_update(tmp_path):
    """The real training step of a worker (1 ps, 1 worker, in process): every example is the
    same row, and plain SGD with a large learning rate moves the weights far each step. After
    one step the window holds exactly the loss that step computed (with the weights before its
    update); after the second, the mean of both steps' losses, which differ: a window scored
    after each update would hold the second loss after the first step."""
    from tfps.cluster.single_host import free_ports
    from tfps.cluster.spec import ClusterSpec, TaskRef
    from tfps.task.runtime.signals import StopSignal
    from tfps.task.setup import JobSetup
    from tfps.task.worker import Worker
    data = tmp_path / "same.csv"
    data.write_text("a,b,label\n" + "0.5,-1.0,1\n" * 64)   # one row, of class 1 of 2
    ports = free_ports(2, "127.0.0.1")
    cluster = ClusterSpec((f"127.0.0.1:{ports[0]}",), (f"127.0.0.1:{ports[1]}",))
    servers = [tf.distribute.Server(tf.train.ClusterSpec({"ps": list(cluster.ps), "worker": list(cluster.worker)}),
                                    job_name=job, task_index=0) for job in ("ps", "worker")]
    cfg = RunConfig(model="linear", train_data=str(data), num_classes=2, batch_size=16, optimizer="sgd",
                    learning_rate=3.0, model_dir=str(tmp_path / "m"), progressive_window=1000).validate()
    worker = Worker(TaskRef(cluster, "worker", 0), cfg, StopSignal())
    graph, ops = worker.build(JobSetup(cfg))
    window = ops.progressive
    assert window is not None and window.kind == "binary"
    assert {v.device for v in (window.ring, window.total)} == {"/job:worker/task:0/device:CPU:0"}
    with graph.as_default():
        init = [v1.global_variables_initializer(), v1.local_variables_initializer()]
    with v1.Session(servers[1].target, graph=graph) as s:
        s.run(init)
        losses = []
        for _ in range(2):
            before = s.run(window.summary)[0]
            _, loss = s.run([ops.train_op, ops.loss])
            figs = window.figures(s.run(window.summary), own=True)
            assert figs["examples"] == before + 16
            losses.append((loss, figs))
        (first, after_one), (second, after_two) = losses
        assert abs(first - second) > 0.1, (first, second)    # the update moved the weights far
        assert after_one["log_loss"] == pytest.approx(first, abs=1e-4)
        assert after_two["log_loss"] == pytest.approx((first + second) / 2, abs=1e-4)
        # K steps in one run (tfps.task.graph.steps): each of them adds its batch to the window.
        s.run(ops.train_op, {ops.steps_per_run: 3})
        assert window.figures(s.run(window.summary), own=True)["examples"] == 16 * 5


def test_the_status_line_the_messages_and_the_summary_show_the_jobs_window():
    from tfps.launch.console import status_text
    from tfps.notify.message import format_message
    from tfps.outcome.contract import JobResult
    figs = {"window": 1000, "examples": 1000, "step": 70, "auc": 0.7312, "log_loss": 0.4411, "accuracy": 0.8}
    line = status_text({"time": 10.0, "phase": "training", "step": 70, "train_steps": 100, "loss": 0.5,
                        "progressive": figs}, now=10.0, started=0.0)
    assert "prog. auc 0.7312 log_loss 0.4411 accuracy 0.8000" in line
    _, body = format_message("progress", {"job": "j", "status": "running", "global_step": 70, "train_steps": 100,
                                          "progressive": figs})
    assert "progressive  auc 0.7312 log_loss 0.4411 accuracy 0.8000 over the last 1000 examples" in body
    result = JobResult.from_dict({"job": "j", "status": "succeeded", "global_step": 100, "train_steps": 100,
                                  "progressive": figs})
    assert result.progressive.auc == 0.7312 and result.to_dict()["progressive"]["window"] == 1000
    assert "  progressive auc 0.7312 log_loss 0.4411 accuracy 0.8000 over the last 1000 examples" in \
        result.summary_lines()
    _, end = format_message("succeeded", result)
    assert "auc 0.7312" in end
