"""A stop of ``tfps local`` while training a model whose export takes longer than 10 s.

10 s is Docker's default stop grace: an orchestrator using it would SIGKILL the chief in
the middle of this export. tfps waits for the final save instead, and the ps (which holds
the variables) stays up until the chief has finished it. The stop is SIGTERM, what
orchestrators and ``kill`` send, here sent by ``tfps stop --local`` (after ``tfps status --local``
shows the job running and ``tfps logs --local`` its chief's lines): the job ends "stopped" with
exit code 143. (Ctrl-C's
SIGINT, to the launcher and then its whole group, and a closed terminal's SIGHUP:
tests/integration/test_stops.py.)

While the job trains, a second ``tfps local`` into its model_dir is refused (one line naming
the running job, exit 2, nothing started), and every TensorFlow port of it listens on loopback only (the kernel's
socket table).
"""

from __future__ import annotations

import time

import pytest
from integration_helpers import (
    assert_nothing_left,
    launcher_ports,
    listening_addresses,
    load_and_predict,
    poll,
    read_results,
    run_flags,
    task_exit,
)

from tfps.exitcodes import ExitCode

pytestmark = pytest.mark.integration

EXPORT_SLEEP = 12.0   # tests/fixtures/slow_model.py


def _progress_at(launcher, task: str) -> int:
    found = launcher.lines(rf"\[{task}\] .*{task}: step (\d+)/")
    return int(found[-1].group(1)) if found else 0


def test_a_stop_waits_for_a_slow_final_export_and_every_port_is_on_loopback(procs, tmp_path):
    model_dir = tmp_path / "model"
    launcher = procs.tfps("tfps-local-slow-export", "local",
                          *run_flags(model_dir, "--model", "tests.fixtures.slow_model:model_fn", steps=1_000_000))
    ports = launcher_ports(launcher)
    poll(lambda: _progress_at(launcher, "worker1") > 0 and _progress_at(launcher, "worker0") > 0, 120,
         "both workers training", launcher)

    table = listening_addresses(ports)
    assert all(table[p] for p in ports), table                               # every task listens...
    assert all(addrs == {"127.0.0.1"} for addrs in table.values()), table   # ...on loopback only

    # A second job into the running job's model_dir (the same settings: it would resume from the
    # running job's checkpoints) is refused in one line, before it starts anything.
    second = procs.tfps("tfps-local-same-model-dir", "local",
                        *run_flags(model_dir, "--model", "tests.fixtures.slow_model:model_fn", steps=1_000_000),
                        separate_stderr=True)
    assert second.wait(120) == ExitCode.BAD_CONFIG, second.tail()
    refusal = second.stderr().strip().splitlines()[-1]
    assert refusal.startswith(f"tfps: error: model_dir: {model_dir} is in use by job "), refusal
    assert "(tfps local, pid " in refusal and "another --model_dir" in refusal
    assert "tfps local:" not in second.output()   # no task of it started
    assert launcher.returncode is None            # and the first job trains on

    # The job as `tfps status --local` sees it (its model_dir, the lock its launcher holds), and the
    # stop as `tfps stop --local` sends it: SIGTERM to the launcher (tfps.backends.local).
    status = procs.tfps("tfps-status-local", "status", "--local", "--job", model_dir, separate_stderr=True)
    assert status.wait(120) == ExitCode.OK, status.tail()
    row = status.output().splitlines()[1].split()
    assert f"({model_dir.name})" in row and "running" in row, status.output()
    shown = procs.tfps("tfps-logs-local", "logs", "--local", model_dir, "worker0", "-n", "5", separate_stderr=True)
    assert shown.wait(120) == ExitCode.OK, shown.tail()
    lines = shown.output().splitlines()
    assert 0 < len(lines) <= 5 and all(line.startswith("[worker0] ") for line in lines), lines
    stop = procs.tfps("tfps-stop-local", "stop", "--local", "--job", model_dir, separate_stderr=True)
    assert stop.wait(120) == ExitCode.OK, stop.tail()
    assert f"sent SIGTERM to tfps local (pid {launcher.pid})" in stop.output(), stop.output()
    stopped_at = time.monotonic()
    rc = launcher.wait(300)
    took = time.monotonic() - stopped_at

    assert rc == ExitCode.STOPPED_TERM == 143, launcher.tail()
    res = read_results(model_dir)
    assert res["status"] == "stopped"
    assert res["exit_code"] == 143
    assert 0 < res["global_step"] < 1_000_000
    assert res["export_complete"] is True
    assert res["times"]["final_save_s"] > 10
    assert took > EXPORT_SLEEP
    out = load_and_predict(res["export_dir"], [[0.0] * 8])
    assert out["probabilities"].shape == (1, 3)

    assert "resuming from the newest checkpoint" not in launcher.output()
    # Every task's lines were kept beside the model_dir as well (tfps logs --local reads them).
    kept = model_dir.parent / "model.logs"
    assert sorted(p.name for p in kept.iterdir()) == ["ps0.log", "worker0.log", "worker1.log"]
    assert "exported the SavedModel" in (kept / "worker0.log").read_text()
    assert "every worker is done" in (kept / "ps0.log").read_text()
    # The ps outlived the chief's export and then left on its own.
    assert task_exit(launcher, "ps0") == "0 (OK)"
    assert "ending tasks that did not exit by themselves" not in launcher.output()
    lines = launcher.output().splitlines()
    exported = next(i for i, l in enumerate(lines) if l.startswith("[worker0]") and "exported the SavedModel" in l)
    ps_done = next(i for i, l in enumerate(lines) if l.startswith("[ps0]") and "every worker is done" in l)
    assert exported < ps_done
    assert_nothing_left(ports, launcher)
