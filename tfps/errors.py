"""Errors a user can fix. Each one says what is wrong and what to change."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import threading


class ConfigError(Exception):
    """Bad input: an inventory, a flag, TF_CONFIG, data files, a model name, a URL.

    The message names the field and tells the user what to change. The CLI prints it
    on one line and exits with ``ExitCode.BAD_CONFIG`` before anything is started.
    """

    def __init__(self, message: str, field: str | None = None):
        self.field = field
        self.message = message  #: without the field: for callers that re-word the error
        super().__init__(f"{field}: {message}" if field else message)


class UserCodeExit(ConfigError):
    """A user's model code tried to end the process (``sys.exit``, ``os._exit``) or raised
    ``KeyboardInterrupt`` with no Ctrl-C behind it: one line, never tfps's exit code."""


class _OsExitCalled(BaseException):
    """``os._exit`` called by user code under :func:`user_code` (a BaseException, so that a
    user's ``except Exception`` cannot swallow it)."""

    def __init__(self, code):
        super().__init__(code)
        self.code = code


#: The interpreter's own ``os._exit``, for tfps's deliberate hard exits (never the guard's).
real_os_exit = os._exit


@contextlib.contextmanager
def user_code(what: str):
    """Run a user's code (a model module's import, a Keras builder, a model_fn) so that it
    cannot decide tfps's outcome by ending the process.

    ``sys.exit(N)`` and ``os._exit(N)`` become :class:`UserCodeExit` naming ``what``, and so
    does a ``KeyboardInterrupt`` that no SIGINT caused (on the main thread, a real Ctrl-C is
    told apart by a handler that notes it, and goes on as a KeyboardInterrupt).
    """
    ctrl_c = []
    previous = None
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        def noted(signum, frame):
            ctrl_c.append(signum)
            signal.default_int_handler(signum, frame)
        previous = signal.signal(signal.SIGINT, noted)

    def refused(code=0):
        raise _OsExitCalled(code)
    os._exit = refused
    try:
        yield
    except SystemExit as e:
        raise UserCodeExit(f"{what} called sys.exit({e.code!r}); a model's code must return (a ModelSpec, or a "
                           "Keras model), not end the process", "model") from None
    except _OsExitCalled as e:
        raise UserCodeExit(f"{what} called os._exit({e.code!r}); a model's code must return (a ModelSpec, or a "
                           "Keras model), not end the process", "model") from None
    except KeyboardInterrupt:
        if ctrl_c:
            raise
        raise UserCodeExit(f"{what} raised KeyboardInterrupt (no Ctrl-C was pressed); a model's code must return "
                           "(a ModelSpec, or a Keras model), not end the process", "model") from None
    finally:
        os._exit = real_os_exit
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


# ----------------------------------------------------------------- a full disk
#: The C library's text of ENOSPC and EDQUOT, as TensorFlow's messages carry it.
_TEXTS = ("No space left on device", "Disk quota exceeded")
_ERRNOS = frozenset({errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)})


class DiskFull(Exception):
    """The job's failure when a disk filled while the chief wrote to it: one line says it all."""


def error_chain(error: BaseException | None):
    """``error`` and the exceptions it was raised from or while handling, newest first."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def is_disk_full(error: BaseException | None) -> bool:
    """Whether ``error`` (or an exception it was raised from) says a disk is full."""
    for e in error_chain(error):
        if isinstance(e, DiskFull):
            return True
        if isinstance(e, OSError) and e.errno in _ERRNOS:
            return True
        text = getattr(e, "message", None) or str(e)
        if isinstance(text, str) and any(t in text for t in _TEXTS):
            return True
    return False


def size_text(nbytes: float) -> str:
    """``0 B``, ``512 B``, ``2.0 MiB``, ``1.5 GiB``."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{int(nbytes)} B"


def _existing(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def disk_text(directory: str) -> str:
    """``0 B free of 2.0 MiB`` for the disk that holds ``directory`` (or ``free space unknown``)."""
    try:
        usage = shutil.disk_usage(_existing(directory))
    except OSError:
        return "free space unknown"
    return f"{size_text(usage.free)} free of {size_text(usage.total)}"


def disk_full_line(directory: str, what: str, need_bytes: float | None, flag: str) -> str:
    """The one line of a full disk: which disk, how full, what was being written, what it needs."""
    need = f", which needs about {size_text(need_bytes)}" if need_bytes else ""
    return (f"the disk of {os.path.abspath(directory)} is full ({disk_text(directory)}) while writing {what}"
            f"{need}: free space there or give --{flag} on a larger disk")
