"""Resharding (issue 37): a job saved from 2 ps tasks goes on with 3 from the same model_dir.

``wide_deep`` on the demo CTR data, its two id tables above ``--partition_mb`` (split
row-wise over every ps), trains 40 steps on 2 ps tasks. Two copies of its model_dir then go
on to step 60: one on 2 ps tasks, one on 3. The checkpoint holds each partitioned variable
whole (tfps.task.graph.placement), so the 3-ps job reads back exactly the rows saved from 2, and
both continuations end with the same tables and the same export. One worker each, so both
runs take the same steps on the same batches; Adagrad updates only the rows of a batch's ids,
so the rows the continuation never touched must still hold the saved values, bit for bit.
Three jobs for the module, the two continuations side by side (about 60 s).
"""

from __future__ import annotations

import csv
import shutil

import docblocks
import numpy as np
import pytest
from integration_helpers import FinishedJob, launcher_ports, run_flags

pytestmark = pytest.mark.integration

FIRST, MORE = 40, 60
TABLES = ("embeddings", "wide_weights", "embeddings/Adagrad")
FLAGS = ("--model", "wide_deep", "--hash_buckets", 65536, "--partition_mb", 1, "--optimizer", "adagrad",
         "--learning_rate", 0.1, "--workers", 1)


@pytest.fixture(scope="module")
def jobs(module_procs, tmp_path_factory, demo_dir) -> dict[str, FinishedJob]:
    root = tmp_path_factory.mktemp("resharding")
    ctr = demo_dir / "ctr"
    data = ("--eval_data", ctr / "eval.csv")
    # The how-to's two commands (docs/how-to/resharding.md): on 2 ps, then on 3 from the same
    # model_dir; this test's model_dirs, tables, steps and one worker after their arguments.
    page = docblocks.commands("how-to/resharding.md", "tests/integration/test_resharding.py", paths={"data/": demo_dir})
    assert [argv[:4] for argv in page] == [["tfps", "local", "--ps", "2"], ["tfps", "local", "--ps", "3"]], page
    assert page[0][4:] == page[1][4:], page   # another --ps, nothing else
    on = {2: page[0][2:], 3: page[1][2:]}
    first = module_procs.tfps("tfps-reshard-2ps", "local", *on[2],
                              *run_flags(root / "saved", *FLAGS, *data, steps=FIRST))
    assert first.wait(600) == 0, first.tail()
    out = {"saved": FinishedJob(first, root / "saved", [], 0)}
    started = {}
    for name, ps in (("on2", 2), ("on3", 3)):
        shutil.copytree(root / "saved", root / name)
        # More steps are another setting (--replace); another --ps count alone would need none.
        started[name] = module_procs.tfps(f"tfps-reshard-{name}", "local", *on[ps], "--replace",
                                          *run_flags(root / name, *FLAGS, *data, steps=MORE))
    for name, proc in started.items():
        ports = launcher_ports(proc)
        out[name] = FinishedJob(proc, root / name, ports, proc.wait(600))
        assert out[name].rc == 0, proc.tail()
    return out


def tables(model_dir, step: int) -> dict[str, np.ndarray]:
    import tensorflow as tf
    reader = tf.train.load_checkpoint(str(model_dir / f"model.ckpt-{step}"))
    return {name: reader.get_tensor(name) for name in TABLES}


def test_the_3_ps_job_restores_exactly_the_rows_saved_from_2_and_trains_on(jobs):
    on3 = jobs["on3"]
    assert on3.proc.lines(r"saved from 2 ps task\(s\) and goes on with 3: .* split again over the 3"), on3.proc.tail()
    restored = on3.proc.lines(r"restored checkpoint of step (\d+)")
    assert restored and int(restored[0].group(1)) == FIRST, on3.proc.tail()
    res = on3.results
    assert res["status"] == "succeeded" and res["global_step"] == MORE and np.isfinite(res["final_loss"])
    assert sorted(res["ps_shares_mb"]) == ["ps0", "ps1", "ps2"]
    assert sorted(jobs["on2"].results["ps_shares_mb"]) == ["ps0", "ps1"]
    saved, after = tables(jobs["saved"].model_dir, FIRST), tables(on3.model_dir, MORE)
    touched = np.any(saved["embeddings"] != after["embeddings"], axis=1)
    # Training went on (some rows moved), on the ids of 20 batches only: every other row of each
    # table and of its Adagrad accumulator is the saved one, exactly (a row read into another
    # ps's shard at another offset would differ).
    assert 0 < touched.sum() < 20 * 64 * 3, touched.sum()
    for name in TABLES:
        moved = np.any((saved[name] != after[name]).reshape(len(touched), -1), axis=1)
        assert not np.any(moved & ~touched), name
        np.testing.assert_array_equal(saved[name][~touched], after[name][~touched], err_msg=name)


def test_continuing_on_3_ps_gives_the_results_of_continuing_on_2(jobs, demo_dir):
    import tensorflow as tf
    on2, on3 = tables(jobs["on2"].model_dir, MORE), tables(jobs["on3"].model_dir, MORE)
    for name in TABLES:
        np.testing.assert_allclose(on3[name], on2[name], rtol=0, atol=1e-6, err_msg=name)
    with open(demo_dir / "ctr" / "eval.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))

    def scores(model_dir):
        serve = tf.saved_model.load(str(model_dir / "export")).signatures["serving_default"]
        return serve(**{c: tf.constant([r[c] for r in rows]) for c in ("user", "ad", "site")},
                     price=tf.constant([float(r["price"]) for r in rows], tf.float32))["probability"].numpy()

    np.testing.assert_allclose(scores(jobs["on3"].model_dir), scores(jobs["on2"].model_dir), rtol=0, atol=1e-5)
    auc2, auc3 = (jobs[n].results["eval_metrics"]["auc"] for n in ("on2", "on3"))
    assert abs(auc3 - auc2) < 0.01, (auc2, auc3)
