"""Score a stream's files with a SavedModel that never updates: side (b) of the stream bench.

    .venv/bin/python bench/stream_score.py EXPORT_DIR WINDOW START FILE...
    .venv/bin/python bench/stream_score.py --events MODEL_DIR/progressive


The model is tfps's export (the TF1 SavedModel whose ``serving_default`` takes the raw
columns by name). The files are read in the order given, as the stream's rows; every row
is scored. Prints one JSON object: ``points``, the AUC of the last WINDOW rows at the end
of each file (``[rows, auc]``, rows counted from START, the stream position of the first
file's first row), and ``last``, the AUC of the last WINDOW rows. The AUC is exact
(Mann-Whitney, ties counted half).
"""

from __future__ import annotations

import csv
import glob
import json
import os
import sys

import numpy as np


def auc(scores: np.ndarray, labels: np.ndarray) -> float | None:
    """Exact ROC AUC: the Mann-Whitney statistic with average ranks for ties."""
    pos = labels > 0.5
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if not n_pos or not n_neg:
        return None
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    # average ranks over ties
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    avg = first + (counts + 1) / 2.0
    ranks[order] = np.repeat(avg, counts)
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def events(run_dir: str) -> list[list[float]]:
    """``[step, auc]`` of a job's progressive TensorBoard run (tfps.task.progressive), by step."""
    import tensorflow as tf
    points = {}
    for path in sorted(glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))):
        for ev in tf.compat.v1.train.summary_iterator(path):
            for v in ev.summary.value:
                if v.tag == "auc":
                    points[int(ev.step)] = float(v.simple_value)
    return [[s, a] for s, a in sorted(points.items())]


def main(argv: list[str]) -> int:
    if argv[:1] == ["--events"]:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        print(json.dumps({"points": events(argv[1])}))
        return 0
    export, window, start, files = argv[0], int(argv[1]), int(argv[2]), argv[3:]
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    v1 = tf.compat.v1
    v1.disable_eager_execution()
    cfg = v1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)
    scores, labels, points = [], [], []
    rows = start
    with v1.Session(graph=tf.Graph(), config=cfg) as sess:
        meta = v1.saved_model.loader.load(sess, ["serve"], export)
        sig = meta.signature_def["serving_default"]
        out = sig.outputs["probability"].name
        inputs = {k: (sess.graph.get_tensor_by_name(v.name), tf.as_dtype(v.dtype)) for k, v in sig.inputs.items()}
        for path in files:
            with open(path, newline="") as fh:
                table = list(csv.reader(fh))
            head, body = table[0], table[1:]
            cols = {name: [r[i] for r in body] for i, name in enumerate(head)}
            feed = {}
            for name, (t, dt) in inputs.items():
                vals = np.array(cols[name], dtype=object if dt == tf.string else np.float32)
                if dt == tf.string:
                    vals = vals.astype(bytes)
                feed[t] = vals.reshape([-1] + [1] * (len(t.shape) - 1)) if t.shape.rank else vals
            p = np.asarray(sess.run(out, feed)).reshape(-1)
            scores.append(p)
            labels.append(np.array(cols["label"], dtype=np.float32))
            rows += len(body)
            s, y = np.concatenate(scores)[-window:], np.concatenate(labels)[-window:]
            points.append([rows, auc(s, y)])
    s, y = np.concatenate(scores)[-window:], np.concatenate(labels)[-window:]
    print(json.dumps({"points": points, "last": auc(s, y), "rows": rows - start}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
