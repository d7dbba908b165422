"""wide_deep on CSV headers that are not TensorFlow names (``user id``, ``üser``, ``_ad``,
``ad:x``): training took them, and the export failed on its placeholders' names. The
SavedModel now serves every column under its raw name (the signature's keys)."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfps import models
from tfps.task.output import export

v1 = tf.compat.v1

COLUMNS = (("user id", "string"), ("üser", "string"), ("_ad", "string"), ("ad:x", "string"),
           ("price", "float32"))


def test_wide_deep_with_headers_that_are_not_tensorflow_names_exports_and_serves_them_by_name(tmp_path):
    params = models.ModelParams((len(COLUMNS),), 2, (4,), 0.1, 7, COLUMNS, hash_buckets=64, embedding_dim=2)
    model_fn = models.NamedColumns(models.wide_deep, COLUMNS)
    g = tf.Graph()
    with g.as_default():
        v1.train.get_or_create_global_step()
        feats = {n: v1.placeholder(tf.string if k == "string" else tf.float32, [None]) for n, k in COLUMNS}
        spec = model_fn(feats, tf.zeros([1], tf.int64), "train", params)
        assert spec.loss is not None
        with v1.Session() as sess:
            sess.run(v1.global_variables_initializer())
            ckpt = v1.train.Saver().save(sess, str(tmp_path / "model.ckpt"), global_step=1)
    out = export.export_saved_model(model_fn, params, ckpt, str(tmp_path / "export"), 1)
    serve = tf.saved_model.load(out).signatures["serving_default"]
    assert set(serve.structured_input_signature[1]) == {n for n, _ in COLUMNS}
    row = {n: tf.constant(["a"] if k == "string" else [1.5]) for n, k in COLUMNS}
    p = serve(**row)["probability"].numpy()
    assert p.shape == (1,) and np.isfinite(p).all() and 0 < p[0] < 1


def test_valid_names_are_kept_and_others_made_valid():
    assert [export.input_op_name(c) for c in ("price", "user id", "üser", "_ad", "ad:x", "a/b")] == [
        "price", "user_id", "input_ser", "input_ad", "ad_x", "a_b"]
