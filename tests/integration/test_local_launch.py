"""How ``tfps local`` starts its tasks: forked from a launcher that has imported TensorFlow
once, or (``TFPS_LOCAL_FORK=0``) as new interpreters. Either way each task is its own
process, in its own session, under the launcher, showing its ``tfps run`` command line,
and the job trains to the end. The forked case (the default) is checked on the shared job
of tests/integration/test_async_job.py. The spawned job runs with ``-v``, which brings
TensorFlow's own lines back from every task (without it, the console shows only tfps's lines:
test_async_job)."""

from __future__ import annotations

import os
import re

import pytest
from integration_helpers import (
    _cmdline,
    assert_nothing_left,
    base_env,
    launcher_ports,
    maps_tensorflow,
    run_flags,
    tasks_of,
)
from test_async_job import SUMMARY_LINE, TFPS_LINE

pytestmark = pytest.mark.integration


def test_each_spawned_task_is_its_own_process_and_the_job_trains(procs, tmp_path):
    env = base_env()
    env["TFPS_LOCAL_FORK"] = "0"
    proc = procs.tfps("tfps-local-spawn", "local", "-v", *run_flags(tmp_path / "model", steps=300), env=env)
    ports = launcher_ports(proc)
    tasks = tasks_of(proc.pid, 60)
    for name, pid in tasks.items():
        cmd = _cmdline(pid)
        assert " -m tfps run " in cmd and f"127.0.0.1:{ports[0]}" in cmd, (name, cmd)
        assert os.getsid(pid) == pid, f"{name} is not the leader of its own session"
    # A launcher that spawns its tasks does not import TensorFlow (a forking one does: test_async_job).
    assert maps_tensorflow(proc.pid) is False
    assert len(set(tasks.values())) == 3
    assert proc.wait(300) == 0, proc.tail()
    # An async job may end a step or two past train_steps (tfps.task.graph.steps).
    assert re.search(r"SUCCEEDED at global step 30[0-2]/300", proc.output()), proc.tail()
    assert_nothing_left(ports, proc)
    # -v: TensorFlow's C++ start-up lines and its Python logger's warnings, from every task.
    lines = proc.output().splitlines()
    foreign = [line for line in lines if not (TFPS_LINE.match(line) or SUMMARY_LINE.match(line))]
    assert any("absl::InitializeLog" in line for line in foreign), "\n".join(lines[:40])
    for task in ("ps0", "worker0", "worker1"):
        assert any(line.startswith(f"[{task}] ") for line in foreign), (task, "\n".join(foreign[:40]))
