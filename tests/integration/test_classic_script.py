"""``tfps local --script``: a user's classic TF1 script whose ps blocks in server.join()."""

from __future__ import annotations

import json

import pytest
from integration_helpers import REPO, assert_nothing_left, launcher_ports, task_exit

pytestmark = pytest.mark.integration

STEPS = 200


def test_classic_script_runs_and_its_ps_is_ended(procs, tmp_path):
    marker = tmp_path / "chief_done.json"
    launcher = procs.tfps("tfps-local-script", "local", "--script", REPO / "tests/fixtures/classic_replica.py",
                          "--model_dir", tmp_path / "model",
                          "--", "--train_steps", STEPS, "--marker", marker)
    ports = launcher_ports(launcher)
    rc = launcher.wait(300)
    assert rc == 0, launcher.tail()
    done = json.loads(marker.read_text())
    assert done["global_step"] >= STEPS - 1
    # The classic ps never returns from server.join(): the launcher had to end it.
    assert task_exit(launcher, "worker0") == "0 (OK)"
    assert task_exit(launcher, "ps0").startswith("signal SIG"), task_exit(launcher, "ps0")
    assert_nothing_left(ports, launcher)
