"""The startup watchdog: a worker that never trains a step ends, and the chief reports it.

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

from trainer import timeouts
from trainer.cluster.spec import JOBS, task_name
from trainer.exitcodes import ExitCode

log = logging.getLogger("tfps")


class StartupWatchdog:
    """Fail a worker that has not trained a step within ``--startup_timeout``.

    TensorFlow waits for every task of the session's device filters without a bound
    ("CreateSession still waiting for response from worker"), and a sync step waits for
    gradients of workers that never came up. Neither can be interrupted from Python, so
    when the time is up this thread says which tasks do not answer, lets the chief report
    the job failed (results.json and the failure message), and ends the process.
    """

    def __init__(self, job):
        self.job = job
        self.done = threading.Event()
        self.deadline = 0.0
        self.thread = threading.Thread(target=self._watch, name="tfps-startup-watchdog", daemon=True)

    def start(self) -> "StartupWatchdog":
        self.extend()
        self.thread.start()
        return self

    def extend(self) -> None:
        """The cluster answered and is making progress (a non-chief waiting for the chief)."""
        self.deadline = time.monotonic() + self.job.cfg.startup_timeout

    def disarm(self) -> None:
        self.done.set()

    def _watch(self) -> None:
        while not self.done.wait(max(self.deadline - time.monotonic(), 0.0)):
            if time.monotonic() >= self.deadline:
                break
        else:
            return
        job, task = self.job, self.job.task
        silent = [f"{name} ({target}) {state}" for name, target, state in probe_tasks(task) if state != "answers"]
        where = ("; ".join(silent) if silent else
                 "every task answers, so one is stuck before its first step (see its log)")
        error = RuntimeError(
            f"{task.name} did not train a step within {job.cfg.startup_timeout:.0f} s of its start "
            f"(--startup_timeout): {where}. Check that every task of the cluster is running (its "
            "container or process, the image it runs), that nothing else listens on its port, and "
            "that the hosts reach each other; raise --startup_timeout if restoring the model takes longer.")
        print(f"tfps: error: {error}", file=sys.stderr, flush=True)
        code = ExitCode.TRAINING_FAILED
        try:
            if task.is_chief:
                job.report_untrained_failure(error, code, write_results=job.claimed)
        except Exception as e:  # noqa: BLE001 - the process ends whatever happens
            log.error("%s: could not report the failure: %s", task.name, e)
        finally:
            logging.shutdown()
            sys.stdout.flush()
            os._exit(int(code))


#: What a client sends first on an HTTP/2 (gRPC) connection, and an empty SETTINGS frame.
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def probe_task(target: str, timeout: float = timeouts.PROBE_TIMEOUT_SECS) -> str:
    """"answers" if a gRPC server (a TF task) serves ``host:port``, else what is wrong there.

    A TF server answers the HTTP/2 preface with a SETTINGS frame; another program that
    holds the port (so the task could not bind it) accepts the connection and does not.
    """
    from trainer.cluster.spec import split_target
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
    except socket.timeout:
        return "accepts connections but is not a TensorFlow server (another program holds its port?)"
    except OSError as e:
        return f"does not answer ({e.strerror or type(e).__name__})"
    if len(head) == 9 and head[3] == 0x04:
        return "answers"
    return "accepts connections but is not a TensorFlow server (another program holds its port?)"


def probe_tasks(task, timeout: float = timeouts.PROBE_TIMEOUT_SECS) -> list[tuple[str, str, str]]:
    """(name, host:port, state) of every other task of the cluster (see probe_task)."""
    return [(task_name(job, i), target, probe_task(target, timeout))
            for job in JOBS for i, target in enumerate(task.cluster.job(job))
            if task_name(job, i) != task.name]
