"""Synchronous jobs through ``tfps local``, under both flag spellings.

``--sync_replicas`` trains the built-in wide_deep (embeddings: sparse gradients, whose
accumulators a loop of steps cannot take, so one sync step per run); ``--issync`` (the seed
scripts' name for the same flag) trains the documented user model
``examples.custom_model:model_fn`` (dense gradients: several sync steps per run). The
built-in MLP's sync jobs are those of tests/integration/test_faults.py. The two jobs run side by
side.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from integration_helpers import (
    FinishedJob,
    assert_nothing_left,
    launcher_ports,
    load_and_predict,
    load_csv,
    run_flags,
    task_exit,
)

pytestmark = pytest.mark.integration

STEPS = 200


@dataclasses.dataclass
class Job(FinishedJob):
    flag: str = ""
    model: str = ""


KINDS = [("--sync_replicas", "wide_deep"), ("--issync", "examples.custom_model:model_fn")]


@pytest.fixture(scope="module")
def started(module_procs, tmp_path_factory) -> dict:
    """Both jobs, started side by side: flag -> (launcher, model_dir)."""
    out = {}
    for flag, model in KINDS:
        model_dir = tmp_path_factory.mktemp("sync") / "model"
        out[flag] = (module_procs.tfps(f"tfps-local-{flag.strip('-')}", "local",
                                       *run_flags(model_dir, flag, "--model", model, steps=STEPS)), model_dir)
    return out


@pytest.fixture(scope="module", params=KINDS, ids=["sync_replicas-wide_deep", "issync-custom_model"])
def job(request, started) -> Job:
    flag, model = request.param
    proc, model_dir = started[flag]
    ports = launcher_ports(proc)
    rc = proc.wait(300)
    return Job(proc, model_dir, ports, rc, flag=flag, model=model)


def test_sync_job_succeeds(job):
    assert job.rc == 0, job.proc.tail()
    res = job.results
    assert res["status"] == "succeeded"
    assert res["mode"] == "sync"            # the flag (either spelling) took effect
    assert res["model"] == job.model
    assert res["global_step"] >= STEPS
    assert res["export_complete"] is True
    # Progressive validation in both sync steps (one per run, and several in a loop).
    assert res["progressive"]["examples"] > 0 and "log_loss" in res["progressive"], res.get("progressive")
    if job.model == "wide_deep":
        # Sparse gradients: SyncAggregation's own step, one per run; and it learned (chance is 0.5).
        for worker in ("worker0", "worker1"):
            assert job.proc.lines(rf"{worker}: sync: one step per run \(sparse gradients: .*embeddings"), \
                job.proc.tail()
        assert res["eval_metrics"]["auc"] > 0.55, res["eval_metrics"]
    else:
        assert not job.proc.lines(r"sync: one step per run"), job.proc.tail()
        assert res["eval_metrics"]["accuracy"] > 0.8, res["eval_metrics"]


def test_sync_export_loads_and_predicts(job, demo_dir):
    from tfps.models import demo
    if job.model == "wide_deep":
        _wide_deep_export_ranks_the_clicks(job, demo.demo_globs("wide_deep", str(demo_dir))[1])
        return
    x, y = load_csv(demo.demo_globs("mlp", str(demo_dir))[1])
    out = load_and_predict(job.results["export_dir"], x)
    assert out["probabilities"].shape == (len(x), 3)
    np.testing.assert_allclose(out["probabilities"].sum(axis=1), 1.0, atol=1e-5)
    assert (out["classes"] == y).mean() > 0.8
    # Dropout (custom model) is for training only: serving gives the same answer twice.
    again = load_and_predict(job.results["export_dir"], x[:50])
    np.testing.assert_allclose(again["probabilities"], out["probabilities"][:50], rtol=1e-5, atol=1e-6)


def test_sync_ps_exits_by_itself(job):
    assert task_exit(job.proc, "ps0") == "0 (OK)"
    assert task_exit(job.proc, "worker1") == "0 (OK)"
    assert "ending tasks that did not exit by themselves" not in job.proc.output()
    assert_nothing_left(job.ports, job.proc)


def _wide_deep_export_ranks_the_clicks(job, eval_csv: str) -> None:
    """The export takes the CSV's raw columns by name, the ids as strings, and ranks the
    held-out clicks as the chief's evaluation did."""
    import csv

    import tensorflow as tf

    from tfps.task.output.export import auc
    with open(eval_csv, newline="") as fh:
        rows = list(csv.DictReader(fh))
    serve = tf.saved_model.load(job.results["export_dir"]).signatures["serving_default"]
    inputs = {k: tf.constant([r[k] for r in rows]) for k in ("user", "ad", "site")}
    inputs["price"] = tf.constant([float(r["price"]) for r in rows], tf.float32)
    probs = serve(**inputs)["probability"].numpy().reshape(-1)
    assert ((probs >= 0) & (probs <= 1)).all()
    ranked = auc(probs, np.array([int(r["label"]) for r in rows]))
    assert abs(ranked - job.results["eval_metrics"]["auc"]) < 0.005, (ranked, job.results["eval_metrics"])
    # Serving is deterministic: the same input gives the same answer twice.
    again = serve(**{k: v[:50] for k, v in inputs.items()})["probability"].numpy().reshape(-1)
    np.testing.assert_allclose(again, probs[:50], rtol=1e-5, atol=1e-6)
