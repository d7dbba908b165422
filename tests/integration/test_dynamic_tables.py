"""Dynamic embedding tables (tfps.layers.DynamicEmbedding) under ``tfps local --ps 2 --workers 2``.

One string-id job (``wide_deep --embedding dynamic`` on the demo CTR data) is shared by the
tests of this module: its export ranks the held-out clicks like the collision-free
reference (the same wide & deep with a StringLookup over the whole vocabulary, model.fit in
one process); then the job goes on from its model_dir on 3 ps, with a smaller set of users,
``--steps_to_live`` and ``--min_count 2`` (the first job saved no admission counts): the restore brings back exactly the saved keys, split over the
three ps, the ids that stopped appearing are evicted and the live rows fall. A tf_keras
model with int64 ids of the whole int64 range in one DynamicEmbedding trains and serves.
"""

from __future__ import annotations

import collections
import csv
import math
import re

import docblocks
import pytest
from integration_helpers import read_results, run_flags

from tests.fixtures.ctr_fit import export_auc as keras_export_auc
from tests.fixtures.dynamic_reference import export_auc

pytestmark = pytest.mark.integration

BATCH = 250
STEPS = 480          # two epochs of the demo's 60000 training rows, as the reference trains
MORE_STEPS = 240     # the continuation on 3 ps
STEPS_TO_LIVE = 60
MIN_COUNT = 2        # the continuation's (the first job's is 1)
#: Adagrad: its updates are sparse in Keras's model.fit as in tfps (Keras's Adam would move
#: every row every step, tfps's lazy Adam only the batch's), so the reference is the same algorithm.
OPTIMIZER, LEARNING_RATE = "adagrad", 0.5
TABLE_LINE = re.compile(r"table embeddings: live (\d+) \(([^)]*)\)( at the session's start)?, "
                        r"\+(\d+) admitted, -(\d+) evicted")


def _saved_keys(model_dir) -> int:
    import tensorflow as tf
    return int(tf.train.load_checkpoint(tf.train.latest_checkpoint(str(model_dir)))
               .get_variable_to_shape_map()["embeddings/keys"][0])


def _saved_names(model_dir) -> set:
    import tensorflow as tf
    return set(tf.train.load_checkpoint(tf.train.latest_checkpoint(str(model_dir))).get_variable_to_shape_map())


def _checkpoint_bytes(model_dir) -> int:
    import glob
    import os

    import tensorflow as tf
    path = tf.train.latest_checkpoint(str(model_dir))
    return sum(os.path.getsize(f) for f in glob.glob(path + ".data-*"))


@pytest.fixture(scope="module")
def jobs(module_procs, tmp_path_factory, demo_dir):
    """The string-id job on 2 ps, its export's AUC, then its continuation on 3 ps."""
    tmp = tmp_path_factory.mktemp("dynamic")
    model_dir, ctr = tmp / "model", demo_dir / "ctr"
    # The continuation's data: the rows of the 50 most frequent users only (the other
    # users' ids stop appearing).
    rows = [r for f in sorted(ctr.glob("train-*.csv")) for r in csv.DictReader(open(f, newline=""))]
    top = {u for u, _ in collections.Counter(r["user"] for r in rows).most_common(50)}
    with open(tmp / "top-users.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, list(rows[0]))
        w.writeheader()
        w.writerows(r for r in rows if r["user"] in top)
    flags = ["--model", "wide_deep", "--embedding", "dynamic", "--expected_ids", 20000, "--batch_size", BATCH,
             "--optimizer", OPTIMIZER, "--learning_rate", LEARNING_RATE]
    # The first job is the CTR tutorial's (docs/tutorials/ctr.md), on this session's demo data
    # (written by the same code as its `tfps demo-data data/`), with this test's settings after it.
    tutorial = docblocks.commands("tutorials/ctr.md", "tests/integration/test_dynamic_tables.py",
                                  paths={"data/": demo_dir})
    assert [argv[:2] for argv in tutorial] == [["tfps", "demo-data"], ["tfps", "local"]], tutorial
    command = tutorial[1][2:]
    assert [command[command.index(f) + 1] for f in ("--model", "--embedding", "--expected_ids", "--train_data",
                                                     "--eval_data")] == \
        ["wide_deep", "dynamic", "20000", str(ctr / "train-*.csv"), str(ctr / "eval.csv")], command
    # The reference (model.fit in one process) trains beside the first job.
    reference = module_procs.start("dynamic-reference", _reference_argv(ctr), separate_stderr=True)
    first = module_procs.tfps("tfps-local-dynamic-2ps", "local", *command,
                              *run_flags(model_dir, "--batch_size", BATCH, "--optimizer", OPTIMIZER,
                                         "--learning_rate", LEARNING_RATE, steps=STEPS))
    assert first.wait(900) == 0, first.tail()
    out = {"first": first, "first_results": read_results(model_dir), "saved_keys": _saved_keys(model_dir),
           "first_bytes": _checkpoint_bytes(model_dir),
           "export_auc": export_auc(str(model_dir / "export"), str(ctr / "eval.csv")),
           "price_auc": _price_auc(ctr / "eval.csv"), "reference": reference}
    # Another ps count, other data, an eviction age and an admission count are other settings:
    # --replace. (The first job saved no admission counts, with min_count 1: they restore as zeros.)
    again = module_procs.tfps("tfps-local-dynamic-3ps", "local", "--ps", 3, "--workers", 2, "--replace",
                              *run_flags(model_dir, *flags, "--train_data", tmp / "top-users.csv",
                                         "--steps_to_live", STEPS_TO_LIVE, "--min_count", MIN_COUNT,
                                         steps=STEPS + MORE_STEPS))
    assert again.wait(900) == 0, again.tail()
    out.update(again=again, again_results=read_results(model_dir), again_keys=_saved_keys(model_dir),
               again_bytes=_checkpoint_bytes(model_dir), model_dir=model_dir, top_users=tmp / "top-users.csv",
               again_has_sketch="embeddings/sketch" in _saved_names(model_dir))
    return out


def test_string_ids_train_and_the_export_ranks_like_model_fit_over_the_whole_vocabulary(jobs, demo_dir):
    res = jobs["first_results"]
    assert res["status"] == "succeeded" and res["export_complete"], res.get("error")
    lines = jobs["first"].lines(TABLE_LINE.pattern)
    assert lines and int(lines[-1].group(1)) > 1000, jobs["first"].tail()     # every id its row, on both ps
    assert all(int(n.split()[-1]) > 0 for n in lines[-1].group(2).split(", "))
    reference = _reference_auc(jobs["reference"])
    assert reference > jobs["price_auc"] + 0.04, (reference, jobs["price_auc"])   # the ids carry signal
    assert abs(jobs["export_auc"] - reference) < 0.02, (jobs["export_auc"], reference)
    assert abs(res["eval_metrics"]["auc"] - jobs["export_auc"]) < 0.005, res["eval_metrics"]


def _price_auc(eval_csv) -> float:
    from tests.fixtures.ctr_fit import read_columns
    from tfps.task.output.export import auc
    x, y = read_columns(str(eval_csv))
    return auc(-x["price"].reshape(-1), y)


def _reference_argv(ctr) -> list[str]:
    """The same wide & deep with a StringLookup over the whole vocabulary, fitted by model.fit
    in one process on as many examples (tests/fixtures/dynamic_reference.py)."""
    import sys
    return [sys.executable, "-m", "tests.fixtures.dynamic_reference", str(ctr / "train-*.csv"), str(ctr / "eval.csv"),
            str(STEPS * BATCH), str(BATCH), OPTIMIZER, str(LEARNING_RATE)]


def _reference_auc(reference) -> float:
    import json
    assert reference.wait(900) == 0, reference.stderr()[-3000:]
    return json.loads(reference.output().strip().splitlines()[-1])["auc"]


def test_a_continuation_on_3_ps_restores_exactly_the_saved_keys_and_keeps_training(jobs):
    again, res = jobs["again"], jobs["again_results"]
    assert res["status"] == "succeeded" and res["global_step"] >= STEPS + MORE_STEPS, res.get("error")
    # Two async workers may end the first job a step or two past STEPS: its final checkpoint's step.
    saved = jobs["first_results"]["global_step"]
    assert STEPS <= saved < STEPS + 2, jobs["first_results"]
    assert again.lines(rf"restored checkpoint of step {saved}\b"), again.tail()
    start = [m for m in again.lines(TABLE_LINE.pattern) if m.group(3)]
    assert start, again.tail()
    live, per_ps = int(start[0].group(1)), start[0].group(2).split(", ")
    assert live == jobs["saved_keys"], (live, jobs["saved_keys"])              # exactly the saved keys
    assert [p.split()[0] for p in per_ps] == ["ps0", "ps1", "ps2"] and all(int(p.split()[1]) > 0 for p in per_ps)
    losses = [float(m.group(1)) for m in again.lines(r"step \d+/\d+ loss ([\d.]+)")]
    assert losses and all(math.isfinite(x) for x in losses), again.tail()
    # The job now runs with the continuation's settings, and its checkpoint holds the admission counts.
    import json
    record = json.loads((jobs["model_dir"] / "tfps-settings.json").read_text())["settings"]
    assert (record["ps"], record["min_count"], record["steps_to_live"]) == (3, MIN_COUNT, STEPS_TO_LIVE), record
    assert jobs["again_has_sketch"]


def test_ids_that_stop_appearing_are_evicted_and_the_live_rows_fall(jobs):
    """What the continuation keeps, not how far its table fell by some step: the evictions run
    in the chief's thread at the pace of the steps, so a bound on the live rows at the last
    line (once 0.6 x the saved keys) depends on the machine (2706 of 4272 on AMD EPYC, where
    the other users' ids are about 0.37 of the table). Every id of the other users was last
    seen in the first job (step 480) and the continuation runs 240 steps with
    --steps_to_live 60: its final checkpoint holds ids of the continuation's data only."""
    again = jobs["again"]
    start = [int(m.group(1)) for m in again.lines(TABLE_LINE.pattern) if m.group(3)]
    lines = [m for m in again.lines(TABLE_LINE.pattern) if not m.group(3)]
    assert sum(int(m.group(5)) for m in lines) > 0, again.tail()
    assert start and int(lines[-1].group(1)) < start[0], (start, [m.group(0) for m in lines])   # no admissions
    kept = _checkpoint_keys(jobs["model_dir"])
    assert len(kept) == jobs["again_keys"] < jobs["saved_keys"], (len(kept), jobs["saved_keys"])
    foreign = kept - _data_keys(jobs["top_users"])
    assert not foreign, f"{len(foreign)} of {len(kept)} kept ids never appear in the continuation's data"
    # Checkpoints hold the live rows only: the last one is smaller than the first job's, but for
    # the admission counts it saves with min_count 2 (one int32 sketch, 1 MiB).
    from tfps.layers.dynamic_embedding import SKETCH_DEPTH, SKETCH_WIDTH
    sketch = SKETCH_DEPTH * SKETCH_WIDTH * 4
    assert jobs["again_bytes"] - sketch < jobs["first_bytes"], (jobs["again_bytes"], jobs["first_bytes"])


def _checkpoint_keys(model_dir) -> set[int]:
    import tensorflow as tf
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(model_dir)))
    return {int(k) for k in reader.get_tensor("embeddings/keys").reshape(-1)}


def _data_keys(path) -> set[int]:
    """The keys the table gives the ids of a CSV file (tfps.models._dynamic_ids: the 64-bit
    fingerprint of ``column=value``), for every column: a superset of the id columns'."""
    import tensorflow as tf

    from tfps.layers.dynamic_embedding import fingerprint64
    with open(path, newline="") as fh:
        ids = sorted({f"{c}={v}" for row in csv.DictReader(fh) for c, v in row.items()})
    return {int(k) for k in fingerprint64(tf.constant(ids)).numpy()}


def test_int64_ids_of_the_whole_range_train_and_serve(procs, tmp_path, demo_dir):
    model_dir, ctr = tmp_path / "model", demo_dir / "ctr"
    # 2 ps + 2 workers, as the string ids' job: two workers' updates to new int64 ids at once.
    launcher = procs.tfps("tfps-local-dynamic-int64", "local", "--ps", 2, "--workers", 2,
                          *run_flags(model_dir, "--model", "tests.fixtures.dynamic_models:int_ids",
                                     "--batch_size", BATCH, "--train_data", ctr / "train-*.csv", steps=200))
    assert launcher.wait(900) == 0, launcher.tail()
    res = read_results(model_dir)
    assert res["status"] == "succeeded" and res["export_complete"], res.get("error")
    assert launcher.lines(r"table ids: live \d+ \(ps0 [1-9]\d*, ps1 [1-9]\d*\)")
    model_auc, price_auc = keras_export_auc(str(model_dir / "export"), str(ctr / "eval.csv"))
    assert model_auc > price_auc + 0.08, (model_auc, price_auc)
