"""bench/dlrm.py's generated Criteo-shaped data: tfps reads its shape (13 numeric and 26
text columns of 8-hex-digit ids, a binary label), and its clicks depend on the ids: a
per-id click rate counted on the training rows ranks the held-out clicks."""

import csv
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))

import dlrm  # noqa: E402

from tfps.data import dataset as data  # noqa: E402


def _auc(y, score):
    order = np.argsort(score, kind="stable")
    ranks = np.empty(len(score))
    ranks[order] = np.arange(1, len(score) + 1)
    pos = y == 1
    return (ranks[pos].sum() - pos.sum() * (pos.sum() + 1) / 2) / (pos.sum() * (~pos).sum())


def test_criteo_shaped_data_has_the_columns_tfps_reads_and_a_learnable_click(tmp_path):
    info = dlrm.generate(str(tmp_path), rows=20000, eval_rows=4000)
    schema = data.infer_schema(info["train_glob"])
    assert schema.string_columns == tuple(dlrm.CATEGORICAL) and schema.num_classes == 2
    assert schema.feature_keys == (*dlrm.NUMERIC, *dlrm.CATEGORICAL)
    assert 0.15 < info["click_rate"] < 0.4

    def rows(path):
        with open(path) as fh:
            return list(csv.DictReader(fh))
    train = [r for f in sorted(tmp_path.glob("train-*.csv")) for r in rows(f)]
    held = rows(info["eval_csv"])
    assert len(train) == 20000 and len(held) == 4000
    assert all(re.fullmatch(r"[0-9a-f]{8}", r[c]) for r in held[:200] for c in dlrm.CATEGORICAL)
    # Naive Bayes over the ids: each id's smoothed click log-odds from the training rows.
    y = np.array([int(r["label"]) for r in train])
    prior = y.mean()
    score = np.zeros(len(held))
    for c in dlrm.CATEGORICAL:
        clicks, shows = {}, {}
        for r, label in zip(train, y):
            clicks[r[c]] = clicks.get(r[c], 0) + label
            shows[r[c]] = shows.get(r[c], 0) + 1
        rate = np.array([(clicks.get(r[c], 0) + 10 * prior) / (shows.get(r[c], 0) + 10) for r in held])
        score += np.log(rate / (1 - rate))
    assert _auc(np.array([int(r["label"]) for r in held]), score) > 0.65     # 0.74 measured
