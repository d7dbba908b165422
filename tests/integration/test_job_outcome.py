"""A success is a success (issue 35): a job in which a worker failed is not reported as
succeeded, it is reported once, with the real error and the highest step it reached.

* a NaN past the rows checked before start, in a non-chief worker's shard, fails the job
  with the file, the line and the column, in results.json and in the one message;
* a probe of a stopped task's port says it is stopped.

(A sync worker frozen past --sync_timeout fails the job once, with one message, the step
the job reached and the frozen task called unresponsive: the no-backup job of
tests/integration/test_backup_workers.py, which freezes the same worker briefly first.)
"""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
from integration_helpers import (
    assert_nothing_left,
    base_env,
    launcher_ports,
    read_results,
    run_flags,
    task_exit,
)

pytestmark = pytest.mark.integration


def _nan_csv(path, rows: int, nan_row: int) -> int:
    """A CSV of ``rows`` data rows whose data row ``nan_row`` (0-based) holds nan in column f2;
    returns that row's line number (the header is line 1)."""
    import numpy as np
    rng = np.random.default_rng(3)
    x = rng.normal(size=(rows, 4)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(int)
    lines = ["f0,f1,f2,f3,label"]
    lines += [f"{a:.4f},{b:.4f},{c:.4f},{d:.4f},{label}" for (a, b, c, d), label in zip(x, y)]
    lines[1 + nan_row] = lines[1 + nan_row].split(",", 3)
    lines[1 + nan_row][2] = "nan"
    lines[1 + nan_row] = ",".join(lines[1 + nan_row])
    path.write_text("\n".join(lines) + "\n")
    return nan_row + 2


def test_a_nan_past_the_precheck_in_a_non_chief_shard_fails_the_job(procs, tmp_path, smtp_server):
    from tfps.data.dataset import CSV_SCAN_ROWS
    data = tmp_path / "train.csv"
    # Data row k goes to worker k % 2 (one file, two workers): an odd row is worker1's.
    line = _nan_csv(data, CSV_SCAN_ROWS + 4000, CSV_SCAN_ROWS + 1)
    model_dir = tmp_path / "model"
    launcher = procs.tfps("tfps-local-nan-shard", "local", "--workers", "2", "--train_data", str(data),
                          "--batch_size", "512", *run_flags(model_dir, steps=3000),
                          env=base_env(APPRISE_URLS=smtp_server.url()))
    ports = launcher_ports(launcher)
    assert launcher.wait(400) == 1, launcher.tail()
    res = read_results(model_dir)
    where = f"{data}:{line} has a non-finite value (nan) in column 'f2'"
    assert res["status"] == "failed", res
    assert res["error"]["type"] == "WorkerFailed", res["error"]
    assert "worker1" in res["error"]["message"] and where in res["error"]["message"], res["error"]
    assert "Graph execution error" not in res["error"]["message"]
    assert task_exit(launcher, "worker1") == "1 (TRAINING_FAILED)"
    # The launcher has exited, and every task with it: the messages are all there is (the
    # server records one before it answers the sender).
    msgs = smtp_server.wait_for(1, timeout=30)
    assert len(msgs) == 1, [m["Subject"] for m in msgs]
    assert "FAILED" in msgs[0]["Subject"]
    body = msgs[0].get_body(preferencelist=("plain", "html")).get_content()
    assert where in " ".join(body.split()), body
    assert_nothing_left(ports, launcher)


def test_a_probe_calls_a_stopped_task_unresponsive(tmp_path):
    from tfps.task.runtime.watchdog import probe_task
    server = subprocess.Popen([sys.executable, "-c", (
        "import socket,sys,time\n"
        "s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen(8)\n"
        "print(s.getsockname()[1], flush=True)\n"
        "while True:\n"
        "    c,_=s.accept(); c.recv(64); c.sendall(b'\\x00\\x00\\x00\\x04\\x00\\x00\\x00\\x00\\x00')\n")],
        stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        assert probe_task(f"127.0.0.1:{port}", timeout=2) == "answers"
        server.send_signal(signal.SIGSTOP)
        state = probe_task(f"127.0.0.1:{port}", timeout=1)
        assert state.startswith("is unresponsive: its process") and str(server.pid) in state, state
        assert "another program" not in state
    finally:
        server.send_signal(signal.SIGCONT)
        server.kill()
        server.wait(10)
