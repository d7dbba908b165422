"""The watchdog: a worker that never trains a step, or stops training one, ends; the chief reports it.

TensorFlow waits without a bound for every task a session needs, and a sync step waits
for gradients of workers that never came up; neither can be interrupted from Python.
The watchdog thread gives a worker ``--startup_timeout`` seconds to its first step, then
probes the other tasks' ports to say which one does not answer (``probe_task``), lets
the chief report the job failed, and ends the process.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time

from tfps import timeouts
from tfps.cluster.spec import JOBS, split_target, task_name
from tfps.errors import real_os_exit
from tfps.exitcodes import ExitCode
from tfps.task.net.loopback import is_loopback_host

log = logging.getLogger("tfps")


class StartupWatchdog:
    """Fail a worker that has not trained a step within ``--startup_timeout``, or that has
    trained none for ``--sync_timeout`` since its last one.

    TensorFlow waits for every task of the session's device filters without a bound
    ("CreateSession still waiting for response from worker"), and a sync step waits for
    gradients of workers that never came up. A ps that dies mid-job is the same wait:
    MonitoredSession takes the lost connection for a preemption and creates its session
    again, which waits for the dead ps for good. None of these can be interrupted from
    Python, so when the time is up this thread says which tasks do not answer, lets the
    chief report the job failed (results.json naming the lost tasks, and the failure
    message), and ends the process.
    """

    def __init__(self, job):
        self.job = job
        self.done = threading.Event()
        self.deadline = 0.0
        self.training = False   # a step has been trained: the bound is --sync_timeout from now on
        self.thread = threading.Thread(target=self._watch, name="tfps-startup-watchdog", daemon=True)

    def start(self) -> StartupWatchdog:
        self.extend()
        self.thread.start()
        return self

    def _bound(self) -> float:
        return self.job.cfg.sync_timeout if self.training else self.job.cfg.startup_timeout

    def extend(self) -> None:
        """The cluster answered and is making progress (a non-chief waiting for the chief)."""
        self.deadline = time.monotonic() + self._bound()

    def progress(self) -> None:
        """A training step ended: the next one must end within ``--sync_timeout``."""
        self.training = True
        self.deadline = time.monotonic() + self.job.cfg.sync_timeout

    def disarm(self) -> None:
        self.done.set()

    def _expired(self) -> list | None:
        """Wait for the deadline; None once disarmed, else the tasks that do not answer then.

        While training, a wait with every task answering is not a lost task (a step slowed
        by the host, this process stopped and continued): the bound starts again, once said.
        """
        # Wake at least every second: progress() may bring the deadline closer.
        while not self.done.wait(min(max(self.deadline - time.monotonic(), 0.0), 1.0)):
            if time.monotonic() < self.deadline:
                continue
            probes = [p for p in probe_tasks(self.job.task) if p[2] != "answers"]
            if probes or not self.training:
                return probes
            log.warning("%s: no step for %.0f s although every task answers; waiting on",
                        self.job.task.name, self.job.cfg.sync_timeout)
            self.extend()
        return None

    def _watch(self) -> None:
        probes = self._expired()
        if probes is None:
            return
        job, task = self.job, self.job.task
        if self.done.is_set():   # disarmed while probing: the training loop ended, and reports the job itself
            return
        if any(name.startswith("ps") for name, _, _ in probes):
            # A lost ps is the cause; workers that already gave up on it are not.
            probes = [p for p in probes if p[0].startswith("ps")]
        lost = [name for name, _, _ in probes]
        silent = [f"{name} ({target}) {state}" for name, target, state in probes]
        where = ("; ".join(silent) if silent else
                 "every task answers, so one is stuck (see its log)")
        if self.training:
            error = RuntimeError(
                f"{task.name} trained no step for {job.cfg.sync_timeout:.0f} s (--sync_timeout) at global step "
                f"{job.last_seen_step}: {where}. A task of the cluster "
                f"{'stopped answering' if probes and all('unresponsive' in p[2] for p in probes) else 'died'} "
                "and did not come back; the newest "
                "checkpoint is kept, so the job resumes from it when started again with the same model_dir.")
        else:
            error = RuntimeError(
                f"{task.name} did not train a step within {job.cfg.startup_timeout:.0f} s of its start "
                f"(--startup_timeout): {where}. Check that every task of the cluster is running (its "
                "container or process, the image it runs), that nothing else listens on its port, and "
                "that the hosts reach each other; raise --startup_timeout if restoring the model takes longer.")
        print(f"tfps: error: {error}", file=sys.stderr, flush=True)
        code = ExitCode.TRAINING_FAILED
        reported_elsewhere = False
        try:
            if task.is_chief:
                # False: the training loop reported the job a moment before (one report per
                # job); it goes on to its end (the done tokens), so this thread leaves it alone.
                reported_elsewhere = job.report_untrained_failure(
                    error, code, write_results=job.claimed, lost_tasks=lost) is False
        except Exception as e:  # noqa: BLE001 - the process ends whatever happens
            log.error("%s: could not report the failure: %s", task.name, e)
        finally:
            if not reported_elsewhere:
                logging.shutdown()
                sys.stdout.flush()
                real_os_exit(int(code))


class StartupBound:
    """A ps's start, bounded by ``--startup_timeout``: a task that cannot start says why.

    A ps started again by ``tfps run --restarts`` under load once printed TensorFlow's
    banner and then nothing for 90 s. Whatever it waits on (its old port, TensorFlow's
    runtime, the session of its own queue), this thread names the phase it is stuck in
    after ``--startup_timeout`` and ends the process, so its supervisor or orchestrator
    sees an exit instead of a silent task.
    """

    def __init__(self, name: str, timeout: float, phase: str):
        self.name, self.timeout, self.phase = name, timeout, phase
        self.done = threading.Event()
        threading.Thread(target=self._watch, name="tfps-startup-bound", daemon=True).start()

    def disarm(self) -> None:
        self.done.set()

    def _watch(self) -> None:
        if self.done.wait(self.timeout):
            return
        print(f"tfps: error: {self.name} did not start within {self.timeout:.0f} s (--startup_timeout): it "
              f"was still {self.phase}. Check that no other program holds its port and that the host is "
              "not out of memory or CPU; raise --startup_timeout on a host this slow.", file=sys.stderr, flush=True)
        logging.shutdown()
        real_os_exit(int(ExitCode.TRAINING_FAILED))


#: The start of what ``probe_task`` says of a port that is held and silent within its timeout.
SILENT = "accepts connections but is not a TensorFlow server (another program holds its port?) or is unresponsive"


#: What a client sends first on an HTTP/2 (gRPC) connection, and an empty SETTINGS frame.
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def probe_task(target: str, timeout: float = timeouts.PROBE_TIMEOUT_SECS) -> str:
    """"answers" if a gRPC server (a TF task) serves ``host:port``, else what is wrong there.

    A TF server answers the HTTP/2 preface with a SETTINGS frame; another program that
    holds the port (so the task could not bind it) accepts the connection and does not.
    """
    host, port = split_target(target, "target", "task address")   # "[fd00::1]:2222" -> fd00::1, 2222
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(_H2_PREFACE)
            head = b""
            while len(head) < 9:
                chunk = s.recv(9 - len(head))
                if not chunk:
                    break
                head += chunk
    except ConnectionRefusedError:
        return "refuses connections (not running?)"
    except TimeoutError:
        # The port is held but nothing answers within the timeout: a task that is frozen
        # (SIGSTOP, a debugger) or too busy to answer; a program that is not a TensorFlow
        # server closes the connection or answers something else (below).
        stopped = _stopped_listener(host, port)
        if stopped is not None:
            return f"is unresponsive: its process {stopped} is stopped (SIGSTOP or a debugger; SIGCONT resumes it)"
        return f"{SILENT} (no answer within {timeout:g} s: frozen or overloaded)"
    except OSError as e:
        return f"does not answer ({e.strerror or type(e).__name__})"
    if len(head) == 9 and head[3] == 0x04:
        return "answers"
    return "accepts connections but is not a TensorFlow server (another program holds its port?)"


def _stopped_listener(host: str, port: int) -> int | None:
    """The pid of this host's stopped process (state T or t in /proc/PID/stat) that listens on
    ``port`` of a loopback ``host``; None when there is none, or it cannot be known here."""
    if not is_loopback_host(host):
        return None
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                next(fh, None)
                for line in fh:
                    f = line.split()
                    # local address "0100007F:1F90", state 0A (LISTEN), inode at field 9
                    if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(f"socket:[{f[9]}]")
        except (OSError, ValueError):
            continue
    if not inodes:
        return None
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            if not any(os.readlink(f"/proc/{pid}/fd/{fd}") in inodes for fd in os.listdir(f"/proc/{pid}/fd")):
                continue
            with open(f"/proc/{pid}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        return int(pid) if state in ("T", "t") else None
    return None


def probe_patiently(target: str, timeout: float = timeouts.PROBE_TIMEOUT_SECS,
                    patience: float = timeouts.PROBE_PATIENT_SECS) -> str:
    """``probe_task``, and once more with ``patience`` seconds for a task that held its port but
    said nothing within ``timeout``: an overloaded task is slow, not lost (issue 51)."""
    state = probe_task(target, timeout)
    if state.startswith(SILENT) and patience > timeout:
        state = probe_task(target, patience)
    return state


def probe_tasks(task, timeout: float = timeouts.PROBE_TIMEOUT_SECS,
                patience: float = timeouts.PROBE_PATIENT_SECS) -> list[tuple[str, str, str]]:
    """(name, host:port, state) of every other task of the cluster (see probe_patiently)."""
    return [(task_name(job, i), target, probe_patiently(target, timeout, patience))
            for job in JOBS for i, target in enumerate(task.cluster.job(job))
            if task_name(job, i) != task.name]
