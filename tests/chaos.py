"""A seeded fault injector: many faults at random times to random tasks of one running job.

A test helper, not a product feature (issue 51). ``Chaos`` draws, from its seed, a schedule
of faults (which task, which kind, the pause before it) and sends them from a thread of its
own while the job runs:

* ``SIGKILL``: the task's training process dies (as the OOM killer would kill it); its
  ``tfps run --restarts`` supervisor starts it again;
* ``SIGSTOP``: the task's training process is frozen for a few seconds, then ``SIGCONT``;
* with compose, ``docker kill`` and ``docker pause``/``unpause`` of the task's container
  (``find`` and ``send`` are given by the test: the injector knows nothing of launchers).

Every task is drawn at least once for a kill (the chief included), the rest at random. It
watches a log while it runs (``lines``) and stamps every new line with the time it
appeared, so that the test can tell, per fault, when the job recovered from it
(``Fault.recover_s``) and what it lost (``Fault.steps_lost``, from results.json).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import random
import re
import signal
import threading
import time
from collections.abc import Callable

KILL, STOP = "SIGKILL", "SIGSTOP"


@dataclasses.dataclass
class Fault:
    """One fault of the schedule, and what became of it."""

    task: str
    kind: str
    gap_s: float                 # the pause before it (after the previous fault)
    hold_s: float = 0.0          # SIGSTOP: how long the task stays frozen
    at: float | None = None      # monotonic time it was sent
    wall: float | None = None
    pid: int | None = None
    step: int | None = None      # the job's newest progress step when it was sent
    recover_s: float | None = None
    steps_lost: int | None = None
    how: str = ""                # results.json's ``how``, or what the test read
    note: str = ""


def schedule(seed: int, tasks: list[str], kills: int, stops: int, gap: tuple[float, float],
             hold: tuple[float, float], kill_tasks: list[str] | None = None,
             max_kills: int | None = None) -> list[Fault]:
    """``kills + stops`` faults: each task of ``kill_tasks`` (default: every task) killed at
    least once, the rest drawn at random (the kills from ``kill_tasks``, at most ``max_kills``
    per task: a container's restart policy gives up after so many)."""
    rng = random.Random(seed)
    killed = kill_tasks or tasks
    assert kills >= len(killed), "every task gets at least one kill"
    assert max_kills is None or kills <= max_kills * len(killed), "more kills than the tasks may take"
    drawn = list(killed)
    for _ in range(kills - len(killed)):
        task = rng.choice(killed)
        while max_kills is not None and drawn.count(task) >= max_kills:
            task = rng.choice(killed)
        drawn.append(task)
    kinds = [(t, KILL) for t in drawn] + [(rng.choice(tasks), STOP) for _ in range(stops)]
    rng.shuffle(kinds)
    return [Fault(task, kind, round(rng.uniform(*gap), 2), round(rng.uniform(*hold), 2) if kind == STOP else 0.0)
            for task, kind in kinds]


class Chaos:
    """Sends ``faults`` from a thread; ``find(task)`` gives the pid (or container) to hit now,
    ``send(target, kind)`` hits it (default: ``os.kill`` with the kind's signal), ``step()``
    the job's newest step, ``alive()`` whether the job still runs."""

    def __init__(self, faults: list[Fault], find: Callable[[str], object | None], step: Callable[[], int | None],
                 alive: Callable[[], bool], send: Callable[[object, str], None] | None = None,
                 resume: Callable[[object], None] | None = None, find_timeout: float = 120.0):
        self.faults, self.find, self.step, self.alive = faults, find, step, alive
        self.send = send or (lambda pid, kind: os.kill(pid, getattr(signal, kind)))
        self.resume = resume or (lambda pid: os.kill(pid, signal.SIGCONT))
        self.find_timeout = find_timeout
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos", daemon=True)

    @property
    def sent(self) -> list[Fault]:
        return [f for f in self.faults if f.at is not None]

    def start(self) -> Chaos:
        self._thread.start()
        return self

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join(30)
        if self.error is not None:
            raise self.error

    def _target(self, task: str):
        end = time.monotonic() + self.find_timeout
        while not self._stop.is_set() and self.alive():
            target = self.find(task)
            if target is not None:
                return target
            if time.monotonic() > end:
                raise AssertionError(f"chaos: no process of {task} to hit within {self.find_timeout:.0f} s")
            time.sleep(0.1)
        return None

    def _run(self) -> None:
        try:
            for f in self.faults:
                if self._stop.wait(f.gap_s) or not self.alive():
                    return
                target = self._target(f.task)
                if target is None:
                    return
                f.step = self.step()
                f.at, f.wall = time.monotonic(), time.time()
                f.pid = target if isinstance(target, int) else None
                try:
                    self.send(target, f.kind)
                except ProcessLookupError:   # it died between the look and the signal: look again
                    f.at = f.wall = None
                    target = self._target(f.task)
                    if target is None:
                        return
                    f.at, f.wall = time.monotonic(), time.time()
                    self.send(target, f.kind)
                if f.kind == STOP:
                    time.sleep(f.hold_s)
                    try:
                        self.resume(target)
                    except ProcessLookupError:
                        f.note = "gone before SIGCONT"
        except BaseException as e:  # noqa: BLE001 - the test raises it from join()
            self.error = e


class StampedLog:
    """A growing log read from a thread: every new line with the monotonic time it was seen."""

    def __init__(self, read: Callable[[], str], every: float = 0.1):
        self.read, self.every = read, every
        self.lines: list[tuple[float, str]] = []
        self._seen = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stamped-log", daemon=True)

    def start(self) -> StampedLog:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._take()

    def _take(self) -> None:
        text = self.read()
        end = text.rfind("\n") + 1
        if end > self._seen:
            now = time.monotonic()
            self.lines += [(now, line) for line in text[self._seen:end].splitlines()]
            self._seen = end

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self._take()

    def first_after(self, t: float, pattern: str) -> tuple[float, re.Match] | None:
        rx = re.compile(pattern)
        for when, line in self.lines:
            if when > t:
                m = rx.search(line)
                if m:
                    return when, m
        return None


def render(title: str, faults: list[Fault]) -> str:
    """The per-fault table: task, kind, when, the step then, seconds to recover, steps lost."""
    t0 = min((f.at for f in faults if f.at is not None), default=0.0)
    head = ("#", "task", "fault", "at s", "step", "recover s", "steps lost", "how", "note")
    body = [(str(i + 1), f.task, f.kind + (f" {f.hold_s:.1f}s" if f.kind == STOP else ""),
             "-" if f.at is None else f"{f.at - t0:.1f}", "-" if f.step is None else str(f.step),
             "-" if f.recover_s is None else f"{f.recover_s:.1f}",
             "-" if f.steps_lost is None else str(f.steps_lost), f.how, f.note) for i, f in enumerate(faults)]
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    lines = ["  ".join(x.ljust(w) for x, w in zip(row, widths)).rstrip() for row in [head, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join([title, *lines]) + "\n"


def summary(faults: list[Fault], kind_of: Callable[[Fault], str] | None = None) -> str:
    """One line per kind of fault (default: the kind and, for a kill, the task): how many were
    sent, seconds to recover (min / median / max) and steps lost (total / max)."""
    kind_of = kind_of or (lambda f: f"{f.kind} {f.task}" if f.kind == KILL else f.kind)
    groups: dict[str, list[Fault]] = {}
    for f in faults:
        if f.at is not None:
            groups.setdefault(kind_of(f), []).append(f)
    lines = []
    for name, group in sorted(groups.items()):
        secs = sorted(f.recover_s for f in group if f.recover_s is not None)
        lost = [f.steps_lost for f in group if f.steps_lost is not None]
        took = (f"recover {secs[0]:.1f} / {secs[len(secs) // 2]:.1f} / {secs[-1]:.1f} s (min / median / max)"
                if secs else "recovery not seen")
        steps = f"steps lost {sum(lost)} in all, at most {max(lost)}" if lost else "steps lost not known"
        lines.append(f"{name}: {len(group)} sent, {len(secs)} recovered, {took}, {steps}")
    return "\n".join(lines) + "\n"


#: What a task says when a timer of tfps ends it or gives up on another task (docs/faults.md,
#: "Timers that can end a task"): a chaos job fails on any of these lines.
TIMER_FIRED = (r"--startup_timeout|trained no step for|did not start within|not restarting it|"
               r"exiting now, without the final save|restoring the newest checkpoint|exited with .* while the job runs|"
               r"ending tasks that did not exit by themselves")


def must_be_listed(sent: list[Fault], chief: str) -> collections.Counter:
    """The crashes (kills no supervisor saw) results.json must list, task by task: each the job
    recovered from before the next kill of the same task, with the chief up meanwhile (no kill
    of the chief in between). The chief learns of such a crash from the task, once (two
    crashes before it noticed the first are one entry) and not while it is itself down
    (docs/faults.md, "What results.json says")."""
    kills = [f for f in sent if f.kind == KILL]
    out: collections.Counter = collections.Counter()
    for f in kills:
        if f.task == chief or f.recover_s is None:
            continue
        back = f.at + f.recover_s
        if not any(g is not f and f.at <= g.at <= back and g.task in (f.task, chief) for g in kills):
            out[f.task] += 1
    return out
