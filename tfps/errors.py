"""Errors a user can fix. Each one says what is wrong and what to change."""

from __future__ import annotations

import contextlib
import os
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
