"""Issue 35 #10: a model_dir named with glob characters (``exp[lr=0.01]``) trains, exports and
resumes. TensorFlow globs checkpoint paths; before, the job ended with "no checkpoint was
written" although model.ckpt-N existed, and nothing was exported. Two tiny jobs (1 ps, 1 worker)."""

from __future__ import annotations

import json

import pytest
from integration_helpers import read_results, run_flags

pytestmark = pytest.mark.integration


def test_a_model_dir_named_with_brackets_exports_and_resumes(procs, tmp_path):
    model_dir = tmp_path / "exp[lr=0.01]"
    first = procs.tfps("tfps-local-glob-1", "local", "--ps", "1", "--workers", "1", *run_flags(model_dir, steps=20))
    assert first.wait(240) == 0, first.tail()
    res = read_results(model_dir)
    assert res["status"] == "succeeded" and res["export_complete"] is True, res.get("error")
    assert res["checkpoint"] == str(model_dir / "model.ckpt-20")
    (model_dir / "export" / "notes.txt").write_text("kept")   # issue 35 #4, on the way
    second = procs.tfps("tfps-local-glob-2", "local", "--ps", "1", "--workers", "1", "--replace",
                        *run_flags(model_dir, steps=30))
    assert second.wait(240) == 0, second.tail()
    assert f"restored checkpoint of step 20 from {model_dir / 'model.ckpt-20'}" in second.output()
    res = read_results(model_dir)
    assert res["status"] == "succeeded" and res["global_step"] >= 30 and res["export_complete"] is True
    assert json.loads((model_dir / "export" / "tfps_export.json").read_text())["global_step"] >= 30
    assert (model_dir / "export" / "notes.txt").read_text() == "kept"
