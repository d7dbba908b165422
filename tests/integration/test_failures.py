"""Jobs that fail: a model whose loss turns NaN, one that raises, one that cannot be imported."""

from __future__ import annotations

import time

import pytest
from integration_helpers import assert_nothing_left, base_env, launcher_ports, read_results, run_flags, task_exit

pytestmark = pytest.mark.integration


def test_nan_loss_fails_the_job_and_stops_every_task(procs, tmp_path):
    model_dir = tmp_path / "model"
    launcher = procs.tfps("tfps-local-nan", "local",
                          *run_flags(model_dir, "--model", "tests.fixtures.bad_models:nan_loss", steps=200))
    ports = launcher_ports(launcher)
    assert launcher.wait(300) == 1, launcher.tail()          # ExitCode.TRAINING_FAILED
    res = read_results(model_dir)
    assert res["status"] == "failed"
    assert res["exit_code"] == 1
    assert res["error"]["type"] == "FloatingPointError"
    msg = res["error"]["message"].lower()
    assert "nan" in msg and "diverged" in msg, msg
    assert res["export_complete"] is False                   # no SavedModel of a diverged model
    assert task_exit(launcher, "ps0") == "0 (OK)"
    assert "ending tasks that did not exit by themselves" not in launcher.output()
    assert_nothing_left(ports, launcher)


def test_model_raising_in_train_mode_is_refused_before_start(procs, tmp_path):
    """The launcher's memory estimate builds the training graph: a model that raises there
    would fail every task the same way, so the job is refused in one line (issue 35, item 20)."""
    model_dir = tmp_path / "model"
    launcher = procs.tfps("tfps-local-raises", "local",
                          *run_flags(model_dir, "--model", "tests.fixtures.bad_models:raises_in_train", steps=200),
                          separate_stderr=True, env=base_env(TF_ENABLE_ONEDNN_OPTS="1"))   # the banner of AMD EPYC
    assert launcher.wait(300) == 2, launcher.tail()          # ExitCode.BAD_CONFIG
    err = [line for line in launcher.stderr().strip().splitlines() if "error" in line]
    assert len(err) == 1, err
    assert err[0].startswith("tfps: error: model: tests.fixtures.bad_models:raises_in_train raised RuntimeError"), err
    assert "refuses to build its training graph" in err[0]
    assert "[ps0]" not in launcher.output() and "ps + " not in launcher.output()   # no task started
    assert not (model_dir / "results.json").exists()


def test_model_import_error_starts_nothing(procs, tmp_path):
    model_dir = tmp_path / "model"
    t0 = time.monotonic()
    launcher = procs.tfps("tfps-local-bad-import", "local", "--model", "tests.fixtures.bad_import:model_fn",
                          "--model_dir", model_dir, separate_stderr=True)
    rc = launcher.wait(60)
    took = time.monotonic() - t0
    assert rc == 2, launcher.tail()                          # ExitCode.BAD_CONFIG
    err = launcher.stderr().strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("tfps: error: model: cannot import 'tests.fixtures.bad_import'")
    assert "tfps_test_no_such_dependency" in err[0]
    assert took < 20, f"refusing a bad model took {took:.1f} s"
    # Nothing was started and nothing was written.
    assert list(launcher.family) == [launcher.pid], launcher.family
    assert "tfps local:" not in launcher.output() and "[ps0]" not in launcher.output()
    assert not model_dir.exists()
