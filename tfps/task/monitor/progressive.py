"""Progressive validation: each training batch scored before it trains, over the last N examples.

Online learning has read a model's quality this way since McMahan et al. 2013: an example is
scored by the model as it is just before the example trains it, so every score is one on
data the model has not seen, and a job that follows a stream (no fixed evaluation set) is
still measured. In a parameter-server step the forward pass already reads the variables
before the step's own update: the step's predictions are those scores, and nothing runs a
second forward pass.

How the window is kept (``--progressive_window N``, the job's last N examples):

* Each worker keeps its own share, its last ceil(N / workers) examples, in a ring of its
  own variables (``modelspec.local_state``: on the worker, never on a ps, in the checkpoint
  or the SavedModel). Each training step writes its batch's per-example values into the
  ring (``Window.attach``, grouped with the step's update, inside the loop of K steps per
  run): no transfer, no ps.
* About once a second (with its board, tfps.task.monitor.board) each worker sends a summary of
  its ring to ps 0: the example count, the sums of the per-example values, and for binary
  labels two histograms (positives, negatives) of the scores over ``BUCKETS`` buckets of
  their logit. A vector of a few thousand numbers, whatever N.
* The chief's watch (tfps.task.monitor.watch) sums the workers' summaries: the job's window, read
  every few seconds. AUC is the Mann-Whitney statistic of the bucketed scores (ties within
  a bucket count half: within about 1e-3 of the exact AUC); the log loss and accuracy are
  exact means. A worker that left keeps its last window in the sum until it comes back.

What it costs (docs/how-to/results.md): a few small ops per step on the worker; the CTR
model wide_deep trained as many examples per CPU-second with it as without, the demo MLP
(tiny steps) 0.85x.

What is scored: a binary classifier (a ``probability`` prediction, or ``probabilities`` of
two classes: every built-in model, Keras model and model_fn that gives one) reports
``auc``, ``log_loss`` and ``accuracy``; a classifier of more classes (``probabilities``)
``log_loss`` and ``accuracy``; any other model (regression) its own loss and per-batch
metrics, each batch's value counted once per example of the batch.

This module imports TensorFlow only inside the functions that build graph parts; the
arithmetic on summaries (``figures``) is NumPy, for the chief's watch and the tests.
"""

from __future__ import annotations

import os

import numpy as np

from tfps.models import modelspec
from tfps.outcome.contract import progressive_line

#: Buckets of the binary scores' histograms, over logits in [-LOGIT_RANGE, LOGIT_RANGE]
#: (probabilities from about 6e-6 to 1 - 6e-6; the rest fall into the end buckets).
BUCKETS = 1024
LOGIT_RANGE = 12.0
#: Probabilities are clipped to [EPSILON, 1 - EPSILON] for the log loss (Keras's epsilon).
EPSILON = 1e-7
#: The TensorBoard run of the job's figures, under model_dir.
RUN = "progressive"
#: The figures that are fields of results.json's ``progressive`` block; others go to its ``metrics``.
NAMED = ("auc", "log_loss", "accuracy", "loss")


class Window:
    """One worker's window of progressive scores: built into its training step, read by its hooks.

    ``window``: the job's N (0: off); ``num_workers`` share it; ``device``: the worker's CPU,
    where the ring lives. After ``attach``: ``kind`` ("binary", "classes" or "loss"),
    ``names`` (the means the summary holds, in order) and ``summary`` (its float64 vector,
    built by ``summarize``)."""

    def __init__(self, window: int, num_workers: int, device: str):
        self.window, self.device = int(window or 0), device
        self.size = -(-self.window // max(int(num_workers), 1)) if self.window else 0
        self.kind: str | None = None
        self.names: tuple[str, ...] = ()
        self.ring = self.total = self.summary = None

    @property
    def on(self) -> bool:
        return self.size > 0

    def attach(self, train, spec, labels, batch_size: int | None = None):
        """``train`` grouped with the update of the window by this step's batch: the per-example
        values of the step's own predictions (its forward pass, before its update). As few ops
        as a step can take (the ring holds what the summary derives the figures from);
        ``batch_size``, the most a batch holds, when known: none larger than the ring (the
        usual case) needs no op to keep only its last rows."""
        if not self.on or labels is None:
            return train
        import tensorflow as tf
        v1 = tf.compat.v1
        with v1.device(self.device):
            kind, names, columns = _columns(spec, labels)
            if self.ring is None:
                self.kind, self.names = kind, names
                with modelspec.on_worker(self.device), modelspec.local_state():
                    self.ring = v1.Variable(lambda: tf.zeros([self.size, len(columns)]), trainable=False,
                                            name="progressive/window")
                    self.total = v1.Variable(lambda: tf.zeros([], tf.int64), trainable=False,
                                             name="progressive/examples")
            values = tf.stack(columns, axis=1)
            batch = tf.shape(values, out_type=tf.int64)[0]
            if batch_size is None or batch_size > self.size:   # a batch larger than the ring: its last rows
                keep = tf.minimum(batch, self.size)
                values, batch = values[batch - keep:], keep
            at = (self.total.read_value() + tf.range(batch, dtype=tf.int64)) % self.size
            written = v1.scatter_update(self.ring, at, values)
            with tf.control_dependencies([written]):
                counted = self.total.assign_add(batch)
        return tf.group(train, counted)

    def summarize(self):
        """The summary vector of the ring (built once, outside the step's loop), float64:
        [examples, the sum of each of ``names``, (binary) positives per bucket, negatives per bucket]."""
        if self.ring is None:
            return None
        if self.summary is not None:
            return self.summary
        import tensorflow as tf
        with tf.compat.v1.device(self.device):
            n = tf.minimum(self.total.read_value(), self.size)
            rows = tf.cast(self.ring.read_value()[:n], tf.float64)
            parts = [tf.reshape(tf.cast(n, tf.float64), [1]), tf.reduce_sum(_per_example(self.kind, rows), axis=0)]
            if self.kind == "binary":
                bucket = _bucket(rows[:, 0])
                label = rows[:, 1]
                parts += [tf.math.unsorted_segment_sum(label, bucket, BUCKETS),
                          tf.math.unsorted_segment_sum(1.0 - label, bucket, BUCKETS)]
            self.summary = tf.concat(parts, 0, name="progressive_summary")
        return self.summary

    def figures(self, vectors, own: bool = False) -> dict | None:
        """The figures of one summary or the sum of several (the job's), as ``figures`` gives them;
        ``own``: of this worker's summary alone, whose window is its share."""
        return figures(vectors, self.kind, self.names, self.size if own else self.window)


def _columns(spec, labels) -> tuple[str, tuple[str, ...], list]:
    """(kind, the names of the figures' means, the float32 columns a step writes into the ring)
    of a model's training step: binary, the score and the label; more classes, the probability
    of the example's own class and whether the top class is it; any other model, its loss and
    per-batch metrics, each counted once per example of its batch."""
    import tensorflow as tf
    preds = spec.predictions or {}
    p, probs = preds.get("probability"), preds.get("probabilities")
    if p is None and probs is not None and probs.shape.rank == 2 and probs.shape[-1] == 2:
        p = probs[:, 1]
    if p is not None:
        return "binary", ("log_loss", "accuracy"), [tf.cast(tf.reshape(p, [-1]), tf.float32),
                                                    tf.cast(tf.reshape(labels, [-1]), tf.float32)]
    if probs is not None and probs.shape.rank == 2 and labels.dtype.is_integer:
        y = tf.cast(tf.reshape(labels, [-1]), tf.int64)
        own = tf.cast(tf.gather(probs, y, batch_dims=1), tf.float32)
        right = tf.cast(tf.equal(tf.argmax(probs, axis=-1), y), tf.float32)
        return "classes", ("log_loss", "accuracy"), [own, right]
    batch = tf.shape(labels)[:1]
    own = [(k, t) for k, t in sorted(spec.metrics.items())
           if k not in spec.streaming and k != "loss" and t.shape.rank == 0]
    return "loss", ("loss", *(k for k, _ in own)), [tf.fill(batch, tf.cast(t, tf.float32))
                                                    for t in [spec.loss] + [t for _, t in own]]


def _per_example(kind: str, rows):
    """The values whose means are the figures (``names``), per row of the ring (float64)."""
    import tensorflow as tf
    if kind == "binary":
        p = tf.clip_by_value(rows[:, 0], EPSILON, 1.0 - EPSILON)
        y = rows[:, 1]
        log_loss = -(y * tf.math.log(p) + (1.0 - y) * tf.math.log(1.0 - p))
        right = tf.cast(tf.equal(tf.cast(rows[:, 0] > 0.5, tf.float64), y), tf.float64)
        return tf.stack([log_loss, right], axis=1)
    if kind == "classes":
        return tf.stack([-tf.math.log(tf.clip_by_value(rows[:, 0], EPSILON, 1.0)), rows[:, 1]], axis=1)
    return rows


def _bucket(score):
    """The histogram bucket of each probability: by its logit, ``BUCKETS`` equal buckets."""
    import tensorflow as tf
    p = tf.clip_by_value(score, EPSILON, 1.0 - EPSILON)
    logit = tf.math.log(p) - tf.math.log1p(-p)
    at = tf.floor((logit + LOGIT_RANGE) / (2 * LOGIT_RANGE) * BUCKETS)
    return tf.cast(tf.clip_by_value(at, 0, BUCKETS - 1), tf.int32)


def bucket_of(score) -> np.ndarray:
    """``_bucket`` in NumPy (the tests' reference)."""
    p = np.clip(np.asarray(score, np.float64), EPSILON, 1 - EPSILON)
    at = np.floor((np.log(p) - np.log1p(-p) + LOGIT_RANGE) / (2 * LOGIT_RANGE) * BUCKETS)
    return np.clip(at, 0, BUCKETS - 1).astype(int)


def auc_of(positives, negatives) -> float | None:
    """The area under the ROC curve of two score histograms (same buckets, low to high): the
    chance that a positive outscores a negative, a tie within a bucket counting half. None
    without both classes."""
    pos, neg = np.asarray(positives, np.float64), np.asarray(negatives, np.float64)
    pairs = pos.sum() * neg.sum()
    if pairs <= 0:
        return None
    below = np.cumsum(neg) - neg
    return float(np.sum(pos * (below + 0.5 * neg)) / pairs)


def figures(vectors, kind: str | None, names, window: int) -> dict | None:
    """The figures of a window from one summary vector or several (summed: the job's):
    ``{"window", "examples", "auc" (binary), "log_loss", "accuracy" | "loss", "metrics"}``.
    None when there is nothing to read (no vector, no kind)."""
    if kind is None:
        return None
    if isinstance(vectors, np.ndarray) and vectors.ndim == 1:
        vectors = [vectors]
    vectors = [np.asarray(v, np.float64) for v in vectors if v is not None]
    if not vectors:
        return None
    total = np.sum(vectors, axis=0)
    count = float(total[0])
    out: dict = {"window": int(window), "examples": int(round(count))}
    if count <= 0:
        return out
    means = {name: float(total[1 + i] / count) for i, name in enumerate(names)}
    if kind == "binary":
        start = 1 + len(names)
        auc = auc_of(total[start:start + BUCKETS], total[start + BUCKETS:start + 2 * BUCKETS])
        if auc is not None:
            out["auc"] = auc
    own = {k: v for k, v in means.items() if k not in NAMED}
    out.update({k: v for k, v in means.items() if k in NAMED})
    if own:
        out["metrics"] = own
    return out


def flat(figs: dict | None) -> dict[str, float]:
    """The figures' numbers by name (auc, log_loss, ..., the model's own metrics), for a line or a chart."""
    if not figs:
        return {}
    return {**{k: figs[k] for k in NAMED if figs.get(k) is not None}, **(figs.get("metrics") or {})}


def line(figs: dict | None) -> str:
    """``progressive auc 0.7123 log_loss 0.4512 accuracy 0.8100 over the last 50000 examples``; "" before any."""
    return progressive_line(figs)


class SummaryRun:
    """The job's figures as TensorBoard's ``progressive`` run of model_dir (the chief's watch
    writes them, at the global step they were read at), under the training run's tag names."""

    def __init__(self, model_dir: str):
        self.path = os.path.join(model_dir, RUN)
        self.writer = None

    def write(self, step: int, figs: dict | None) -> None:
        numbers = flat(figs)
        if not numbers:
            return
        import tensorflow as tf
        v1 = tf.compat.v1
        if self.writer is None:
            with tf.Graph().as_default():   # FileWriter is the graph-mode writer
                self.writer = v1.summary.FileWriter(self.path)
        self.writer.add_summary(v1.Summary(value=[v1.Summary.Value(tag=k, simple_value=float(v))
                                                  for k, v in sorted(numbers.items())]), int(step))
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
