"""One short job per input format: TFRecord, NPZ (demo images, cnn) and MNIST IDX files, side by side.

The TFRecord job also trains by passes over its data (``--epochs``, ``--input_split
queue``): its 2 workers take the slices of its two files (1200 records) from the slice queue on ps 0 until every slice was
read EPOCHS times, well before ``--train_steps``.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path

import numpy as np
import pytest
from integration_helpers import assert_nothing_left, launcher_ports, load_and_predict, read_results, run_flags

pytestmark = pytest.mark.integration

STEPS = 100
#: The TFRecord job's passes over its 2 x 600 records, in batches of 64 (each slice's last one smaller).
EPOCHS, RECORDS_PER_WORKER, BATCH = 3, 600, 64


def blobs(n: int, seed: int, width: int = 5, classes: int = 3):
    centers = np.random.default_rng(99).normal(0.0, 3.0, size=(classes, width))
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, size=n)
    return (centers[y] + rng.normal(0.0, 1.0, size=(n, width))).astype(np.float32), y


def write_tfrecord(directory: Path):
    """Two float features of different widths plus an int64 label, like a user's export."""
    import tensorflow as tf
    x, y = blobs(1200, seed=1)
    for part in range(2):
        with tf.io.TFRecordWriter(str(directory / f"train-{part}.tfrecord")) as w:
            for row, label in zip(x[part::2], y[part::2]):
                ex = tf.train.Example(features=tf.train.Features(feature={
                    "a": tf.train.Feature(float_list=tf.train.FloatList(value=row[:3])),
                    "b": tf.train.Feature(float_list=tf.train.FloatList(value=row[3:])),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
                }))
                w.write(ex.SerializeToString())
    return ["--train_data", directory / "train-*.tfrecord", "--epochs", EPOCHS, "--input_split", "queue"], x[:200], y[:200]


def write_idx(directory: Path):
    """A tiny MNIST look-alike: 8x8 images of a vertical bar, a horizontal bar or a dot."""
    rng = np.random.default_rng(3)
    n = 900
    y = rng.integers(0, 3, size=n).astype(np.uint8)
    img = rng.integers(0, 60, size=(n, 8, 8)).astype(np.uint8)
    for i, label in enumerate(y):
        k = rng.integers(1, 7)
        if label == 0:
            img[i, :, k] = 255
        elif label == 1:
            img[i, k, :] = 255
        else:
            img[i, k - 1:k + 1, k - 1:k + 1] = 255
    (directory / "train-images-idx3-ubyte").write_bytes(struct.pack(">IIII", 0x0803, n, 8, 8) + img.tobytes())
    (directory / "train-labels-idx1-ubyte").write_bytes(struct.pack(">II", 0x0801, n) + y.tobytes())
    x = img[:200].astype(np.float32)[..., None] / 255.0
    return ["--train_data", directory / "train-images-idx3-ubyte"], x, y[:200].astype(np.int64)


def demo_npz(directory: Path):
    from tfps.models import demo
    _, eval_glob = demo.demo_globs("cnn")
    with np.load(eval_glob) as z:
        x, y = z["x"][:200], z["y"][:200]
    return ["--model", "cnn"], x, y          # no --train_data: the demo images (NPZ)


#: name -> (the data's maker, what results.json's train_data ends with).
FORMATS = {"tfrecord": (write_tfrecord, ".tfrecord"), "npz-cnn": (demo_npz, ".npz"),
           "mnist-idx": (write_idx, "idx3-ubyte")}


@pytest.fixture(scope="module")
def jobs(module_procs, tmp_path_factory) -> dict:
    """The three jobs, started side by side: name -> (launcher, model_dir, held x, held y)."""
    out = {}
    for name, (make, _) in FORMATS.items():
        root = tmp_path_factory.mktemp(name)
        data = root / "data"
        data.mkdir()
        args, x, y = make(data)
        launcher = module_procs.tfps(f"tfps-local-{name}", "local", *run_flags(root / "model", *args, steps=STEPS))
        out[name] = (launcher, root / "model", x, y)
    return out


@pytest.mark.parametrize("name", list(FORMATS))
def test_short_job_on_each_format(name, jobs):
    launcher, model_dir, x, y = jobs[name]
    expect_fmt = FORMATS[name][1]
    ports = launcher_ports(launcher)
    assert launcher.wait(300) == 0, launcher.tail()
    res = read_results(model_dir)
    assert res["status"] == "succeeded"
    if name == "tfrecord":
        assert_each_worker_read_its_data_epochs_times(launcher, res)
    else:
        assert res["global_step"] >= STEPS and "ended_by" not in res
    assert res["export_complete"] is True
    assert expect_fmt in res["train_data"], res["train_data"]
    out = load_and_predict(res["export_dir"], x)
    assert out["probabilities"].shape == (len(x), 3)
    np.testing.assert_allclose(out["probabilities"].sum(axis=1), 1.0, atol=1e-5)
    assert (out["classes"] == y).mean() > 0.6      # easy data, 3 classes: chance is 0.33
    assert_nothing_left(ports, launcher)


def assert_each_worker_read_its_data_epochs_times(launcher, res):
    """--epochs through the slice queue (--input_split queue): the job read every record EPOCHS times,
    each once per pass (counted through the model, in the checkpoint), whichever worker took
    which slice, and ended by it; the chief's final save came after the last slice was done.

    Only what one process says in order, or what the chief recorded, is compared: the order
    in which two tasks' lines reach the launcher's output (each task has its own pipe and
    reader), or in which the ps hears their "done" tokens, is not the job's to promise."""
    total = 2 * RECORDS_PER_WORKER * EPOCHS
    assert res["stream"]["examples"] == total, res["stream"]
    assert res["stream"]["position"] == res["stream"]["total"], res["stream"]
    # each slice is batched on its own: at least the steps of full batches, fewer than STEPS
    assert -(-total // BATCH) <= res["global_step"] < STEPS
    assert res["ended_by"] == "epochs"
    out = launcher.output()
    chief = [line for line in out.splitlines() if line.startswith("[worker0] ")]
    said = [next((i for i, line in enumerate(chief) if words in line), None)
            for words in ("the slice queue is closed", "chief: exported the SavedModel")]
    assert None not in said and said == sorted(said), said
    heard = re.findall(r"\[ps0\] .* ps0: worker (\d) is done \((\d)/2\)", out)
    assert sorted(heard) == [("0", "1"), ("1", "2")] or sorted(heard) == [("0", "2"), ("1", "1")], heard
    assert f"after its {EPOCHS} epoch(s)" in out
