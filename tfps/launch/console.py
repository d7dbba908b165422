"""What ``tfps local`` shows while a job runs.

On a terminal (and without ``-v``): one live status line for the whole job, drawn with
``rich``: the global step of the total with a bar, the chief's smoothed loss and running
metrics, the job's progressive validation (``prog. auc ... log_loss ...``), the job's
examples/s, the ETA and the slowest worker's lag. The tasks' per-worker progress lines are
left out; every other line of theirs (warnings, errors, the chief's saves) and the
launcher's own are printed above the status line as they come, and the end summary after
it, in full.

Anywhere else (a file, a pipe: logs, CI, containers) or with ``-v``: every line of every
task, prefixed with its name (``[worker1] ...``), as before; no escape codes.

The source of the status line is ``status.json``, which the chief's watch rewrites in its
model_dir every few seconds (``tfps.task.monitor.watch.JobWatch.status``). The chief already reads
every worker's board on ps 0 for its stall and progress messages: the job's step, each
worker's rate and step are known there and nowhere else. Parsing the workers' progress
lines instead would give each worker's view at its own log interval (stale by up to
``--log_steps`` steps, and tied to their wording); history.jsonl has the chief's records
only, without the other workers' rates or lags.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time

from tfps.outcome import results
from tfps.outcome.contract import has_total, progressive_line, step_of

#: A task's per-worker progress line (tfps.task.runtime.hooks.ProgressHook), as the launcher reads it.
PROGRESS_LINE = re.compile(r"^\[worker\d+\] \d\d:\d\d:\d\d I worker\d+: step \d+/\d+")
#: Seconds without a step after which the status line names a worker as idle.
IDLE_SECS = 10.0
#: Width of the status line's bar, in characters.
BAR_WIDTH = 20


def is_terminal(out) -> bool:
    try:
        return bool(out.isatty()) and os.environ.get("TERM", "") != "dumb"
    except (AttributeError, ValueError):
        return False


def _seconds(s: float) -> str:
    s = max(int(round(s)), 0)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def _rate(x: float) -> str:
    return f"{x / 1000:.1f}k" if x >= 1000 else f"{x:.0f}"


def status_text(status: dict | None, now: float, started: float, tasks: str = "") -> str:
    """The status line's words after its bar (or, before the chief's first status, what starts)."""
    if not status:
        return f"starting {tasks} ({_seconds(now - started)})".replace("  ", " ")
    parts = []
    phase = status.get("phase")
    if phase == "final save":
        parts.append("final save: checkpoint and export…")
    elif phase not in (None, "training"):
        parts.append(str(phase))   # the job's end: succeeded, stopped, failed
    if isinstance(status.get("loss"), (int, float)):
        parts.append(f"loss {status['loss']:.4f}")
    for k, v in sorted((status.get("metrics") or {}).items()):
        if isinstance(v, (int, float)):
            parts.append(f"{k} {v:.4f}")
    scored = progressive_line(status.get("progressive")).split(" over ")[0]
    if scored:   # the job's last window, each batch scored before it trained
        parts.append(scored.replace("progressive", "prog.", 1))
    if status.get("examples_per_sec"):
        parts.append(f"{_rate(status['examples_per_sec'])} ex/s")
    if (phase in (None, "training") and isinstance(status.get("eta_s"), (int, float))
            and has_total(int(status.get("train_steps") or 0))):
        parts.append(f"ETA {_seconds(status['eta_s'] - max(now - status.get('time', now), 0))}")
    if phase in (None, "training"):
        lag = slowest_worker(status, now)
        if lag:
            parts.append(lag)
    parts.append(_seconds(now - started))
    return "  ".join(parts)


def slowest_worker(status: dict, now: float) -> str:
    """The slowest worker's lag: one whose steps stopped moving (``worker1 no step for 12 s``),
    else the one with the fewest examples/s and how far below the workers' mean it is
    (``slowest worker1 -18%``). The chief reads the boards every few seconds, so a worker
    counts as idle only after ``IDLE_SECS``."""
    workers = {k: w for k, w in (status.get("workers") or {}).items() if isinstance(w, dict)}
    if len(workers) < 2:
        return ""
    age = max(now - status.get("time", now), 0.0)
    name, w = max(workers.items(), key=lambda kv: (kv[1].get("idle_s", 0), kv[0]))
    idle = float(w.get("idle_s", 0)) + age
    if idle >= IDLE_SECS:
        return f"{name} no step for {idle:.0f} s"
    rates = {k: float(w.get("examples_per_sec", 0) or 0) for k, w in workers.items()}
    mean = sum(rates.values()) / len(rates)
    if mean <= 0:
        return ""
    name = min(rates, key=lambda k: (rates[k], k))
    return f"slowest {name} {100 * (rates[name] - mean) / mean:+.0f}%"


class JobConsole:
    """The launcher's console for one job: ``out`` is what the tasks' lines are written to."""

    def __init__(self, model_dir: str, out, live: bool, launched: float, tasks: str = ""):
        self.model_dir, self.real_out, self.launched, self.tasks = model_dir, out, launched, tasks
        self.live = live
        self.status: dict | None = None
        self._mtime = 0.0
        self._live = None
        self._console = None
        self.out = _Lines(self) if live else out

    # ------------------------------------------------------------------ the live line
    def __rich__(self):
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text
        st = self.status
        if st is None and self._live is None:
            return Text("")   # ended before the chief's first status: no "starting" line left behind
        grid = Table.grid(padding=(0, 1))
        text = status_text(st, time.time(), self.launched, self.tasks)
        if not st:
            grid.add_row(Text(text))
            return grid
        step, total = int(st.get("step", 0)), int(st.get("train_steps", 0) or 0)
        if not has_total(total):   # a followed job: no last step, so no bar and no percentage
            grid.add_row(Text(f"step {step_of(step, total)}", style="bold"),
                         Text(text, no_wrap=True, overflow="ellipsis"))
            return grid
        grid.add_row(Text(f"step {step_of(step, total)}", style="bold"),
                     ProgressBar(total=max(total, 1), completed=min(step, total), width=BAR_WIDTH),
                     Text(f"{100 * min(step, total) / max(total, 1):3.0f}%"),
                     Text(text, no_wrap=True, overflow="ellipsis"))   # one line, cut on a narrow terminal
        return grid

    def start(self) -> None:
        if not self.live:
            return
        from rich.console import Console
        from rich.live import Live
        self._console = Console(file=self.real_out, highlight=False, markup=False, emoji=False)
        # stderr (the launcher's log lines: tfps.logs writes to whatever sys.stderr is) goes
        # above the line too when it is the terminal as well (``2>file`` keeps its file);
        # stdout is ours (the tasks' lines, through ``print_line``).
        self._live = Live(self, console=self._console, refresh_per_second=4, transient=False,
                          redirect_stdout=False, redirect_stderr=is_terminal(sys.stderr))
        self._live.start()

    def tick(self) -> None:
        """Read status.json when the chief has rewritten it (the launcher's watch loop)."""
        if not self.live:
            return
        try:
            mtime = os.stat(os.path.join(self.model_dir, results.STATUS)).st_mtime
        except OSError:
            return
        if mtime == self._mtime:
            return
        found = results.read_status(self.model_dir)
        if found and found.get("time", 0) >= self.launched - 1:   # this launch's chief wrote it
            self._mtime, self.status = mtime, found

    def stop(self) -> None:
        """End the live line: its last state stays on the screen, the summary goes below it."""
        if self._live is None:
            return
        self.tick()
        live, self._live = self._live, None
        try:
            live.refresh()   # its last state (or nothing, when the chief never reported one)
            live.stop()
        except (OSError, ValueError):
            pass   # the terminal has closed (SIGHUP)

    def print_line(self, line: str) -> None:
        from rich.text import Text
        if PROGRESS_LINE.match(line):
            return   # per-worker progress: the status line shows the job (-v shows these)
        console = self._console
        if console is None or self._live is None:
            self.real_out.write(line + "\n")
            self.real_out.flush()
            return
        console.print(Text(line), soft_wrap=True)


class _Lines:
    """A file-like object for the tasks' output threads: each whole line goes to the console."""

    def __init__(self, view: JobConsole):
        self.view = view
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            for line in text.splitlines():
                self.view.print_line(line)
        return len(text)

    def flush(self) -> None:
        pass
