"""The chief's final export and evaluation of a checkpoint whose dynamic table held more live
ids than its ``capacity``: the training shards have 10 % room each for an uneven hash
(``SHARD_SLACK``), so a full table on 2 ps holds more ids than the capacity, and the
evaluation's graph (one local shard) must still read every one of them."""

from __future__ import annotations

import types

import numpy as np
import pytest
import tensorflow as tf

from tfps.layers import dynamic_embedding as de
from tfps.models.modelspec import ModelSpec
from tfps.task.output import export

v1 = tf.compat.v1

CAPACITY = 10
BIAS = 0.25


def _model_fn(features, labels, mode, params):
    """One logit per example: the row of its id (a one-wide table) plus a bias. Served as float
    features."""
    ids = features["ids"] if isinstance(features, dict) else tf.cast(features[:, 0], tf.int64)
    table = de.DynamicTable(1, capacity=params.capacity, name="emb", initializer=v1.zeros_initializer(),
                            serving=mode != "train")   # eval, predict: the checkpoint's live rows
    bias = v1.get_variable("bias", [], initializer=v1.zeros_initializer(), use_resource=True)
    logit = table.lookup(ids, training=mode == "train")[:, 0] + bias
    p = tf.sigmoid(logit)
    preds = {"probability": p}
    if labels is None:
        return ModelSpec(None, preds)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=tf.cast(labels, tf.float32),
                                                                  logits=logit))
    return ModelSpec(loss, preds)


def _full_checkpoint(tmp_path, params) -> tuple[str, dict[int, float]]:
    """A checkpoint of the model trained on 2 shards that are both full; its live id -> row."""
    g = tf.Graph()
    with g.as_default(), de.shard_devices(["/cpu:0", "/cpu:0"]):
        v1.train.get_or_create_global_step()
        ids = v1.placeholder(tf.int64, [None])
        spec = _model_fn({"ids": ids}, tf.zeros_like(ids), "train", params)
        table = de.tables(g)[0]
        fill = [s.weights.assign(tf.reshape(tf.range(1, s.cap + 2, dtype=tf.float32) * 0.1 * (1 - 2 * i),
                                            [-1, 1]))
                for i, s in enumerate(table.shards)]
        fill.append(next(v for v in v1.global_variables() if v.op.name == "bias").assign(BIAS))
        saver = v1.train.Saver(de.saver_var_list(g))
        init = v1.global_variables_initializer()
    with v1.Session(graph=g) as sess:
        sess.run(init)
        sess.run(fill)
        sess.run(spec.loss, {ids: np.arange(100)})   # more new ids than both shards hold: both fill up
        live = {}
        for s in table.shards:
            keys, rows = sess.run(tf.raw_ops.LookupTableExportV2(table_handle=s.table, Tkeys=tf.int64,
                                                                 Tvalues=tf.int64))
            weights = sess.run(s.weights)
            live.update({int(k): float(weights[r, 0]) for k, r in zip(keys, rows)})
        path = saver.save(sess, str(tmp_path / "model.ckpt"), global_step=7)
    return path, live


def test_a_checkpoint_of_full_shards_holding_more_ids_than_the_capacity_exports_and_evaluates(tmp_path):
    params = types.SimpleNamespace(capacity=CAPACITY, feature_shape=[1])
    ckpt, live = _full_checkpoint(tmp_path, params)
    # 2 shards of ceil(10 x 1.1 / 2) = 6 rows: 12 live ids, more than the capacity of 10
    assert len(live) == 2 * 6 > CAPACITY
    ids = np.array(sorted(live) + [1000, 1001], np.int64)   # and two ids that never had a row
    labels = np.array([1] * len(ids), np.int64)

    metrics = export.evaluate(_model_fn, params, ckpt,
                              lambda: tf.data.Dataset.from_tensor_slices(({"ids": ids}, labels)).batch(5))

    logits = np.array([live.get(int(i), 0.0) for i in ids]) + BIAS
    expected = float(np.mean(np.log1p(np.exp(-logits))))   # sigmoid cross-entropy with label 1
    assert abs(metrics["loss"] - expected) < 1e-5

    out = export.export_saved_model(_model_fn, params, ckpt, str(tmp_path / "export"), 7)
    served = tf.saved_model.load(out).signatures["serving_default"](features=tf.constant(ids[:, None], tf.float32))
    np.testing.assert_allclose(served["probability"].numpy().reshape(-1), 1 / (1 + np.exp(-logits)), rtol=1e-5)


def test_a_restore_into_a_shard_too_small_for_the_saved_ids_says_to_raise_the_capacity(tmp_path):
    params = types.SimpleNamespace(capacity=CAPACITY, feature_shape=[1])
    ckpt, live = _full_checkpoint(tmp_path, params)
    g = tf.Graph()
    with g.as_default():   # one shard of CAPACITY rows (a continuation on 1 ps)
        v1.train.get_or_create_global_step()
        _model_fn({"ids": v1.placeholder(tf.int64, [None])}, None, "train", params)
        saver = v1.train.Saver(de.saver_var_list(g))
    for _ in range(5):   # the check runs before any op that sizes the rows by the saved ids
        with v1.Session(graph=g) as sess, pytest.raises(tf.errors.InvalidArgumentError,
                                                        match="more live ids than this shard"):
            saver.restore(sess, ckpt)
