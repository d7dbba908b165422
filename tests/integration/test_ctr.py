"""A CTR model with string id columns, its embedding table split over two ps tasks.

The demo CTR data (``tfps demo-data``: user, ad and site ids as strings, a price, a click
label) trains a tf_keras model that hashes the ids into one shared ``Embedding`` under
``tfps local --ps 2 --workers 2``. The table is above ``--partition_mb``, so it is split
row-wise over both ps tasks and each ps holds half of the variables (results.json's
``ps_shares_mb``). The export takes the raw CSV columns by name, strings included, and
ranks the held-out clicks far better than a baseline that ignores the ids.
"""

from __future__ import annotations

import csv

import numpy as np
import pytest
from integration_helpers import assert_nothing_left, launcher_ports, read_results, run_flags

from tfps.task.export import auc

pytestmark = pytest.mark.integration


def test_string_ids_train_a_split_table_and_the_export_takes_raw_columns(procs, tmp_path, demo_dir):
    import tensorflow as tf
    model_dir = tmp_path / "model"
    ctr = demo_dir / "ctr"
    launcher = procs.tfps("tfps-local-ctr", "local", "--ps", 2, "--workers", 2,
                          *run_flags(model_dir, "--model", "tests.fixtures.ctr_models:build_model",
                                     "--train_data", ctr / "train-*.csv", "--eval_data", ctr / "eval.csv",
                                     "--batch_size", 256, "--partition_mb", 1, steps=1500))
    ports = launcher_ports(launcher)
    assert launcher.wait(600) == 0, launcher.tail()
    res = read_results(model_dir)
    assert res["status"] == "succeeded" and res["export_complete"], res.get("error")
    shares = res["ps_shares_mb"]
    assert set(shares) == {"ps0", "ps1"}
    # The 2**17 x 8 table (4 MiB, 12 MiB with Adam's slots) is split evenly over both ps.
    assert min(shares.values()) > 5.5 and max(shares.values()) / min(shares.values()) < 1.3, shares

    with open(ctr / "eval.csv") as fh:
        rows = list(csv.DictReader(fh))
    labels = np.array([int(r["label"]) for r in rows])
    serve = tf.saved_model.load(str(model_dir / "export")).signatures["serving_default"]
    inputs = {n: tf.constant([[r[n]] for r in rows]) for n in ("user", "ad", "site")}
    inputs["price"] = tf.constant([[float(r["price"])] for r in rows], tf.float32)
    out = serve(**inputs)
    probs = out["probability"].numpy()                       # the binary head: P(click)
    np.testing.assert_allclose(out["probabilities"].numpy()[:, 1], probs)
    model_auc = auc(probs, labels)
    baseline = auc(-np.array([float(r["price"]) for r in rows]), labels)   # what the price alone says
    assert model_auc > baseline + 0.05, (model_auc, baseline)
    assert_nothing_left(ports, launcher)


def test_a_job_resumed_with_more_ps_tasks_splits_the_table_from_the_checkpoint(procs, tmp_path, demo_dir):
    model_dir = tmp_path / "model"
    ctr = demo_dir / "ctr"
    flags = ["--model", "tests.fixtures.ctr_models:build_model", "--train_data", ctr / "train-*.csv",
             "--batch_size", 128, "--partition_mb", 1]
    first = procs.tfps("tfps-local-ctr-1ps", "local", "--ps", 1, "--workers", 2, *run_flags(model_dir, *flags, steps=200))
    assert first.wait(600) == 0, first.tail()
    assert set(read_results(model_dir)["ps_shares_mb"]) == {"ps0"}
    again = procs.tfps("tfps-local-ctr-2ps", "local", "--ps", 2, "--workers", 2, *run_flags(model_dir, *flags, steps=400))
    assert again.wait(600) == 0, again.tail()
    restored = again.lines(r"restored checkpoint of step (\d+)")
    assert restored and int(restored[0].group(1)) >= 200, again.tail()
    res = read_results(model_dir)
    assert res["status"] == "succeeded" and res["global_step"] >= 400
    shares = res["ps_shares_mb"]
    assert max(shares.values()) / min(shares.values()) < 1.3, shares


def test_wide_deep_learns_the_ids_of_a_csv_without_a_model(procs, tmp_path, demo_dir):
    """``--model wide_deep`` on the demo CTR data (its default data): a user with a CSV and no
    model gets one whose clicks rank well above what the price alone says."""
    import tensorflow as tf
    model_dir = tmp_path / "model"
    launcher = procs.tfps("tfps-local-wide-deep", "local", "--ps", 2, "--workers", 2,
                          *run_flags(model_dir, "--model", "wide_deep", "--hash_buckets", 65536,
                                     "--partition_mb", 1, "--batch_size", 256, steps=1500))
    ports = launcher_ports(launcher)
    assert launcher.wait(600) == 0, launcher.tail()
    res = read_results(model_dir)
    assert res["status"] == "succeeded" and res["export_complete"]
    shares = res["ps_shares_mb"]
    assert max(shares.values()) / min(shares.values()) < 1.3, shares
    with open(demo_dir / "ctr" / "eval.csv") as fh:
        rows = list(csv.DictReader(fh))
    labels = np.array([int(r["label"]) for r in rows])
    serve = tf.saved_model.load(str(model_dir / "export")).signatures["serving_default"]
    out = serve(user=tf.constant([r["user"] for r in rows]), ad=tf.constant([r["ad"] for r in rows]),
                site=tf.constant([r["site"] for r in rows]),
                price=tf.constant([float(r["price"]) for r in rows], tf.float32))
    model_auc = auc(out["probability"].numpy(), labels)
    baseline = auc(-np.array([float(r["price"]) for r in rows]), labels)
    assert model_auc > baseline + 0.08, (model_auc, baseline)
    # The chief's evaluation ranks the whole evaluation set the same way.
    assert abs(res["eval_metrics"]["auc"] - model_auc) < 0.005, res["eval_metrics"]
    assert_nothing_left(ports, launcher)
