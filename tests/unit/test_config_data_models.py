"""Bad input is refused before anything starts: run options, data files, model names, cluster.

Every refusal is a ``ConfigError`` that names the field to change (the CLI prints it as
``tfps: error: FIELD: ...`` and exits 2); good input goes through unchanged.
"""

from __future__ import annotations

import gzip
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

from tfps import models
from tfps.cli import build_parser, normalize_argv
from tfps.cluster import TaskRef
from tfps.config import DEFAULT_FINAL_SAVE_TIMEOUT, GRACE_MARGIN, RunConfig, from_args, grace_period
from tfps.data import dataset as data
from tfps.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def refused(field: str, fn, *args, **kwargs) -> str:
    with pytest.raises(ConfigError) as info:
        fn(*args, **kwargs)
    assert info.value.field == field, str(info.value)
    assert str(info.value).startswith(f"{field}: ")
    return str(info.value)


# ----------------------------------------------------------------------------- RunConfig
def test_defaults_are_valid():
    cfg = RunConfig().validate()
    assert cfg.final_save_timeout == DEFAULT_FINAL_SAVE_TIMEOUT
    assert cfg.export_path.endswith("export")


@pytest.mark.parametrize("field,value,words", [
    ("train_steps", -1, "positive"),
    ("train_steps", 0, "positive"),
    ("batch_size", 0, "positive"),
    ("learning_rate", 0.0, "positive"),
    ("log_steps", -5, "positive"),
    ("tf_threads", 0, "positive"),
    ("final_save_timeout", 5, "at least 30"),
    ("optimizer", "rmsprop", "adam"),
    ("hidden_units", "64,x", "comma-separated"),
    ("hidden_units", "64,0", "positive"),
    ("num_classes", 1, "regression"),
    ("num_classes", -2, "regression"),
    ("model", "nosuch", "package.module:function"),
    ("model_dir", "", "directory"),
    ("learning_rate", float("nan"), "positive"),
    ("learning_rate", float("inf"), "positive"),
    ("sync_timeout", float("nan"), "positive"),
    ("train_steps", 2**63, "64-bit"),
    ("batch_size", 2**63, "64-bit"),
    ("replicas_to_aggregate", 2, "--sync_replicas"),
    ("backup_workers", 1, "asynchronous training never waits"),
    ("backup_workers", -1, "0 or more"),
    ("hash_buckets", 0, "positive"),
    ("embedding_dim", -1, "positive"),
    ("partition_mb", 0, "positive"),
    ("embedding", "sparse", "use hashed"),
    ("min_count", 3, "add --embedding dynamic, or drop --min_count"),
    ("steps_to_live", 100, "add --embedding dynamic"),
    ("epochs", 0, "positive"),
    ("epochs", -2, "positive"),
    ("epochs", 2**63, "64-bit"),
])
def test_bad_run_option_names_its_field(field, value, words):
    msg = refused(field, RunConfig(**{field: value}).validate)
    assert words in msg


@pytest.mark.parametrize("field,value,words", [
    ("min_count", 0, "1 or more"),
    ("steps_to_live", -1, "0 to never evict"),
    ("expected_ids", -5, "0 when unknown"),
    ("expected_ids", 2**63, "32-bit"),
    ("min_count", 2**31, "counts unadmitted ids in 32-bit integers; use at most 2147483647"),
    ("min_count", 2.5, "whole number"),
])
def test_bad_dynamic_table_option_names_its_field(field, value, words):
    cfg = RunConfig(model="wide_deep", embedding="dynamic", **{field: value})
    assert words in refused(field, cfg.validate)


def test_dynamic_tables_are_for_wide_deep_or_your_own_model():
    assert "the built-in model mlp has no id tables" in \
        refused("embedding", RunConfig(model="mlp", embedding="dynamic").validate)
    cfg = RunConfig(model="wide_deep", embedding="dynamic", min_count=3, steps_to_live=100, expected_ids=10**6)
    assert cfg.validate().to_args() == ["--model=wide_deep", "--embedding=dynamic", "--min_count=3",
                                        "--steps_to_live=100", "--expected_ids=1000000"]
    RunConfig(model="my.models:build", embedding="dynamic", steps_to_live=100).validate()


def test_dynamic_tables_on_data_whose_ids_read_as_numbers_are_refused_before_start(capsys, tmp_path):
    """Integer ids in a CSV read as numbers: wide_deep built no table and ignored --min_count."""
    data = tmp_path / "clicks.csv"
    data.write_text("user,ad,price,label\n" + "".join(f"{i % 7},{i % 5},{i / 10},{i % 2}\n" for i in range(40)))
    from tfps.cli import main
    rc = main(["local", "--model", "wide_deep", "--embedding", "dynamic", "--min_count", "2",
               "--train_data", str(data), "--model_dir", str(tmp_path / "m")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("tfps: error: embedding: wide_deep keeps dynamic rows for id columns"), err
    assert "give the ids as text (e.g. u123)" in err[0] and str(data) in err[0]
    assert not (tmp_path / "m").exists()
    data.write_text("user,ad,price,label\n" + "".join(f"u{i % 7},{i % 5},{i / 10},{i % 2}\n" for i in range(40)))
    from tfps.task.setup import JobSetup
    setup = JobSetup(RunConfig(model="wide_deep", embedding="dynamic", train_data=str(data)), bind=False)
    assert ("user", "string") in setup.params.columns


def test_epochs_are_asynchronous_and_refused_with_sync_replicas_in_one_line(capsys, tmp_path):
    assert RunConfig(epochs=2).validate().to_args() == ["--epochs=2"]
    assert RunConfig().validate().to_args() == []   # without --epochs nothing changes
    msg = refused("epochs", RunConfig(epochs=1, sync_replicas=True).validate)
    assert "drop --sync_replicas (asynchronous), or drop --epochs" in msg
    from tfps.cli import main
    rc = main(["local", "--sync_replicas", "--epochs", "1", "--model_dir", str(tmp_path / "m")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("tfps: error: epochs: counts each worker's own passes")
    assert not (tmp_path / "m").exists()


def test_replicas_above_the_workers_are_refused_before_start():
    from tfps.config import check_replicas
    cfg = RunConfig(sync_replicas=True, replicas_to_aggregate=3).validate()
    assert "more than the 2 worker(s)" in refused("replicas_to_aggregate", check_replicas, cfg, 2)
    check_replicas(cfg, 3)


def test_backup_workers_must_leave_a_gradient_and_agree_with_replicas_to_aggregate():
    from tfps.config import check_replicas, replicas_per_step
    cfg = RunConfig(sync_replicas=True, backup_workers=1).validate()
    check_replicas(cfg, 3)
    assert replicas_per_step(cfg, 3) == 2
    assert replicas_per_step(RunConfig(sync_replicas=True).validate(), 3) == 3
    two = RunConfig(sync_replicas=True, backup_workers=2).validate()
    assert "2 backup worker(s) of 2 worker(s) leave no gradient to aggregate; use at most 1" in \
        refused("backup_workers", check_replicas, two, 2)
    both = RunConfig(sync_replicas=True, backup_workers=1, replicas_to_aggregate=3).validate()
    assert "mean 2 gradient(s) per step, and --replicas_to_aggregate says 3" in \
        refused("backup_workers", check_replicas, both, 3)
    check_replicas(RunConfig(sync_replicas=True, backup_workers=1, replicas_to_aggregate=2).validate(), 3)


def test_the_cli_refuses_backup_workers_in_one_line_with_exit_2(capsys, tmp_path):
    from tfps.cli import main
    rc = main(["local", "--workers", "2", "--sync_replicas", "--backup_workers", "2",
               "--model_dir", str(tmp_path / "m")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("tfps: error: backup_workers: 2 backup worker(s)")
    assert not (tmp_path / "m").exists()


def test_checkpoint_steps_and_secs_are_exclusive():
    refused("checkpoint_secs", RunConfig(checkpoint_steps=10, checkpoint_secs=10).validate)


def test_misspelled_model_gets_a_suggestion():
    assert "did you mean 'mlp'" in refused("model", RunConfig(model="mpl").validate)


def test_every_stop_grace_derives_from_final_save_timeout():
    assert grace_period(100) == 100 + GRACE_MARGIN
    assert grace_period(DEFAULT_FINAL_SAVE_TIMEOUT) > DEFAULT_FINAL_SAVE_TIMEOUT


def test_checkpoint_interval_defaults_to_a_fifth_of_training():
    assert RunConfig(train_steps=300).checkpoint_every_steps == 60
    assert RunConfig(train_steps=100_000).checkpoint_every_steps == 500
    assert RunConfig(checkpoint_secs=60).checkpoint_every_steps is None


# ----------------------------------------------------------------------------- command line
def parse(*argv: str) -> RunConfig:
    return from_args(build_parser().parse_args(normalize_argv(["run", *argv])))


def test_issync_is_an_alias_of_sync_replicas():
    assert parse("--issync").sync_replicas is True
    assert parse("--sync_replicas").sync_replicas is True
    assert parse().sync_replicas is False


def test_dashes_and_underscores_are_the_same_flag():
    assert parse("--train-steps=7", "--batch-size", "3").train_steps == 7
    assert parse("--train_steps=7").train_steps == 7
    assert normalize_argv(["--no-sync-replicas", "--", "--keep-me"]) == ["--no-sync_replicas", "--", "--keep-me"]


def test_to_args_reproduces_the_config():
    cfg = RunConfig(model="cnn", train_steps=123, batch_size=7, sync_replicas=True, learning_rate=0.5,
                    final_save_timeout=60, hidden_units="8,4", model_dir="/tmp/m").validate()
    assert parse(*cfg.to_args()) == cfg


def test_flag_values_are_validated():
    refused("train_steps", parse, "--train_steps", "-1")
    refused("batch_size", parse, "--batch_size", "0")
    refused("final_save_timeout", parse, "--final_save_timeout", "5")


# ----------------------------------------------------------------------------- cluster input
CLUSTER = dict(ps_hosts="127.0.0.1:2222", worker_hosts="127.0.0.1:2223,127.0.0.1:2224")


def test_no_job_name_and_no_tf_config():
    msg = refused("cluster", TaskRef.resolve, environ={})
    assert "TF_CONFIG" in msg


def test_task_index_out_of_range():
    msg = refused("task_index", TaskRef.resolve, job_name="worker", task_index=5, environ={}, **CLUSTER)
    assert "0..1" in msg


def test_malformed_tf_config():
    refused("TF_CONFIG", TaskRef.resolve, environ={"TF_CONFIG": '{"cluster": {'})
    refused("TF_CONFIG", TaskRef.resolve, environ={"TF_CONFIG": '{"cluster": {"ps": ["h:1"]}}'})


def test_flags_and_tf_config_name_the_same_task():
    ref = TaskRef.resolve(job_name="worker", task_index=1, environ={}, **CLUSTER)
    assert TaskRef.resolve(environ={"TF_CONFIG": ref.to_tf_config()}) == ref
    assert ref.to_flags()[2:] == ["--job_name=worker", "--task_index=1"]


# ----------------------------------------------------------------------------- data files
def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_good_csv_schema(tmp_path):
    f = write(tmp_path / "t.csv", "a,b,label\n1,2,0\n3,4,2\n\n5,6,1\n")
    s = data.infer_schema(f)
    assert (s.fmt, s.feature_shape, s.num_classes, s.feature_keys, s.num_examples) == \
        ("csv", (2,), 3, ("a", "b"), 3)


@pytest.mark.parametrize("train", [True, False], ids=["training (decoded once, cached)", "evaluation"])
def test_csv_rows_around_blank_lines_are_all_read(tmp_path, train):
    f = write(tmp_path / "t.csv", "a,b,label\n1,2,0\n\n3,4,2\n\n\n5,6,1\r\n\n7,8,1\n")
    s = data.infer_schema(f)
    ds = data.make_dataset(s, "label", 4, train=train)
    x, y = next(iter(ds))
    rows = sorted(zip(x.numpy().tolist(), y.numpy().tolist()))
    assert rows == [([1.0, 2.0], 0), ([3.0, 4.0], 2), ([5.0, 6.0], 1), ([7.0, 8.0], 1)]


def test_with_epochs_each_worker_reads_its_own_rows_that_many_times_and_no_more(tmp_path):
    """--epochs: a pass is ceil(rows / batch) batches (the last one smaller), read N times,
    then the data ends; count_examples counts the rows make_dataset reads (blank lines not)."""
    write(tmp_path / "a.csv", "a,b,label\n" + "".join(f"{i},{i},{i % 2}\n" for i in range(7)) + "\n")
    write(tmp_path / "b.csv", "a,b,label\n" + "".join(f"{i},{i},{i % 2}\n" for i in range(100, 105)))
    s = data.infer_schema(str(tmp_path / "*.csv"))
    assert [data.count_examples(s, "label", num_shards=2, shard_index=i) for i in (0, 1)] == [7, 5]
    assert data.count_examples(s, "label") == 12
    ds = data.make_dataset(s, "label", 3, num_shards=2, shard_index=0, epochs=2)
    batches = [x.numpy()[:, 0].tolist() for x, _ in ds]
    assert [len(b) for b in batches] == [3, 3, 1] * 2   # ceil(7 / 3) = 3 batches a pass, twice
    assert sorted(sum(batches[:3], [])) == sorted(sum(batches[3:], [])) == [float(i) for i in range(7)]


def test_csv_regression_labels(tmp_path):
    f = write(tmp_path / "t.csv", "a,y\n1,0.5\n2,1.7\n")
    assert data.infer_schema(f, label_column="y", num_classes=0).num_classes == 0


@pytest.mark.parametrize("rows, num_classes, field, says", [
    ("1,0.5\n2,1\n", None, "label_column", ":2: label 0.5 is not a class number"),
    ("1,0\n2,-1\n", None, "label_column", ":3: label -1 is not a class number"),
    ("1,0\n2,1\n3,2\n4,7\n", None, "num_classes", "labels go up to 7"),
    ("1,1\n2,1\n", None, "label_column", "every label is 1"),
    ("1,0\n2,3\n", 3, "num_classes", ":3: label 3 is outside --num_classes 3"),
    ("1,0\n2,nan\n", None, "train_data", ":3 has a non-finite value (nan) in column 'y'"),
    ("inf,0\n2,1\n", None, "train_data", ":2 has a non-finite value (inf) in column 'a'"),
])
def test_labels_and_values_are_checked_against_the_task(tmp_path, rows, num_classes, field, says):
    f = write(tmp_path / "t.csv", "a,y\n" + rows)
    assert says in refused(field, data.infer_schema, f, label_column="y", num_classes=num_classes)


def test_classes_with_gaps_are_accepted_when_num_classes_says_so(tmp_path):
    f = write(tmp_path / "t.csv", "a,y\n1,0\n2,1\n3,2\n4,7\n")
    assert data.infer_schema(f, label_column="y", num_classes=8).num_classes == 8


def test_a_binary_file_named_csv_is_one_line(tmp_path):
    f = tmp_path / "t.csv"
    f.write_bytes(bytes(range(128, 256)) * 4)
    assert "is not a text CSV file" in refused("train_data", data.infer_schema, str(f))


def test_nan_beyond_the_scanned_rows_stops_the_pipeline(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "CSV_SCAN_ROWS", 2)
    f = write(tmp_path / "t.csv", "a,label\n1,0\n2,1\n3,0\nnan,1\n")
    s = data.infer_schema(f)
    with pytest.raises(tf.errors.InvalidArgumentError, match="non-finite value"):
        list(data.make_dataset(s, "label", 4, train=False))


def test_csv_with_a_wrong_column_count(tmp_path):
    f = write(tmp_path / "t.csv", "a,b,label\n1,2,0\n3,4\n")
    assert ":3 has 2 columns, the header has 3" in refused("train_data", data.infer_schema, f)


def test_csv_without_the_label_column(tmp_path):
    f = write(tmp_path / "t.csv", "a,b,target\n1,2,0\n")
    msg = refused("label_column", data.infer_schema, f)
    assert "'label'" in msg and "a, b, target" in msg


def test_empty_csv(tmp_path):
    assert "is empty" in refused("train_data", data.infer_schema, write(tmp_path / "t.csv", ""))


def test_csv_with_only_a_header(tmp_path):
    assert "no data rows" in refused("train_data", data.infer_schema, write(tmp_path / "t.csv", "a,label\n"))


def test_csv_with_text_values_has_string_columns(tmp_path):
    f = write(tmp_path / "t.csv", "a,b,label\nred,1,0\nblue,2,1\n")
    assert data.infer_schema(f).string_columns == ("a",)


def test_csv_with_only_the_label(tmp_path):
    refused("train_data", data.infer_schema, write(tmp_path / "t.csv", "label\n0\n1\n"))


def test_csv_files_with_different_headers(tmp_path):
    write(tmp_path / "a.csv", "a,label\n1,0\n")
    write(tmp_path / "b.csv", "b,label\n1,0\n")
    assert "share one header" in refused("train_data", data.infer_schema, str(tmp_path / "*.csv"))


def test_no_matching_files_names_the_field_it_came_from():
    refused("train_data", data.infer_schema, "/nonexistent/*.csv")
    refused("eval_data", data.infer_schema, "/nonexistent/*.csv", "label", None, "eval_data")


def test_directory_instead_of_glob(tmp_path):
    write(tmp_path / "t.csv", "a,label\n1,0\n")
    assert "*.csv" in refused("train_data", data.infer_schema, str(tmp_path))


def test_unknown_and_mixed_formats(tmp_path):
    write(tmp_path / "t.parquet", "x")
    assert "unknown data format" in refused("train_data", data.infer_schema, str(tmp_path / "*.parquet"))
    write(tmp_path / "a.csv", "a,label\n1,0\n")
    np.savez(tmp_path / "b.npz", x=np.zeros((2, 2)), y=np.zeros(2))
    assert "several formats" in refused("train_data", data.infer_schema, str(tmp_path / "[ab].*"))


def test_labels_beyond_num_classes(tmp_path):
    f = write(tmp_path / "t.csv", "a,label\n1,0\n1,4\n")
    refused("num_classes", data.infer_schema, f, num_classes=3)


def test_npz_schema_and_missing_arrays(tmp_path):
    np.savez(tmp_path / "ok.npz", x=np.zeros((10, 4, 4)), y=np.arange(10) % 3)
    s = data.infer_schema(str(tmp_path / "ok.npz"))
    assert (s.fmt, s.feature_shape, s.num_classes, s.num_examples) == ("npz", (4, 4), 3, 10)
    np.savez(tmp_path / "bad.npz", images=np.zeros((3, 2)), y=np.zeros(3))
    assert "'x'" in refused("train_data", data.infer_schema, str(tmp_path / "bad.npz"))
    np.savez(tmp_path / "short.npz", x=np.zeros((3, 2)), y=np.zeros(2))
    assert "3 examples but 2 labels" in refused("train_data", data.infer_schema, str(tmp_path / "short.npz"))


def test_mnist_idx_pair(tmp_path):
    n = 6
    img = (np.arange(n * 4 * 5) % 256).astype(np.uint8)
    labels = np.array([0, 1, 2, 3, 4, 9], dtype=np.uint8)
    with gzip.open(tmp_path / "train-images-idx3-ubyte.gz", "wb") as fh:
        fh.write(struct.pack(">IIII", 0x0803, n, 4, 5) + img.tobytes())
    with gzip.open(tmp_path / "train-labels-idx1-ubyte.gz", "wb") as fh:
        fh.write(struct.pack(">II", 0x0801, n) + labels.tobytes())
    s = data.infer_schema(str(tmp_path / "train-*"), num_classes=10)
    assert (s.fmt, s.files, s.feature_shape, s.num_classes) == \
        ("idx", (str(tmp_path / "train-images-idx3-ubyte.gz"),), (4, 5, 1), 10)
    x, y = data.load_idx(s.files[0])
    assert x.max() <= 1.0 and list(y) == list(labels)


def test_idx_images_without_labels(tmp_path):
    (tmp_path / "t10k-images-idx3-ubyte").write_bytes(struct.pack(">IIII", 0x0803, 1, 2, 2) + bytes(4))
    assert "no labels file" in refused("train_data", data.infer_schema, str(tmp_path / "t10k-images-idx3-ubyte"))


import tensorflow as tf  # noqa: E402 - the cpu extra; only the tests below need it


def write_tfrecord(path: Path, labels, label_key="label"):
    with tf.io.TFRecordWriter(str(path)) as w:
        for i, label in enumerate(labels):
            w.write(tf.train.Example(features=tf.train.Features(feature={
                "b": tf.train.Feature(float_list=tf.train.FloatList(value=[i, 2.0])),
                "a": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
                label_key: tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
            })).SerializeToString())


def test_tfrecord_classes_come_from_every_label_not_the_first(tmp_path):
    write_tfrecord(tmp_path / "t.tfrecord", [0, 1, 2, 1, 0])
    s = data.infer_schema(str(tmp_path / "t.tfrecord"))
    assert (s.fmt, s.feature_keys, s.feature_shape, s.num_classes) == ("tfrecord", ("a", "b"), (3,), 3)


def test_tfrecord_int64_features_and_labels_are_read(tmp_path):
    write_tfrecord(tmp_path / "t.tfrecord", [2, 0, 1])
    s = data.infer_schema(str(tmp_path / "t.tfrecord"))
    x, y = next(iter(data.make_dataset(s, "label", 3, train=False)))
    np.testing.assert_array_equal(x.numpy(), [[0, 0, 2], [1, 1, 2], [2, 2, 2]])   # a, then b
    np.testing.assert_array_equal(y.numpy(), [2, 0, 1])


def test_tfrecord_without_the_label(tmp_path):
    write_tfrecord(tmp_path / "t.tfrecord", [0, 1], label_key="target")
    assert "'label'" in refused("label_column", data.infer_schema, str(tmp_path / "t.tfrecord"))


def test_empty_tfrecord(tmp_path):
    with tf.io.TFRecordWriter(str(tmp_path / "t.tfrecord")):
        pass
    assert "no records" in refused("train_data", data.infer_schema, str(tmp_path / "t.tfrecord"))


# ----------------------------------------------------------------------------- models
@pytest.fixture
def repo_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO))
    for name in [m for m in sys.modules if m.startswith(("tests.fixtures", "examples"))]:
        monkeypatch.delitem(sys.modules, name)


def test_builtin_models_resolve():
    assert models.resolve("mlp") is models.mlp
    assert set(models.BUILTIN) == {"linear", "mlp", "cnn", "wide_deep"}


def test_unknown_model():
    refused("model", models.resolve, "nosuch")


def test_user_model_that_cannot_be_imported(repo_on_path):
    msg = refused("model", models.resolve, "tests.fixtures.bad_import:model_fn")
    assert "ModuleNotFoundError" in msg and "tfps_test_no_such_dependency" in msg and "PYTHONPATH" in msg
    assert "cannot import" in refused("model", models.resolve, "no_such_package_xyz.models:model_fn")


def test_user_model_without_the_function(repo_on_path):
    assert "no function 'nope'" in refused("model", models.resolve, "examples.custom_model:nope")


def test_user_model_with_the_wrong_signature(repo_on_path):
    assert "must accept" in refused("model", models.resolve, "tfps.models:check_shape")


def test_example_user_model_resolves(repo_on_path):
    fn = models.resolve("examples.custom_model:model_fn")
    assert fn.__module__ == "examples.custom_model"


def test_cnn_needs_images():
    refused("model", models.check_shape, "cnn", (8,))
    models.check_shape("cnn", (12, 12, 1))


def test_example_user_model_builds_in_every_mode(repo_on_path):
    from examples.custom_model import model_fn
    params = models.ModelParams((8,), 3, (16, 8))
    names = []
    for mode in ("train", "eval", "predict"):
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [None, 8])
            y = None if mode == "predict" else tf.compat.v1.placeholder(tf.int64, [None])
            spec = model_fn(x, y, mode, params)
            assert (spec.loss is None) == (mode == "predict")
            assert set(spec.predictions) == {"probabilities", "classes"}
            names.append(sorted(v.name for v in tf.compat.v1.global_variables()))
    assert names[0] == names[1] == names[2]      # the export restores them by name


def test_only_the_chief_needs_the_evaluation_data(tmp_path):
    """A non-chief worker never evaluates: its host need not hold --eval_data (with
    tfps_data_src only the chief's host gets it), while the chief refuses a missing one."""
    from tfps.task.setup import JobSetup
    train = write(tmp_path / "train.csv", "a,b,label\n" + "".join(f"{i},{i % 3},{i % 2}\n" for i in range(20)))
    cfg = RunConfig(model="mlp", train_data=str(train), eval_data=str(tmp_path / "eval-*.csv"))
    with pytest.raises(ConfigError, match="eval_data: no files match"):
        JobSetup(cfg, shard=(2, 0), evaluates=True)
    setup = JobSetup(cfg, shard=(2, 1), evaluates=False)
    assert setup.eval_schema is None and setup.schema.feature_shape == (2,)


def test_a_bad_label_is_named_by_its_file_and_place_among_several_files(tmp_path):
    """Each scanned label's place is kept as one array a file and found when a message needs
    it: the label past the first files is named by its own file and line, example or record."""
    write(tmp_path / "a.csv", "a,y\n" + "".join(f"{i},{i % 2}\n" for i in range(5)))
    write(tmp_path / "b.csv", "a,y\n1,0\n\n2,1\n")
    write(tmp_path / "c.csv", "a,y\n1,0\n2,1\n3,0.5\n")
    said = refused("label_column", data.infer_schema, str(tmp_path / "*.csv"), label_column="y")
    assert f"{tmp_path / 'c.csv'}:4: label 0.5 is not a class number" in said

    npz = tmp_path / "npz"
    npz.mkdir()
    np.savez(npz / "a.npz", x=np.zeros((3, 2)), y=np.array([0, 1, 0]))
    np.savez(npz / "b.npz", x=np.zeros((4, 2)), y=np.array([1, 0, 1, 5]))
    said = refused("num_classes", data.infer_schema, str(npz / "*.npz"), num_classes=2)
    assert f"{npz / 'b.npz'} example 3: label 5 is outside --num_classes 2" in said

    write_tfrecord(tmp_path / "a.tfrecord", [0, 1, 0])
    write_tfrecord(tmp_path / "b.tfrecord", [1, 0, 4])
    said = refused("num_classes", data.infer_schema, str(tmp_path / "*.tfrecord"), num_classes=3)
    assert f"{tmp_path / 'b.tfrecord'} record 3: label 4 is outside --num_classes 3" in said
