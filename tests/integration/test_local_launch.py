"""How ``tfps local`` starts its tasks: forked from a launcher that has imported TensorFlow
once, or (``TFPS_LOCAL_FORK=0``) as new interpreters. Either way each task is its own
process, in its own session, under the launcher, showing its ``tfps run`` command line,
and the job trains to the end."""

from __future__ import annotations

import os
import re
import time

import pytest
from integration_helpers import _cmdline, _stat, assert_nothing_left, base_env, launcher_ports, run_flags

pytestmark = pytest.mark.integration


def _maps_tensorflow(pid: int) -> bool:
    with open(f"/proc/{pid}/maps") as fh:
        return "libtensorflow_framework" in fh.read()


def _tasks_of(launcher_pid: int, timeout: float) -> dict[str, int]:
    """The launcher's three task processes, by the job and index their command line shows."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = {}
        for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
            st = _stat(pid)
            if not st or st[1] != launcher_pid:
                continue
            cmd = _cmdline(pid)
            for name, flags in (("ps0", "--job_name=ps --task_index=0"), ("worker0", "--job_name=worker --task_index=0"),
                                ("worker1", "--job_name=worker --task_index=1")):
                if flags in cmd:
                    found[name] = pid
        if len(found) == 3:
            return found
        time.sleep(0.1)
    pytest.fail(f"the launcher {launcher_pid} did not show 3 tasks within {timeout} s")


@pytest.mark.parametrize("fork", [True, False], ids=["forked", "spawned"])
def test_each_task_is_its_own_process_and_the_job_trains(procs, tmp_path, fork):
    env = base_env()
    env["TFPS_LOCAL_FORK"] = "1" if fork else "0"
    proc = procs.tfps(f"tfps-local-{'fork' if fork else 'spawn'}", "local",
                      *run_flags(tmp_path / "model", steps=1500), env=env)
    ports = launcher_ports(proc)
    tasks = _tasks_of(proc.pid, 60)
    for name, pid in tasks.items():
        cmd = _cmdline(pid)
        assert " -m tfps run " in cmd and f"127.0.0.1:{ports[0]}" in cmd, (name, cmd)
        assert os.getsid(pid) == pid, f"{name} is not the leader of its own session"
    # The launcher imported TensorFlow for its forked tasks, and only then.
    assert _maps_tensorflow(proc.pid) is fork
    assert len(set(tasks.values())) == 3
    assert proc.wait(300) == 0, proc.tail()
    # An async job may end a step or two past train_steps (tfps.task.steps).
    assert re.search(r"SUCCEEDED at global step 150[0-2]/1500", proc.output()), proc.tail()
    assert_nothing_left(ports, proc)
