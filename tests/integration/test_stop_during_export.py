"""Ctrl-C on ``tfps local`` while training a model whose export takes longer than 10 s.

10 s is Docker's default stop grace: an orchestrator using it would SIGKILL the chief in
the middle of this export. tfps waits for the final save instead, and the ps (which holds
the variables) stays up until the chief has finished it.
"""

from __future__ import annotations

import signal
import time

import pytest
from integration_helpers import (
    assert_nothing_left,
    launcher_ports,
    load_and_predict,
    read_history,
    read_results,
    run_flags,
    task_exit,
)

pytestmark = pytest.mark.integration

EXPORT_SLEEP = 12.0   # tests/fixtures/slow_model.py


def test_ctrl_c_waits_for_a_slow_final_export(procs, tmp_path):
    model_dir = tmp_path / "model"
    launcher = procs.tfps("tfps-local-slow-export", "local",
                          *run_flags(model_dir, "--model", "tests.fixtures.slow_model:model_fn", steps=1_000_000))
    ports = launcher_ports(launcher)
    end = time.monotonic() + 120
    while not read_history(model_dir):
        assert launcher.returncode is None, launcher.tail()
        assert time.monotonic() < end, f"no training progress:\n{launcher.tail()}"
        time.sleep(0.2)

    launcher.signal(signal.SIGINT)            # what Ctrl-C in a terminal sends
    stopped_at = time.monotonic()
    rc = launcher.wait(300)
    took = time.monotonic() - stopped_at

    assert rc == 130, launcher.tail()         # ExitCode.STOPPED
    res = read_results(model_dir)
    assert res["status"] == "stopped"
    assert res["exit_code"] == 130
    assert 0 < res["global_step"] < 1_000_000
    assert res["export_complete"] is True
    assert res["times"]["final_save_s"] > 10
    assert took > EXPORT_SLEEP
    out = load_and_predict(res["export_dir"], [[0.0] * 8])
    assert out["probabilities"].shape == (1, 3)

    # The ps outlived the chief's export and then left on its own.
    assert task_exit(launcher, "ps0") == "0 (OK)"
    assert "ending tasks that did not exit by themselves" not in launcher.output()
    lines = launcher.output().splitlines()
    exported = next(i for i, l in enumerate(lines) if l.startswith("[worker0]") and "exported the SavedModel" in l)
    ps_done = next(i for i, l in enumerate(lines) if l.startswith("[ps0]") and "every worker is done" in l)
    assert exported < ps_done
    assert_nothing_left(ports, launcher)
