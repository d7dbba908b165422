"""``tfps run --restarts N``: the task process, started again when a signal kills it.

A container or launcher around ``tfps run`` sees one process that lives on while the task
inside it is killed (the OOM killer, a crash) and restarted, up to N times. The task's
own exit codes are its verdict and pass through; only deaths by a signal nobody sent
through this process count.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from tfps import timeouts
from tfps.exitcodes import ExitCode, stopped_code
from tfps.outcome.journal import RESTART_CAUSE_ENV, RESTART_DEATHS_ENV, RESTART_SIGNAL_ENV, signal_cause
from tfps.task.runtime.signals import STOP_SIGNALS

log = logging.getLogger("tfps")

#: Set in the environment of a task process that a supervising ``tfps run --restarts`` started.
SUPERVISED_ENV = "TFPS_SUPERVISED"
#: A directory that outlives each task process of one supervised run (and is removed after
#: it): what a process learnt that its successor needs, e.g. which workers a ps saw finish.
STATE_DIR_ENV = "TFPS_TASK_STATE_DIR"


def _exit_code(rc: int) -> ExitCode | int:
    """The task's exit code as an ExitCode; 128+N (as a shell reports it) for death by signal N."""
    if rc < 0:
        return 128 - rc
    try:
        return ExitCode(rc)
    except ValueError:
        return rc


def supervise(argv: list[str], restarts: int, name: str) -> ExitCode | int:
    """Run ``tfps <argv>`` as a child and start it again when a signal kills it.

    Only deaths by a signal nobody sent through this process count (SIGKILL from the OOM
    killer, SIGSEGV, ...): an exit code is the task's own verdict (1 failed, 2 bad input,
    130/143/129 stopped) and is returned as it is. SIGTERM, SIGINT and SIGHUP are passed on
    to the task, which then saves and exits as usual; nothing is restarted after them. The
    task runs in a process group of its own, so a signal to this process's group reaches it
    once, through this forward (``_child_preexec``).
    """
    state_dir = tempfile.mkdtemp(prefix=f"tfps-{name}-")
    try:
        return _supervise(argv, restarts, name, {**os.environ, SUPERVISED_ENV: "1", STATE_DIR_ENV: state_dir})
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)


def _child_preexec() -> None:  # the task process, between fork and exec
    """The task process in a process group of its own, dying with its supervisor.

    A stop signal sent to the supervisor's group (``tfps local`` ending a task, ``timeout``,
    a terminal's Ctrl-C) then reaches the task once, through the supervisor's forward. In
    the supervisor's group it came twice, directly and forwarded, and a supervisor slow to
    forward on a loaded machine (more than the stop window) made one stop read as a
    deliberate second one: the task exited 137 without its final save (issue 51's chaos
    job). Out of the group, a SIGKILL of the group no longer reaches it: PR_SET_PDEATHSIG
    ends it with its supervisor. SIGTTOU is ignored so that a task writing to a terminal
    set to ``tostop`` is not stopped for being outside the foreground group."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)


_PR_SET_PDEATHSIG = 1


def _supervise(argv: list[str], restarts: int, name: str, env: dict[str, str]) -> ExitCode | int:
    cmd = [sys.executable, "-m", "tfps", *argv]
    state = {"child": None, "stopping": 0}

    def forward(signum, _frame):
        state["stopping"] = state["stopping"] or signum
        if state["child"] is not None and state["child"].poll() is None:
            state["child"].send_signal(signum)

    for sig in STOP_SIGNALS:
        signal.signal(sig, forward)
    attempt = 0
    deaths: list[dict] = []   # every death so far, for the job's story (tfps.outcome.journal)
    while True:
        state["child"] = subprocess.Popen(cmd, env=env, process_group=0, preexec_fn=_child_preexec)
        if state["stopping"]:   # it came while the process was being started: forwarded to none
            state["child"].send_signal(state["stopping"])
        while True:
            try:
                rc = state["child"].wait()
                break
            except InterruptedError:
                continue
        if rc >= 0 or state["stopping"] or attempt >= restarts:
            if rc < 0:
                log.error("%s: the task process was killed by %s; not restarting it (%s)", name,
                          signal.Signals(-rc).name, "stop requested" if state["stopping"] else
                          f"--restarts {restarts} used up")
            return _exit_code(rc)
        attempt += 1
        # The next process tells the job's story (tfps.outcome.journal): why this one ended.
        env[RESTART_CAUSE_ENV] = signal_cause(-rc)
        env[RESTART_SIGNAL_ENV] = str(-rc)
        deaths.append({"time": round(time.time(), 3), "signal": -rc})
        env[RESTART_DEATHS_ENV] = json.dumps(deaths, separators=(",", ":"))
        log.warning("%s: the task process was killed by %s; starting it again (%d/%d)", name,
                    signal.Signals(-rc).name, attempt, restarts)
        time.sleep(timeouts.RESTART_DELAY_SECS)
        if state["stopping"]:   # a stop came while no task process ran: none is started again
            log.warning("%s: stopped by %s before the task process was started again", name,
                        signal.Signals(state["stopping"]).name)
            return stopped_code(state["stopping"])
