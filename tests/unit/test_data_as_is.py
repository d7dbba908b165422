"""Data read as what it is (issue 35): a column's type is decided over the scanned rows before
any value is judged, CSV edge cases, evaluation columns by name, TFRecord records checked."""

from __future__ import annotations

import numpy as np
import pytest

from tfps.config import RunConfig
from tfps.data import dataset as data
from tfps.errors import ConfigError
from tfps.task.setup import JobSetup

tf = pytest.importorskip("tensorflow")


def write(path, text: str, encoding: str = "utf-8") -> str:
    path.write_text(text, encoding=encoding)
    return str(path)


def refused(field: str, fn, *args, **kwargs) -> str:
    with pytest.raises(ConfigError) as info:
        fn(*args, **kwargs)
    assert info.value.field == field, str(info.value)
    assert "\n" not in str(info.value)
    return str(info.value)


def rows_of(schema: data.Schema, label: str = "label") -> list:
    """Every example of ``schema`` as the training pipeline decodes it, in file order."""
    out = []
    for x, y in data.make_dataset(schema, label, 64, train=False):
        if isinstance(x, dict):
            cols = {k: v.numpy() for k, v in x.items()}
            out += [({k: cols[k][i] for k in cols}, int(y[i])) for i in range(len(y))]
        else:
            out += [(list(x.numpy()[i]), int(y[i])) for i in range(len(y))]
    return out


# ------------------------------------------------------------- 6: types decided before judging
HEX = ["68fd1e64", "80e26c9b", "4e992287", "fb936136", "0b153874", "05db9164"]


def hex_csv(tmp_path, ids=HEX, name="train.csv") -> str:
    lines = ["I1,C3,label"] + [f"{i}.5,{h},{i % 2}" for i, h in enumerate(ids)]
    return write(tmp_path / name, "\n".join(lines) + "\n")


def test_criteo_hex_ids_are_a_text_column_even_where_one_reads_as_infinity(tmp_path):
    f = hex_csv(tmp_path)   # float("4e992287") is inf, at line 4, before any id with a letter
    s = data.infer_schema(f)
    assert s.string_columns == ("C3",)
    assert [x["C3"] for x, _ in rows_of(s)] == [h.encode() for h in HEX]   # read as the text it is


def test_wide_deep_hashes_the_hex_column_as_a_string_end_to_end(tmp_path):
    setup = JobSetup(RunConfig(model="wide_deep", train_data=hex_csv(tmp_path),
                               eval_data=hex_csv(tmp_path, ["4e992287", "12345678"], "eval.csv")).validate())
    # one decision for the model's columns, the export's signature and both pipelines
    assert setup.params.columns == (("I1", "float32"), ("C3", "string"))
    assert setup.model_fn.serving_inputs == {"I1": ([], "float32"), "C3": ([], "string")}
    # the eval ids all read as numbers (one as infinity): still text, as training decided
    assert setup.eval_schema.string_columns == ("C3",)
    assert [x["C3"] for x, _ in rows_of(setup.eval_schema)] == [b"4e992287", b"12345678"]


def test_a_number_column_is_still_judged(tmp_path):
    f = write(tmp_path / "t.csv", "a,b,label\n1,x,0\ninf,y,1\n")
    assert "t.csv:3 has a non-finite value (inf) in column 'a'" in refused("train_data", data.infer_schema, f)
    f = write(tmp_path / "t.csv", "a,b,label\n1,nan,0\n2,nan,1\n")   # 'nan' everywhere: numbers, NaN
    assert "t.csv:2 has a non-finite value (nan) in column 'b'" in refused("train_data", data.infer_schema, f)


def test_eval_text_in_a_column_training_reads_as_numbers_is_refused(tmp_path):
    train = write(tmp_path / "train.csv", "a,label\n1,0\n2,1\n")
    ev = write(tmp_path / "eval.csv", "a,label\n1,0\nabc,1\n")
    msg = refused("eval_data", JobSetup, RunConfig(train_data=train, eval_data=ev).validate())
    assert "eval.csv:3 has 'abc' in column 'a', which is a number column in the training data" in msg


# ------------------------------------------------------------------------- 11: CSV edge cases
@pytest.mark.parametrize("model", ["mlp", "wide_deep"])
def test_an_empty_cell_in_a_number_column_is_refused_with_its_line(tmp_path, model):
    f = write(tmp_path / "t.csv", "user,price,label\nu1,1.5,0\nu2,,1\nu3,2.5,0\n")
    msg = refused("train_data", JobSetup, RunConfig(model=model, train_data=f).validate())
    assert msg.endswith("t.csv:3 has an empty cell in the number column 'price'; fill it in or remove that row")


def test_an_empty_cell_in_a_text_column_is_an_empty_id(tmp_path):
    f = write(tmp_path / "t.csv", "user,price,label\nu1,1.5,0\n,2.0,1\n")
    s = data.infer_schema(f)
    assert s.string_columns == ("user",)
    assert [x["user"] for x, _ in rows_of(s)] == [b"u1", b""]


def test_the_mlp_names_where_a_text_column_is(tmp_path):
    f = write(tmp_path / "t.csv", "f1,f2,label\n1,2,0\n3,abc,1\n")
    msg = refused("model", JobSetup, RunConfig(model="mlp", train_data=f).validate())
    assert "text columns (f2), e.g. 'abc' at " in msg and "t.csv:3 in column 'f2'" in msg


@pytest.mark.parametrize("header,says", [
    ("a,,label", "t.csv: column 2 of the header has no name; name every column"),
    ("a, ,label", "t.csv: column 2 of the header has no name"),
    ("a,b,a,label", "t.csv: the header names two columns 'a' (columns 1 and 3); give every column a name"),
])
def test_empty_and_duplicate_header_names_are_refused(tmp_path, header, says):
    width = header.count(",") + 1
    f = write(tmp_path / "t.csv", f"{header}\n" + ",".join(["1"] * (width - 1) + ["0"]) + "\n"
              + ",".join(["2"] * (width - 1) + ["1"]) + "\n")
    assert says in refused("train_data", data.infer_schema, f)


def test_the_cli_refuses_a_duplicate_header_in_one_line_with_exit_2(tmp_path, capsys):
    from tfps.cli import main
    f = write(tmp_path / "t.csv", "a,a,label\n1,2,0\n3,4,1\n")
    rc = main(["local", "--train_data", f, "--model_dir", str(tmp_path / "m")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("tfps: error: train_data: ") and "names two columns 'a'" in err[0]


def test_a_byte_order_mark_is_dropped(tmp_path):
    f = write(tmp_path / "t.csv", "user,price,label\nu1,1.5,0\nu2,2.5,1\n", encoding="utf-8-sig")
    assert open(f, "rb").read(3) == b"\xef\xbb\xbf"
    s = data.infer_schema(f)
    assert s.feature_keys == ("user", "price") and s.string_columns == ("user",)
    setup = JobSetup(RunConfig(model="wide_deep", train_data=f).validate())
    assert set(setup.model_fn.serving_inputs) == {"user", "price"}
    assert rows_of(s) == [({"user": b"u1", "price": np.float32(1.5)}, 0),
                          ({"user": b"u2", "price": np.float32(2.5)}, 1)]


def test_a_cell_over_the_csv_modules_limit_is_read(tmp_path):
    big = "x" * 200_000   # the csv module refuses cells over 131,072 characters by default
    f = write(tmp_path / "t.csv", f"doc,n,label\n{big},1,0\nshort,2,1\n")
    s = data.infer_schema(f)
    assert s.string_columns == ("doc",)
    assert [x["doc"] for x, _ in rows_of(s)] == [big.encode(), b"short"]


def test_rfc_4180_quoted_fields_train_as_written(tmp_path):
    f = write(tmp_path / "t.csv", 'user,n,label\n"a,b",1,0\n"say ""hi""","2.5",1\n"",3,0\n')
    s = data.infer_schema(f)
    assert s.string_columns == ("user",)
    assert rows_of(s) == [({"user": b"a,b", "n": np.float32(1)}, 0),
                          ({"user": b'say "hi"', "n": np.float32(2.5)}, 1),
                          ({"user": b"", "n": np.float32(3)}, 0)]


@pytest.mark.parametrize("row,says", [
    ('"two\nlines",1,0', 't.csv:3 has a quoted field that runs over 2 lines'),
    ('a "b",1,0', 't.csv:3 has a quote that is not RFC 4180 quoting'),
    ('"a" b,1,0', 't.csv:3 has a quote that is not RFC 4180 quoting'),
])
def test_quoting_training_cannot_read_is_refused_before_start(tmp_path, row, says):
    f = write(tmp_path / "t.csv", f"user,n,label\nu,2,1\n{row}\n")
    assert says in refused("train_data", data.infer_schema, f)


# ---------------------------------------------------------------------- 12: eval columns by name
def test_eval_columns_are_matched_by_name(tmp_path):
    train = write(tmp_path / "train.csv", "a,b,c,label\n1,2,3,0\n4,5,6,1\n")
    ev = write(tmp_path / "eval.csv", "c,label,a,b\n3,0,1,2\n6,1,4,5\n")   # the same rows, reordered
    setup = JobSetup(RunConfig(train_data=train, eval_data=ev).validate())
    assert rows_of(setup.eval_schema) == rows_of(setup.schema) == [([1, 2, 3], 0), ([4, 5, 6], 1)]


@pytest.mark.parametrize("header,says", [
    ("a,b,label", "eval.csv lacks the training data's columns 'c'"),
    ("a,b,c,d,label", "eval.csv has columns the training data lacks: 'd'"),
])
def test_eval_with_missing_or_extra_columns_is_refused(tmp_path, header, says):
    train = write(tmp_path / "train.csv", "a,b,c,label\n1,2,3,0\n4,5,6,1\n")
    width = header.count(",")
    ev = write(tmp_path / "eval.csv", f"{header}\n" + ",".join(["1"] * width) + ",0\n")
    assert says in refused("eval_data", JobSetup, RunConfig(train_data=train, eval_data=ev).validate())


# -------------------------------------------------------------- 19: TFRecord records before start
def feature(v):
    if isinstance(v, bytes):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[v]))
    if isinstance(v, list) and v and isinstance(v[0], int):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=v))
    return tf.train.Feature(float_list=tf.train.FloatList(value=v))


def tfrecord(path, records) -> str:
    with tf.io.TFRecordWriter(str(path)) as w:
        for r in records:
            w.write(tf.train.Example(features=tf.train.Features(
                feature={k: feature(v) for k, v in r.items()})).SerializeToString())
    return str(path)


def good(i):
    return {"x": [float(i), 2.0], "id": [i], "label": [float(i % 2)]}


@pytest.mark.parametrize("bad,says", [
    ({"x": [1.0, 2.0], "id": [3]}, "t.tfrecord: record 4 has no label 'label'; every record needs one"),
    ({"id": [3], "label": [1.0]}, "t.tfrecord: record 4 lacks feature 'x', which the first record has"),
    ({"x": [1.0, 2.0, 3.0], "id": [3], "label": [1.0]}, "t.tfrecord: record 4 holds 3 values in feature 'x', "
                                                      "the first record 2"),
    ({"x": [1.0, float("nan")], "id": [3], "label": [1.0]}, "t.tfrecord: record 4 has a non-finite value (nan) "
                                                          "in feature 'x'"),
    ({"x": [1.0, 2.0], "id": [3], "label": [float("inf")]}, "t.tfrecord: record 4 has a non-finite value (inf) "
                                                             "in the label 'label'"),
    ({"x": [1.0, 2.0], "id": [3.0], "label": [1.0]}, "t.tfrecord: record 4 holds 'id' as float values, the first "
                                                   "record as int64"),
])
def test_every_scanned_tfrecord_record_is_checked_before_start(tmp_path, bad, says):
    f = tfrecord(tmp_path / "t.tfrecord", [good(0), good(1), good(2), bad, good(4)])
    assert says in refused("train_data", data.infer_schema, f)


def test_a_tfrecord_problem_is_named_in_its_own_file(tmp_path):
    tfrecord(tmp_path / "a.tfrecord", [good(i) for i in range(3)])
    tfrecord(tmp_path / "b.tfrecord", [good(0), {"x": [1.0, 2.0], "label": [0.0]}])
    assert "b.tfrecord: record 2 lacks feature 'id'" in refused("train_data", data.infer_schema,
                                                                str(tmp_path / "*.tfrecord"))
    tfrecord(tmp_path / "b.tfrecord", [good(0), good(1)])
    assert data.infer_schema(str(tmp_path / "*.tfrecord")).feature_keys == ("id", "x")   # good data passes
