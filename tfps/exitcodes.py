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
    #: A tfps bug: an exception escaped a task (``tfps local``'s forked task); the traceback is in its log.
    INTERNAL = 70
    #: Stopped by SIGTERM/SIGINT; the chief still wrote its final checkpoint and export.
    STOPPED = 130
