"""Synchronous jobs (SyncReplicasOptimizer) through ``tfps local``, under both flag spellings.

``--sync_replicas`` trains the built-in MLP; ``--issync`` (the seed scripts' name for the
same flag) trains the documented user model ``examples.custom_model:model_fn``.
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
    read_results,
    run_flags,
    task_exit,
)

pytestmark = pytest.mark.integration

STEPS = 200


@dataclasses.dataclass
class Job(FinishedJob):
    flag: str = ""
    model: str = ""


@pytest.fixture(scope="module", params=[("--sync_replicas", "mlp"), ("--issync", "examples.custom_model:model_fn")],
                ids=["sync_replicas-mlp", "issync-custom_model"])
def job(request, module_procs, tmp_path_factory) -> Job:
    flag, model = request.param
    model_dir = tmp_path_factory.mktemp("sync") / "model"
    proc = module_procs.tfps(f"tfps-local-{flag.strip('-')}", "local",
                             *run_flags(model_dir, flag, "--model", model, steps=STEPS))
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
    assert res["eval_metrics"]["accuracy"] > 0.8, res["eval_metrics"]


def test_sync_export_loads_and_predicts(job, demo_dir):
    from tfps import demo
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


def test_sync_job_with_sparse_gradients_trains_one_step_per_run(procs, tmp_path):
    """The built-in wide_deep (embeddings: sparse gradients, whose accumulators a loop cannot
    take) trains in sync mode with SyncReplicasOptimizer's own step, one per run, and learns."""
    model_dir = tmp_path / "model"
    proc = procs.tfps("tfps-local-sparse-sync", "local", *run_flags(model_dir, "--sync_replicas", "--model",
                                                                     "wide_deep", steps=STEPS))
    assert proc.wait(300) == 0, proc.tail()
    for worker in ("worker0", "worker1"):
        assert proc.lines(rf"{worker}: sync: one step per run \(sparse gradients: .*embeddings"), proc.tail()
    res = read_results(model_dir)
    assert res["status"] == "succeeded" and res["mode"] == "sync" and res["global_step"] >= STEPS
    assert res["export_complete"] is True
    assert res["eval_metrics"]["auc"] > 0.55, res["eval_metrics"]   # it learned (chance is 0.5)
