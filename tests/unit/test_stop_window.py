"""One stop however it is sent (tfps.task.runtime.signals.StopWindow, the launcher's exit code).

``timeout`` and CI runners signal a process and then its group, and Ctrl-C reaches the
whole foreground group: the signals of one stop come milliseconds apart, and only a signal
after the window is a deliberate second one. The real jobs are in
tests/integration/test_stops.py; here, the rules.
"""

from __future__ import annotations

import signal

from tfps.exitcodes import STOPPED_CODES, ExitCode, stopped_code
from tfps.launch.processes import _launcher_code
from tfps.task.runtime.signals import StopWindow


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_signals_within_the_window_are_the_same_stop_and_a_later_one_is_a_second():
    clock = Clock()
    w = StopWindow(window=2.0, clock=clock)
    assert w.note(signal.SIGINT) == "first"
    clock.now += 0.02                       # the group's copy of the same signal
    assert w.note(signal.SIGINT) == "same"
    clock.now += 1.9                        # a second Ctrl-C within the window: still the same stop
    assert w.note(signal.SIGTERM) == "same"
    clock.now += 0.2
    assert w.note(signal.SIGINT) == "second"
    assert w.signame == "SIGINT" and w.count == 4


def test_a_stops_exit_code_is_its_first_signals():
    assert stopped_code(signal.SIGINT) == ExitCode.STOPPED == 130
    assert stopped_code(signal.SIGTERM) == ExitCode.STOPPED_TERM == 143
    assert stopped_code(signal.SIGHUP) == ExitCode.STOPPED_HUP == 129
    assert ExitCode.KILLED not in STOPPED_CODES and ExitCode.KILLED != 130


def _window(first: int | None) -> StopWindow:
    w = StopWindow()
    if first:
        w.note(first)
    return w


def test_the_launchers_exit_code():
    # A chief stopped by the launcher's SIGINT exits 130; the launcher got SIGTERM: 143.
    assert _launcher_code(130, _window(signal.SIGTERM), False, True, False) == 143
    assert _launcher_code(129, _window(signal.SIGHUP), False, True, False) == 129
    # A deliberate second signal killed everything: never a stop's code.
    assert _launcher_code(-9, _window(signal.SIGINT), True, False, False) == ExitCode.KILLED
    assert _launcher_code(130, _window(signal.SIGINT), True, True, False) == ExitCode.KILLED
    # A chief that exited 0 without its results did not succeed (a model that ended the process).
    assert _launcher_code(0, _window(None), False, False, False) == ExitCode.TRAINING_FAILED
    assert _launcher_code(0, _window(None), False, True, False) == ExitCode.OK
    # A task that vanished with nobody stopping it.
    assert _launcher_code(-9, _window(None), False, False, False) == ExitCode.TASK_LOST
