"""Process exit codes of every tfps command. Orchestrators key off them."""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    #: The job (or command) succeeded; for the chief: final checkpoint and export written.
    OK = 0
    #: Training failed (model error, NaN loss, lost peers past the timeout, ...).
    TRAINING_FAILED = 1
    #: Bad configuration: nothing was started. The message says what to change.
    BAD_CONFIG = 2
    #: A task of the job could not start or vanished (``tfps local`` only).
    TASK_LOST = 3
    #: ``tfps deploy/stop/status/cleanup``: a host could not be reached over SSH (ansible-playbook's own 4).
    HOST_UNREACHABLE = 4
    #: A tfps bug: an exception escaped a task (``tfps local``'s forked task); the traceback is in its log.
    INTERNAL = 70
    #: Stopped by SIGHUP (a closed terminal or SSH session); the chief still wrote its final
    #: checkpoint and export.
    STOPPED_HUP = 129
    #: Stopped by SIGINT (Ctrl-C); the chief still wrote its final checkpoint and export.
    STOPPED = 130
    #: A deliberate second signal, after the first's window (``timeouts.STOP_WINDOW_SECS``),
    #: stopped everything at once: no final checkpoint, no export.
    KILLED = 137
    #: Stopped by SIGTERM (``docker stop``, ``timeout``, a process manager); the chief still
    #: wrote its final checkpoint and export.
    STOPPED_TERM = 143


#: The exit code of a stop (128 + the signal's number, as a shell reports it) by the signal
#: that asked for it.
_STOPPED_BY = {1: ExitCode.STOPPED_HUP, 2: ExitCode.STOPPED, 15: ExitCode.STOPPED_TERM}
#: Every code that means "stopped, and the final save was written".
STOPPED_CODES = frozenset(_STOPPED_BY.values())


def stopped_code(signum: int | None) -> ExitCode:
    """The exit code of a job or task stopped by ``signum`` (SIGINT when unknown)."""
    return _STOPPED_BY.get(int(signum or 2), ExitCode.STOPPED)
