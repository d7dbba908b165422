"""A disk that fills while the chief saves (issue 35, item 9), on a real full file system.

A tmpfs is mounted as model_dir's disk, sized so that the chief's first checkpoint fits and
the next does not: the mlp with ``--hidden_units 1024,3072`` has about 36 MiB of variables
with Adam's slots, and the tmpfs has 68 MiB (tfps wants 64 MiB free before it starts). The
second save then fails with ENOSPC in SaveV2: a periodic one (``--checkpoint_steps``) or the
final one as the session closes. Either way the job fails with exit 1 and one line naming
the disk, what it was writing and its size; results.json is written (the failed save's
temporary file is removed first), nothing temporary is left, and one message is sent.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest
from integration_helpers import assert_nothing_left, base_env, launcher_ports, read_results, run_flags

pytestmark = pytest.mark.integration

TMPFS_MIB = 68


@pytest.fixture
def small_disk(tmp_path):
    """A 68 MiB tmpfs, unmounted (lazily) whatever the test's end."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_MIB}m", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs (the tests run as root): {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.mark.parametrize("which", ["periodic", "final"])
def test_a_disk_that_fills_during_a_save_fails_the_job_with_one_line(which, procs, small_disk, smtp_server):
    model_dir = small_disk / "model"
    # periodic: the save at step 30 fails; final: no periodic save, the session's last one fails.
    steps, every = (300, 30) if which == "periodic" else (60, 1000)
    launcher = procs.tfps(f"tfps-local-disk-full-{which}", "local",
                          *run_flags(model_dir, "--hidden_units", "1024,3072", "--checkpoint_steps", every,
                                     steps=steps),
                          env=base_env(APPRISE_URLS=smtp_server.url()))
    ports = launcher_ports(launcher)
    rc = launcher.wait(240)
    out = launcher.output()
    assert rc == 1, launcher.tail()                        # ExitCode.TRAINING_FAILED, never 70
    assert "Traceback" not in out, launcher.tail(120)
    errors = [ln for ln in out.splitlines() if re.search(r"\d\d:\d\d:\d\d E ", ln) and "is full" in ln]
    assert len(errors) == 1, errors
    line = errors[0]
    assert f"the disk of {model_dir} is full (" in line and " free of 68.0 MiB)" in line, line
    m = re.search(r"while writing the checkpoint of step (\d+), which needs about ([\d.]+) MiB: "
                  r"free space there or give --model_dir on a larger disk", line)
    assert m, line
    assert 30 <= float(m.group(2)) <= 45, line           # the first checkpoint's size (about 36 MiB)
    if which == "periodic":
        assert every <= int(m.group(1)) < steps, line   # not the first save, not the last
    else:
        assert int(m.group(1)) >= steps, line           # the final save, as the session closed
    res = read_results(model_dir)
    assert res["status"] == "failed" and res["exit_code"] == 1
    assert res["error"]["type"] == "DiskFull"
    assert res["error"]["message"] in line
    assert res["export_dir"] is None
    left = [n for n in os.listdir(model_dir) if "tempstate" in n or "_temp" in n or n.startswith(".tmp-")]
    assert not left, left
    # The launcher has exited, and every task with it: the messages are all there is (the
    # server records one before it answers the sender).
    mails = smtp_server.wait_for(1, timeout=30)
    assert len(smtp_server.received()) == 1, [msg["Subject"] for msg in smtp_server.received()]
    assert "failed" in mails[0]["Subject"].lower()
    assert_nothing_left(ports, launcher)
