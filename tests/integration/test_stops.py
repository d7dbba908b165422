"""One stop however it is sent: real ``tfps local`` jobs stopped the way tools stop them.

* ``timeout``, CI runners and process managers signal the launcher and then its whole
  process group milliseconds apart: one stop (final checkpoint, export, results.json
  ``stopped``, one message, exit 130);
* a closed terminal (a real tmux pane killed under the job) sends SIGHUP: a stop like
  SIGTERM, exit 129, while the launcher's terminal is gone;
* a deliberate second signal after the stop window ends everything at once: its own exit
  code (137, not 130) and a message that says the final save was not made.

Times are only ever upper bounds that a hang would break.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from integration_helpers import (
    REPO,
    assert_nothing_left,
    base_env,
    launcher_ports,
    poll,
    read_results,
    run_flags,
)

from tfps.exitcodes import ExitCode
from tfps.timeouts import STOP_WINDOW_SECS

pytestmark = pytest.mark.integration


def _training(launcher) -> bool:
    return bool(launcher.lines(r"\[worker0\] .*worker0: step (\d+)/"))


def _one_message(smtp_server, word: str):
    """The one message of a job whose launcher has exited, and every task with it: what the
    server has is all there is (it records a message before it answers the sender)."""
    mails = smtp_server.wait_for(1, timeout=60)
    subjects = [m["Subject"] for m in smtp_server.received()]
    assert len(subjects) == 1, subjects
    assert word in subjects[0].lower(), subjects
    return mails[0]


def _assert_stopped_with_final_save(model_dir: Path, code: int) -> None:
    res = read_results(model_dir)
    assert res["status"] == "stopped", res.get("error")
    assert res["exit_code"] == code
    assert 0 < res["global_step"] < 10_000_000
    assert res["export_complete"] is True
    assert (model_dir / f"model.ckpt-{res['global_step']}.index").is_file(), sorted(os.listdir(model_dir))
    assert (Path(res["export_dir"]) / "saved_model.pb").is_file()


def test_a_signal_to_the_launcher_then_its_group_is_one_stop(procs, tmp_path, smtp_server):
    """The issue's reproduction: ``kill -INT $L; sleep 0.02; kill -INT -- -$L`` once it trains,
    as ``timeout -s INT`` does it."""
    model_dir = tmp_path / "model"
    launcher = procs.tfps("tfps-local-group-stop", "local", *run_flags(model_dir, steps=10_000_000),
                          env=base_env(APPRISE_URLS=smtp_server.url()))
    ports = launcher_ports(launcher)
    poll(lambda: _training(launcher), 180, "the chief training", launcher)
    os.kill(launcher.pid, signal.SIGINT)
    time.sleep(0.02)
    os.killpg(launcher.pid, signal.SIGINT)      # the launcher leads its own group (start_new_session)
    assert launcher.wait(300) == ExitCode.STOPPED == 130, launcher.tail()
    out = launcher.output()
    assert "SIGKILL" not in out, launcher.tail()
    _assert_stopped_with_final_save(model_dir, 130)
    assert "stopped" in _one_message(smtp_server, "stopped")["Subject"].lower()
    assert_nothing_left(ports, launcher)


def test_a_deliberate_second_signal_stops_at_once_and_says_so(procs, tmp_path, smtp_server):
    model_dir = tmp_path / "model"
    # A slow export keeps the chief in its final save when the second signal comes.
    launcher = procs.tfps("tfps-local-second-signal", "local",
                          *run_flags(model_dir, "--model", "tests.fixtures.slow_model:model_fn", steps=10_000_000),
                          env=base_env(APPRISE_URLS=smtp_server.url()))
    ports = launcher_ports(launcher)
    poll(lambda: _training(launcher), 180, "the chief training", launcher)
    launcher.signal(signal.SIGINT)
    launcher.wait_for(r"received SIGINT: finishing the current step", 60)
    time.sleep(STOP_WINDOW_SECS + 1.0)
    launcher.signal(signal.SIGINT)
    t0 = time.monotonic()
    rc = launcher.wait(60)
    assert rc == ExitCode.KILLED == 137, launcher.tail()
    assert time.monotonic() - t0 < 20
    mail = _one_message(smtp_server, "failed")
    body = mail.get_body(("plain",)).get_content()
    assert "killed before the final save" in body, body
    assert "killed before the final save" in launcher.output()
    assert not (model_dir / "export").exists(), "the export was said to be cut, yet it exists"
    assert_nothing_left(ports, launcher)


def test_a_closed_terminal_is_a_stop_with_the_final_save(procs, tmp_path, smtp_server):
    """A real terminal (tmux): the job runs in the foreground of an interactive bash in a
    pane, and the pane's session is killed. Its pty hangs up, bash gets SIGHUP and passes it
    on to its jobs before it exits, as it does when an SSH session or a terminal window
    closes; the launcher writes on a terminal that is gone from then on."""
    model_dir = tmp_path / "model"
    rc_file = tmp_path / "rc"
    env = base_env(APPRISE_URLS=smtp_server.url())
    session = f"tfps-hup-{uuid.uuid4().hex[:8]}"
    argv = [sys.executable, "-m", "tfps", "local", *map(str, run_flags(model_dir, steps=10_000_000))]
    # The job is `sh -c` around the launcher only to record its exit code afterwards: that sh
    # ignores SIGHUP, and the launcher installs its own handler whatever it inherits.
    inner = f"trap '' HUP; {shlex.join(argv)}; echo $? > {shlex.quote(str(rc_file))}"
    env_args = [x for k, v in env.items() if k in ("APPRISE_URLS", "TFPS_DEMO_DIR", "PYTHONPATH")
                for x in ("-e", f"{k}={v}")]
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "200", "-y", "50", "-c", str(REPO),
                    *env_args, "bash", "--norc", "--noprofile", "-i"], check=True, env=env)
    try:
        def pane() -> str:
            return subprocess.run(["tmux", "capture-pane", "-p", "-t", session, "-S", "-200"],
                                  capture_output=True, text=True).stdout
        subprocess.run(["tmux", "send-keys", "-t", session, f"sh -c {shlex.quote(inner)}", "Enter"], check=True)
        # On a terminal the job is one status line (tfps.launch.console), not per-worker lines.
        poll(lambda: re.search(r"^step \d+/\d+ ", pane(), re.M), 180, "training in the tmux pane")
        subprocess.run(["tmux", "kill-session", "-t", session], check=True)
        poll(lambda: rc_file.exists() and rc_file.read_text().strip(), 300, "the launcher's exit")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    assert rc_file.read_text().strip() == str(int(ExitCode.STOPPED_HUP)) == "129"
    _assert_stopped_with_final_save(model_dir, 129)
    _one_message(smtp_server, "stopped")


def test_a_task_process_takes_a_group_signal_as_one_stop_and_a_late_one_as_kill(tmp_path):
    """A real process with tfps's StopSignal: a second SIGTERM right after the first (as
    `timeout` sends one to the launcher and then to its group) is the same stop; a third after
    the window ends it at once with KILLED."""
    code = textwrap.dedent("""
        import sys, time
        from tfps.task.runtime.signals import StopSignal
        stop = StopSignal()
        print("ready", flush=True)
        end = time.monotonic() + 30   # a signal that never came fails the test below, not hangs it
        while stop.count < 1 and time.monotonic() < end:
            time.sleep(0.001)
        print("first", flush=True)
        while stop.count < 2 and time.monotonic() < end:
            time.sleep(0.001)
        print("requested", stop.requested, stop.count, stop.exit_code().value, flush=True)
        time.sleep(30)
        sys.exit(5)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        os.kill(proc.pid, signal.SIGTERM)
        # The second is sent once the first was taken: two signals of a kind that are both
        # pending reach a process as one (the kernel keeps one), which a loaded machine can cause.
        assert proc.stdout.readline().strip() == "first"
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.stdout.readline().split() == ["requested", "True", "2", "143"]
        time.sleep(2.3)
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(10) == ExitCode.KILLED
        assert "exiting now, without the final save" in proc.stderr.read()
    finally:
        proc.kill()


def test_a_second_signal_ends_a_task_blocked_in_tensorflow(tmp_path):
    """A task whose main thread waits inside a TensorFlow call (a sync step's wait for its
    token, a dequeue from a ps) cannot run Python's signal handlers until that call returns.
    The first SIGTERM is still a stop request, and a deliberate second one after the stop
    window still ends the process at once with KILLED: here the call never returns."""
    code = textwrap.dedent("""
        import sys
        import tensorflow as tf
        from tfps.task.runtime.signals import StopSignal
        stop = StopSignal()
        v1 = tf.compat.v1
        with tf.Graph().as_default():
            never = v1.FIFOQueue(1, tf.int32).dequeue()   # nothing is ever enqueued
            with v1.Session() as sess:
                print("blocked", flush=True)
                sess.run(never)
        sys.exit(5)
    """)
    env = base_env()
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=str(tmp_path))
    try:
        assert proc.stdout.readline().strip() == "blocked", proc.stderr.read()
        time.sleep(0.5)   # into the dequeue
        os.kill(proc.pid, signal.SIGTERM)
        time.sleep(STOP_WINDOW_SECS + 0.5)
        assert proc.poll() is None, "the first signal ended the process"
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(15) == ExitCode.KILLED, proc.stderr.read()
        err = proc.stderr.read()
        assert "received SIGTERM: finishing the current step" in err, err
        assert "exiting now, without the final save" in err, err
        with pytest.raises(ProcessLookupError):
            os.kill(proc.pid, 0)
    finally:
        proc.kill()
        proc.wait(10)


def test_the_launcher_ends_a_task_left_after_the_job_with_one_stop_not_a_second(tmp_path):
    """``tfps local`` ends a task that did not exit by itself after the chief's end. It sent two
    SIGTERMs 2.5 s apart, and a task still winding down from the first took the second for a
    person's deliberate second stop ("exiting now, without the final save", exit 137: issue 51's
    chaos job). Here a real process with tfps's StopSignal takes longer than the stop window to
    end after its stop: it must end by that one stop (143), with no word of a second."""
    from tfps.launch.processes import _end_stragglers
    from tfps.launch.tasks import TaskProcess
    code = textwrap.dedent(f"""
        import sys, time
        from tfps import logs
        from tfps.task.runtime.signals import StopSignal
        logs.setup()
        stop = StopSignal()
        print("ready", flush=True)
        end = time.monotonic() + 60
        while not stop.requested and time.monotonic() < end:
            time.sleep(0.01)
        time.sleep({STOP_WINDOW_SECS} + 2)   # its stop takes longer than the stop window
        sys.exit(int(stop.exit_code()))
    """)
    out = tmp_path / "worker1.out"
    with open(out, "w") as fh:
        task = TaskProcess("worker1", [sys.executable, "-c", code], base_env(), fh)
        task.spawn()
        task.pump()
        try:
            poll(lambda: "ready" in out.read_text(), 60, "the task's start")
            _end_stragglers([task], 0, 120)
            assert task.poll() == ExitCode.STOPPED_TERM, out.read_text()
        finally:
            task.signal(signal.SIGKILL)
    text = out.read_text()
    assert "received SIGTERM: finishing" in text, text
    assert "exiting now, without the final save" not in text, text
