"""Text columns in a CSV: read as strings, given to Keras inputs by name, refused where they do not fit."""

from __future__ import annotations

import pytest

from tfps.config import RunConfig
from tfps.data import dataset as data
from tfps.errors import ConfigError
from tfps.task.setup import JobSetup

tf = pytest.importorskip("tensorflow")
CSV = "user,ad,site,price,label\nu1,a9,s1,1.5,1\nu2,a3,s2,2.0,0\nu1,a3,s1,0.5,1\nu3,a9,s2,1.0,0\n"


@pytest.fixture
def ctr_csv(tmp_path):
    path = tmp_path / "ctr.csv"
    path.write_text(CSV)
    return str(path)


def refused(field: str, **cfg) -> str:
    with pytest.raises(ConfigError) as info:
        JobSetup(RunConfig(**cfg).validate())
    assert info.value.field == field, str(info.value)
    return str(info.value)


def test_text_columns_are_strings_and_reach_the_model_by_name(ctr_csv):
    schema = data.infer_schema(ctr_csv)
    assert schema.string_columns == ("user", "ad", "site") and schema.num_classes == 2
    features, labels = next(iter(data.make_dataset(schema, "label", 4, train=False)))
    assert sorted(features) == ["ad", "price", "site", "user"]
    assert features["user"].dtype == tf.string and features["price"].dtype == tf.float32
    assert [u.decode() for u in features["user"].numpy()] == ["u1", "u2", "u1", "u3"]
    assert labels.numpy().tolist() == [1, 0, 1, 0]


def test_a_keras_model_with_string_inputs_is_accepted(ctr_csv):
    setup = JobSetup(RunConfig(model="tests.fixtures.ctr_models:build_model", train_data=ctr_csv).validate())
    assert setup.model_fn.serving_inputs["user"] == ([1], "string")
    assert setup.model_fn.serving_inputs["price"] == ([1], "float32")


def test_a_text_column_given_to_a_float_input_is_refused(ctr_csv):
    msg = refused("model", model="tests.fixtures.ctr_models:float_user", train_data=ctr_csv)
    assert "input 'user' takes float32" in msg and "column 'user' holds string" in msg


def test_text_columns_need_one_input_per_column(ctr_csv):
    msg = refused("model", model="tests.fixtures.ctr_models:one_input", train_data=ctr_csv)
    assert "text columns (user, ad, site)" in msg and "one keras.Input per column" in msg


def test_a_built_in_model_refuses_text_columns(ctr_csv):
    assert "takes numbers only" in refused("model", model="mlp", train_data=ctr_csv)


def test_a_text_label_is_refused(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("a,label\n1,yes\n2,no\n")
    with pytest.raises(ConfigError, match=r":2: the label 'yes' is not a number"):
        data.infer_schema(str(path))


def test_the_ctr_demo_data_is_long_tailed_and_deterministic(tmp_path):
    from tfps.models import demo
    a = demo.ensure_demo_data(str(tmp_path / "a"))
    b = demo.ensure_demo_data(str(tmp_path / "b"))
    first = open(a["ctr_eval"]).read()
    assert first == open(b["ctr_eval"]).read()
    rows = [line.split(",") for line in first.splitlines()[1:]]
    users = [r[0] for r in rows]
    top = max(set(users), key=users.count)
    assert users.count(top) > len(users) * 0.05 and len(set(users)) > 500   # a head and a long tail
    clicks = sum(int(r[-1]) for r in rows) / len(rows)
    assert 0.1 < clicks < 0.6


def test_one_sigmoid_unit_is_a_binary_head_that_serves_the_click_probability(ctr_csv):
    setup = JobSetup(RunConfig(model="tests.fixtures.ctr_models:build_model", train_data=ctr_csv).validate())
    v1 = tf.compat.v1
    with tf.Graph().as_default():
        feats = {n: v1.placeholder(tf.as_dtype(d), [None, *s], name=n)
                 for n, (s, d) in setup.model_fn.serving_inputs.items()}
        labels = v1.placeholder(tf.int64, [None])
        spec = setup.model_fn(feats, labels, "train", setup.params)
        assert {"probability", "probabilities", "classes"} <= set(spec.predictions)
        assert spec.predictions["probability"].shape.as_list() == [None]
        step = v1.train.AdamOptimizer(0.05).minimize(spec.loss)
        with v1.Session() as sess:
            sess.run([v1.global_variables_initializer(), v1.tables_initializer()])
            feed = {feats["user"]: [["u1"], ["u2"]] * 8, feats["ad"]: [["a9"], ["a3"]] * 8,
                    feats["site"]: [["s1"], ["s2"]] * 8, feats["price"]: [[1.0], [2.0]] * 8, labels: [1, 0] * 8}
            first = sess.run(spec.loss, feed)
            for _ in range(30):
                sess.run(step, feed)
            last, p = sess.run([spec.loss, spec.predictions["probability"]], feed)
    assert last < first * 0.5, (first, last)          # binary cross-entropy falls
    assert p[0] > 0.5 > p[1]


def test_wide_deep_reads_named_columns_and_refuses_data_without_them(ctr_csv, tmp_path):
    setup = JobSetup(RunConfig(model="wide_deep", train_data=ctr_csv, hash_buckets=64).validate())
    assert setup.model_fn.serving_inputs == {"user": ([], "string"), "ad": ([], "string"),
                                             "site": ([], "string"), "price": ([], "float32")}
    assert setup.identity()["hash_buckets"] == 64
    import numpy as np
    np.savez(tmp_path / "d.npz", x=np.zeros((4, 3), np.float32), y=np.array([0, 1, 0, 1]))
    assert "reads named columns" in refused("model", model="wide_deep", train_data=str(tmp_path / "d.npz"))


def test_auc_is_ranked_over_the_whole_set():
    from tfps.task.output.export import auc
    assert auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == 0.75
    assert auc([0.5, 0.5, 0.5, 0.5], [0, 1, 0, 1]) == 0.5          # ties share their rank
    assert auc([0.2, 0.9], [1, 0]) == 0.0
    assert auc([0.2, 0.9], [1, 1]) is None
    # Not the mean of per-batch AUCs: two batches that are each perfectly ranked...
    assert auc([0.1, 0.2], [0, 1]) == auc([0.8, 0.9], [0, 1]) == 1.0
    # ...but the whole set is not.
    assert auc([0.1, 0.2, 0.8, 0.9], [0, 1, 0, 1]) == 0.75


BIG_ID = 2**40 + 7   # float32 cannot hold it exactly: it must arrive as int64


def write_ctr_tfrecord(path, rows=((b"u1", BIG_ID, 1.5, 1), (b"u2", 3, 2.0, 0), (b"u1", BIG_ID, 0.5, 1),
                                   (b"u3", 3, 1.0, 0)), user_values=1):
    with tf.io.TFRecordWriter(str(path)) as w:
        for user, item, price, label in rows:
            f = tf.train.Feature
            w.write(tf.train.Example(features=tf.train.Features(feature={
                "user": f(bytes_list=tf.train.BytesList(value=[user] * user_values)),
                "item": f(int64_list=tf.train.Int64List(value=[item])),
                "price": f(float_list=tf.train.FloatList(value=[price])),
                "label": f(int64_list=tf.train.Int64List(value=[label]))})).SerializeToString())
    return str(path)


def test_tfrecord_bytes_are_string_columns_and_int64_ids_arrive_exact(tmp_path):
    schema = data.infer_schema(write_ctr_tfrecord(tmp_path / "ctr.tfrecord"))
    assert schema.string_columns == ("user",) and schema.num_classes == 2
    assert schema.column_kinds() == (("item", "int64"), ("price", "float32"), ("user", "string"))
    features, labels = next(iter(data.make_dataset(schema, "label", 4, train=False)))
    assert features["user"].dtype == tf.string and features["item"].dtype == tf.int64
    assert features["price"].dtype == tf.float32
    assert features["item"].numpy().tolist() == [BIG_ID, 3, BIG_ID, 3]
    assert labels.numpy().tolist() == [1, 0, 1, 0]


def test_tfrecord_columns_reach_keras_inputs_in_their_dtypes(tmp_path):
    path = write_ctr_tfrecord(tmp_path / "ctr.tfrecord")
    setup = JobSetup(RunConfig(model="tests.fixtures.ctr_models:int_ids", train_data=path).validate())
    assert setup.model_fn.serving_inputs == {"user": ([1], "string"), "item": ([1], "int64"),
                                             "price": ([1], "float32")}
    msg = refused("model", model="tests.fixtures.ctr_models:int_price", train_data=path)
    assert "input 'price' takes int64" in msg and "column 'price' holds float32" in msg


def test_wide_deep_hashes_tfrecord_int64_ids_read_exact_without_text(tmp_path):
    rows = [(b"", BIG_ID, 1.5, 1), (b"", 3, 2.0, 0)]
    with tf.io.TFRecordWriter(str(tmp_path / "ids.tfrecord")) as w:
        for _, item, price, label in rows:
            f = tf.train.Feature
            w.write(tf.train.Example(features=tf.train.Features(feature={
                "item": f(int64_list=tf.train.Int64List(value=[item])),
                "price": f(float_list=tf.train.FloatList(value=[price])),
                "label": f(int64_list=tf.train.Int64List(value=[label]))})).SerializeToString())
    setup = JobSetup(RunConfig(model="wide_deep", train_data=str(tmp_path / "ids.tfrecord"),
                               hash_buckets=64).validate())
    assert setup.model_fn.serving_inputs == {"item": ([], "int64"), "price": ([], "float32")}
    features, _ = next(iter(data.make_dataset(setup.schema, "label", 2, train=False)))
    assert features["item"].numpy().tolist() == [BIG_ID, 3]


def test_a_tfrecord_string_column_holds_one_value_per_record(tmp_path):
    path = write_ctr_tfrecord(tmp_path / "bad.tfrecord", user_values=2)
    with pytest.raises(ConfigError) as info:
        data.infer_schema(path)
    assert "feature 'user' holds 2 byte strings" in str(info.value)
