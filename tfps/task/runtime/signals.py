"""Stop signals and the task's end: one stop however it is sent, and an exit at once when needed.

A task turns SIGTERM, SIGINT and SIGHUP into a stop request (``StopSignal``), so the chief's
final checkpoint and export still happen; signals that arrive within the stop window of the
first are the same stop (``StopWindow``, which the launcher uses too), and a deliberate
second one ends the task at once (``exit_now``). A helper thread left inside TensorFlow
makes the process end without the interpreter's shutdown (``left_in_tensorflow``).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time

from tfps import timeouts
from tfps.errors import real_os_exit
from tfps.exitcodes import ExitCode, stopped_code

log = logging.getLogger("tfps")


_abandoned_rpc = False


def abandon_rpc() -> None:
    """A thread is left blocked in TensorFlow (an end RPC to a ps that has gone)."""
    global _abandoned_rpc
    _abandoned_rpc = True


def left_in_tensorflow(thread: threading.Thread, bound: float) -> bool:
    """Wait up to ``bound`` seconds for a helper thread that calls TensorFlow (a non-chief's
    watch for the job's end) to end; if it has not, it is abandoned (:func:`abandon_rpc`)
    and the process ends without the interpreter's shutdown.

    A daemon thread whose TensorFlow call returns while the interpreter shuts down is
    ended by it from inside TensorFlow's C++ frames, which abort the process ("terminate
    called ... FATAL: exception not rethrown", exit -6) after a job that succeeded.
    Returns True when the thread was abandoned."""
    thread.join(bound)
    if not thread.is_alive():
        return False
    log.debug("%s is still in TensorFlow after %.1f s: the process ends without waiting for it",
              thread.name, bound)
    abandon_rpc()
    return True


def rpc_abandoned() -> bool:
    """True when the process must end without the interpreter's shutdown, which could wait
    on (or tear TensorFlow down under) the abandoned thread."""
    return _abandoned_rpc


#: The signals that stop a job: SIGTERM (``docker stop``, ``timeout``, Slurm), SIGINT (Ctrl-C)
#: and SIGHUP (a closed terminal or SSH session; ``nohup`` for a job that must outlive it).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class StopWindow:
    """One stop however it is sent: which of the stop signals that reach a process are new.

    ``timeout`` and CI runners signal a process and then its whole group, and Ctrl-C reaches
    every process of the terminal's foreground group, milliseconds apart: a launcher and
    its tasks see two signals for one stop. Every signal within ``window`` seconds of the
    first is that same stop; one after it is a deliberate second signal ("now, please"),
    which ends everything at once. Pure, so the launcher and every task judge alike.
    """

    def __init__(self, window: float = timeouts.STOP_WINDOW_SECS, clock=time.monotonic):
        self.window, self.clock = window, clock
        self.first_signum: int | None = None
        self.first_at: float | None = None
        self.count = 0

    def note(self, signum: int) -> str:
        """``"first"``, ``"same"`` (within the window: the same stop) or ``"second"``."""
        now = self.clock()
        self.count += 1
        if self.first_at is None:
            self.first_signum, self.first_at = int(signum), now
            return "first"
        return "same" if now - self.first_at <= self.window else "second"

    @property
    def signame(self) -> str:
        return signal.Signals(self.first_signum).name if self.first_signum else ""

    def since_first(self) -> float:
        return self.clock() - self.first_at if self.first_at is not None else 0.0


class StopSignal:
    """SIGTERM, SIGINT and SIGHUP become a stop request instead of killing the process mid-save.

    Signals within the stop window of the first are the same stop (:class:`StopWindow`); a
    deliberate second one after it ends the task at once, without its final save, with
    ``ExitCode.KILLED``. The exit code of a task that stopped is the first signal's
    (:meth:`exit_code`: 130, 143 or 129).

    Python runs a signal handler in the main thread only, between two bytecodes: a main
    thread waiting inside TensorFlow (a sync step's wait for its token, a dequeue from a ps)
    would take neither signal until that call returns, maybe never. So each signal is judged
    as it arrives by a watcher thread that reads the signal wakeup fd (``signal.set_wakeup_fd``,
    written by the interpreter's C handler at once); the Python handler then has nothing left
    to do. Where no wakeup fd can be set (not the main thread), the handler judges."""

    def __init__(self) -> None:
        self.window = StopWindow()
        self._event = threading.Event()
        self._lock = threading.Lock()
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)
        self._watched = _watch_wakeups(self)

    def _handle(self, signum, _frame) -> None:
        if not (self._watched and _watcher is not None and _watcher.is_alive()):
            self.judge(signum)

    def judge(self, signum: int) -> None:
        """A stop signal arrived: a stop request, the same stop, or a second signal (exit now)."""
        with self._lock:
            name = signal.Signals(signum).name
            seen = self.window.note(signum)
            if seen == "second":
                log.warning("received %s %.1f s after %s, past the %.0f s window of one stop: exiting now, "
                            "without the final save (exit 137)", name, self.window.since_first(), self.window.signame,
                            self.window.window)
                exit_now(ExitCode.KILLED)
            self._event.set()
            if seen == "first":
                log.warning("received %s: finishing the current step, then the final save", name)
            else:
                log.info("received %s again within %.0f s: the same stop", name, self.window.window)

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    @property
    def count(self) -> int:
        return self.window.count

    @property
    def first_at(self) -> float | None:
        return self.window.first_at

    @property
    def signame(self) -> str:
        return self.window.signame

    def exit_code(self) -> ExitCode:
        """The code of a task stopped by this request: 128 + the first signal's number."""
        return stopped_code(self.window.first_signum)


#: The StopSignal the wakeup watcher reports to (the newest; one watcher per process).
_watched_stop: StopSignal | None = None
_watcher: threading.Thread | None = None


def _watch_wakeups(stop: StopSignal) -> bool:
    """Judge every stop signal in a thread as it arrives (see :class:`StopSignal`): the signal
    wakeup fd's bytes are the numbers of the signals caught. False where Python allows no
    wakeup fd (not the main thread)."""
    global _watched_stop, _watcher
    if _watcher is None:
        if threading.current_thread() is not threading.main_thread():
            return False
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)
        try:
            signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        except (ValueError, OSError):
            os.close(read_end)
            os.close(write_end)
            return False
        _watcher = threading.Thread(target=_read_wakeups, args=(read_end,), name="tfps-signals", daemon=True)
        _watcher.start()
    _watched_stop = stop
    return True


def _read_wakeups(fd: int) -> None:
    stops = {int(s) for s in STOP_SIGNALS}
    while True:
        try:
            data = os.read(fd, 64)
        except InterruptedError:
            continue
        except OSError:
            return
        if not data:
            return
        for signum in data:
            if signum in stops and _watched_stop is not None:
                _watched_stop.judge(signum)


def exit_now(code: int) -> None:
    """End the process at once, logs and stdio flushed, without the interpreter's shutdown (a
    deliberate second stop signal; a thread abandoned inside TensorFlow)."""
    try:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        real_os_exit(int(code))
