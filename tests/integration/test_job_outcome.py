"""A success is a success (issue 35): a job in which a worker failed is not reported as
succeeded, it is reported once, with the real error and the highest step it reached.

* a NaN past the rows checked before start, in a non-chief worker's shard, fails the job
  with the file, the line and the column, in results.json and in the one message;
* a sync worker frozen (SIGSTOP) past --sync_timeout fails the job once: one message, the
  step the job reached, the frozen task called unresponsive (not "another program");
* a probe of a stopped task's port says it is stopped.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
from integration_helpers import (
    Proc,
    Processes,
    assert_nothing_left,
    base_env,
    launcher_ports,
    poll,
    read_results,
    run_flags,
    task_exit,
)

from tfps.timeouts import STOP_WINDOW_SECS

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
    from tfps.data import CSV_SCAN_ROWS
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
    msgs = smtp_server.wait_for(2, timeout=5)
    assert len(msgs) == 1, [m["Subject"] for m in msgs]
    assert "FAILED" in msgs[0]["Subject"]
    body = msgs[0].get_body(preferencelist=("plain", "html")).get_content()
    assert where in " ".join(body.split()), body
    assert_nothing_left(ports, launcher)


PACED_MODEL = "tests.fixtures.paced_model:model_fn"


def test_a_frozen_sync_worker_past_sync_timeout_fails_the_job_once(procs: Processes, tmp_path, webhook_server):
    from tfps.cluster import local_plan
    model_dir = tmp_path / "model"
    sync_timeout = 10
    plan = local_plan(1, 2)
    tasks: dict[str, Proc] = {}
    for t in plan.tasks:
        env = {"TFPS_TEST_STEP_SECS": "0.03",
               **({"APPRISE_URLS": webhook_server.url()} if t.name == "worker0" else {})}
        tasks[t.name] = procs.tfps(t.name, "run", *plan.task_ref(t).to_flags(),
                                   *run_flags(model_dir, "--model", PACED_MODEL, "--sync_replicas",
                                              "--sync_timeout", sync_timeout, "--log_steps", 10, steps=5000),
                                   env=base_env(**env))
    chief, frozen = tasks["worker0"], tasks["worker1"]
    import faults
    poll(lambda: max(faults.progress_steps(chief.output()) or [0]) >= 60, 300, "the chief's first steps",
         *tasks.values())
    reached = max(faults.progress_steps(chief.output()))
    frozen.signal(signal.SIGSTOP)
    try:
        assert chief.wait(sync_timeout * 2 + 60) == 1, chief.tail()
    finally:
        # Thawed as soon as the chief has ended (only the chief reports): its step times out
        # and it tells the ps, still up, that it is done, instead of finding it gone and
        # waiting out the bound on its end RPCs.
        frozen.signal(signal.SIGCONT)
    time.sleep(3)   # a second report would come within a second or two
    titles = [str(b.get("title")) for b in webhook_server.bodies()]
    ended = [t for t in titles if "FAILED" in t.upper() or "SUCCEEDED" in t.upper() or "STOPPED" in t.upper()]
    assert len(ended) == 1, titles
    res = read_results(model_dir)
    assert res["status"] == "failed", res
    assert res["global_step"] >= reached, (res["global_step"], reached)   # not the checkpoint's step
    assert "Graph execution error" not in res["error"]["message"], res["error"]
    assert "another program" not in chief.output() or "unresponsive" in chief.output(), chief.tail()
    # The chief's watchdog ended it without "done" tokens (the job cannot go on): the ps and
    # the unfrozen worker are ended as every orchestrator ends them after a failed chief
    # (tfps local, compose's --exit-code-from, the play): SIGTERM, and a deliberate second
    # one past the stop window.
    others = [p for name, p in tasks.items() if name != "worker0"]
    for p in others:
        p.signal(signal.SIGTERM)
    time.sleep(STOP_WINDOW_SECS + 0.5)
    for p in others:
        p.signal(signal.SIGTERM)
    for p in tasks.values():
        p.wait(120)
    assert_nothing_left([t.port for t in plan.tasks], *tasks.values())


def test_a_probe_calls_a_stopped_task_unresponsive(tmp_path):
    from tfps.task.watchdog import probe_task
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
