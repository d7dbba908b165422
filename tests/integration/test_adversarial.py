"""What an adversarial user of ``tfps local`` found, each case reproduced on a real cluster.

* a SIGKILLed ps ends the job within ``--sync_timeout`` (plus a grace), with results.json
  naming the lost task and exactly one failure message on a real SMTP server;
* a SIGKILLed non-chief worker of an async job is named in results.json, and the launcher
  does not idle for minutes before it ends the ps;
* an export_dir or model_dir holding a user's files is refused before start, and the
  files are still there;
* a model whose variables turn NaN under a finite loss fails the job, and the NaN
  checkpoint is then refused, not restored, leaving the job's recorded settings as they were.

(A stray TF_CONFIG in the shell: the shared job of tests/integration/test_async_job.py;
every TensorFlow port of a running job on loopback only, in the socket table: the job of
tests/integration/test_stop_during_export.py; ``tfps local --restarts`` starting a killed
ps again, and the job succeeding with no lost task: the ps-then-chief job of
tests/integration/test_story.py.)

Times are only ever upper bounds that a hang would break.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest
from integration_helpers import (
    assert_nothing_left,
    base_env,
    cluster_pids,
    launcher_ports,
    pids_with_cmdline,
    poll,
    read_results,
    refusal_lines,
    run_flags,
    task_exit,
)

pytestmark = pytest.mark.integration

SYNC_TIMEOUT = 10


def _progress_at(launcher, task: str) -> int:
    found = launcher.lines(rf"\[{task}\] .*{task}: step (\d+)/")
    return int(found[-1].group(1)) if found else 0


def _task_pid(ports: list[int], which: str) -> int:
    """The pid of one task of the job whose ps listens on ``ports[0]`` (its command line)."""
    pids = [p for p in pids_with_cmdline(which) if p in cluster_pids(ports)]
    assert len(pids) == 1, pids
    return pids[0]


def test_a_killed_ps_ends_the_job_within_sync_timeout_and_reports_once(procs, tmp_path, smtp_server):
    model_dir = tmp_path / "model"
    env = base_env(APPRISE_URLS=smtp_server.url())
    launcher = procs.tfps("tfps-local-ps-killed", "local",
                          *run_flags(model_dir, "--sync_timeout", SYNC_TIMEOUT, steps=10_000_000), env=env)
    ports = launcher_ports(launcher)
    poll(lambda: _progress_at(launcher, "worker0") > 100, 120, "training progress", launcher)
    ps_pid = _task_pid(ports, "--job_name=ps --task_index=0")
    os.kill(ps_pid, signal.SIGKILL)
    killed = time.monotonic()
    rc = launcher.wait(SYNC_TIMEOUT + 90)   # a hang never ends: this bound breaks it
    took = time.monotonic() - killed
    assert rc == 1, launcher.tail()                       # ExitCode.TRAINING_FAILED
    assert took < SYNC_TIMEOUT + 60, took
    assert "ps0 exited with signal SIGKILL" in launcher.output()
    res = read_results(model_dir)
    assert res["status"] == "failed"
    assert res["lost_tasks"] == ["ps0"], res.get("lost_tasks")
    assert "ps0" in res["error"]["message"] and "--sync_timeout" in res["error"]["message"]
    # The launcher has exited, and every task with it: the messages are all there is (the
    # server records one before it answers the sender).
    mails = smtp_server.wait_for(1, timeout=30)
    assert len(smtp_server.received()) == 1, [m["Subject"] for m in smtp_server.received()]
    assert "failed" in mails[0]["Subject"].lower()
    assert_nothing_left(ports, launcher)


def test_a_killed_worker_is_named_and_the_ps_is_not_kept_waiting(procs, tmp_path):
    model_dir = tmp_path / "model"
    launcher = procs.tfps("tfps-local-worker-killed", "local",
                          *run_flags(model_dir, "--sync_timeout", 300, steps=3000))
    ports = launcher_ports(launcher)
    poll(lambda: _progress_at(launcher, "worker1") > 100, 120, "worker1's progress", launcher)
    os.kill(_task_pid(ports, "--job_name=worker --task_index=1"), signal.SIGKILL)
    rc = launcher.wait(240)   # the ps would wait --sync_timeout (300 s) for worker1's "done"
    assert rc == 0, launcher.tail()
    res = read_results(model_dir)
    assert res["status"] == "succeeded" and res["global_step"] >= 3000
    assert res["lost_tasks"] == ["worker1"]
    assert "SIGKILL" in res["task_exits"]["worker1"]
    assert "lost tasks worker1" in launcher.output()
    assert task_exit(launcher, "ps0") == "0 (OK)"
    assert_nothing_left(ports, launcher)


@pytest.mark.parametrize("flag", ["--export_dir", "--model_dir"])
def test_a_directory_with_the_users_files_is_refused_and_kept(procs, tmp_path, flag):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "notes.txt").write_text("x\n")
    extra = [flag, d] if flag == "--export_dir" else []
    launcher = procs.tfps("tfps-local-foreign-dir", "local",
                          *run_flags(d if flag == "--model_dir" else tmp_path / "model", *extra),
                          separate_stderr=True)
    assert launcher.wait(60) == 2, launcher.tail()
    err = refusal_lines(launcher.stderr())
    assert len(err) == 1 and "notes.txt" in err[0] and "did not write" in err[0], err
    assert err[0].startswith(f"tfps: error: {flag[2:]}: {d}")
    assert (d / "notes.txt").read_text() == "x\n"
    assert sorted(os.listdir(d)) == ["notes.txt"]
    assert "tfps local:" not in launcher.output()   # nothing started


def test_a_file_in_the_export_path_is_refused_and_kept(procs, tmp_path):
    f = tmp_path / "model.bin"
    f.write_text("weights\n")
    launcher = procs.tfps("tfps-local-export-file", "local", *run_flags(tmp_path / "model", "--export_dir", f),
                          separate_stderr=True)
    assert launcher.wait(60) == 2, launcher.tail()
    assert "is a file, not a directory" in launcher.stderr()
    assert f.read_text() == "weights\n"


def test_nan_variables_fail_the_job_and_the_nan_checkpoint_is_refused(procs, tmp_path):
    model_dir = tmp_path / "model"
    flags = run_flags(model_dir, "--model", "tests.fixtures.bad_models:nan_weights", steps=100)
    first = procs.tfps("tfps-local-nan-weights", "local", *flags)
    assert first.wait(300) == 1, first.tail()
    res = read_results(model_dir)
    assert res["status"] == "failed" and res["error"]["type"] == "FloatingPointError", res.get("error")
    assert "poisoned" in res["error"]["message"]
    assert res["export_complete"] is False and not (model_dir / "export").exists()

    # Other settings with --replace: the chief refuses the checkpoint before any session, and
    # the record of the job that was stays as it was (a failed start used to rewrite it, so the
    # next start was no longer checked against the job the checkpoint belongs to).
    record = (model_dir / "tfps-settings.json").read_bytes()
    again = procs.tfps("tfps-local-nan-resume", "local", "--replace", "--batch_size", 16, *flags)
    assert again.wait(300) == 2, again.tail()
    refusal = again.lines(r"tfps: error: model_dir: the newest checkpoint (\S+) holds NaN")
    assert refusal and "new --model_dir" in again.output(), again.tail()
    assert (model_dir / "tfps-settings.json").read_bytes() == record


def test_a_port_in_use_is_one_line(procs, tmp_path):
    import socket
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        proc = procs.tfps("tfps-run-port-taken", "run", f"--ps_hosts=127.0.0.1:{port}",
                          "--worker_hosts=127.0.0.1:1", "--job_name=ps", "--task_index=0",
                          "--model_dir", tmp_path / "model", separate_stderr=True,
                          env=base_env(TF_ENABLE_ONEDNN_OPTS="1"))   # TF's import banner, as on AMD EPYC
        assert proc.wait(120) == 2, proc.tail()
    finally:
        holder.close()
    err = [line for line in proc.stderr().splitlines() if line.strip()]
    assert err == [f"tfps: error: ps_hosts: ps0 cannot listen on port {port}: another program holds it; stop "
                   "that program or give this task another port"], err


def test_a_builder_that_raises_is_one_line(procs, tmp_path):
    (tmp_path / "broken_builder.py").write_text("def build_model():\n    raise ValueError('no such layer')\n")
    env = base_env()
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{env['PYTHONPATH']}"
    proc = procs.tfps("tfps-local-builder-raises", "local", *run_flags(tmp_path / "model", "--model",
                                                                          "broken_builder:build_model"),
                      env=env, separate_stderr=True)
    assert proc.wait(120) == 2, proc.tail()
    err = refusal_lines(proc.stderr())
    assert len(err) == 1 and "raised ValueError: no such layer at" in err[0] and "broken_builder.py:2" in err[0], err


@pytest.mark.parametrize("sig, inherited", [(signal.SIGTERM, "default"), (signal.SIGHUP, "default"),
                                            (signal.SIGINT, "ignored")])
def test_a_stop_before_any_task_starts_is_one_line_and_leaves_nothing_running(procs, tmp_path, sig, inherited):
    """While the launcher's checks build the model (tests.fixtures.blocking_model), a stop: a
    pair of signals, as ``timeout`` sends one to the launcher and one to its group. TERM and
    HUP killed the launcher without a word; a SIGINT inherited ignored (``cmd &`` in a script)
    vanished and the job started anyway. Each is now one line and the stop's exit code."""
    marker, model_dir = tmp_path / "building", tmp_path / "model"
    env = base_env(TFPS_TEST_BUILDING=str(marker))
    argv = [sys.executable, "-m", "tfps", "local", *run_flags(model_dir, "--model", "tests.fixtures.blocking_model:model_fn")]
    if inherited == "ignored":   # as a shell without job control starts `cmd &`
        argv = ["sh", "-c", 'trap "" INT; exec "$@"', "sh", *argv]
    proc = procs.start(f"tfps-local-early-{sig.name}", argv, env, separate_stderr=True)
    poll(marker.exists, 180, "the model's build in the launcher's checks", proc)
    proc.signal(sig)
    proc.signal(sig)
    assert proc.wait(60) == 128 + sig, proc.tail()
    err = refusal_lines(proc.stderr())
    assert len(err) == 1 and err[0].endswith(f" W tfps local: stopped by {sig.name} before any task started; "
                                             "nothing was started or left running"), err
    assert "[ps0]" not in proc.output() and "ps + " not in proc.output()
    poll(lambda: not proc.alive_family(), 30, "the launcher's children to end")   # the estimate's child too
    assert not (model_dir / "results.json").exists()
