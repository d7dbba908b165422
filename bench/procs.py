"""The processes a bench starts, and how none of them outlives it.

Every process the bench starts goes through ``spawn`` (or ``sh``): it gets a session and
process group of its own, so that its children (a classic ps blocked in ``server.join()``,
the tasks ``tfps local`` forks, TF2's servers) can be found and ended with it. ``install``
makes SIGTERM, SIGINT and SIGHUP end every process the bench started (their groups and
every descendant, which may have a session of its own: ``tfps run`` tasks call setsid)
before the bench exits 128 + the signal. Issue 52: a bench stopped by ``timeout`` had left
a classic ps running 40 minutes later.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": ROOT, "PYTHONUNBUFFERED": "1"}
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

#: Every process started through ``spawn`` that may still run.
_STARTED: list[subprocess.Popen] = []
_LOCK = threading.Lock()


class OutOfTime(Exception):
    """A run did not end before its section's budget ran out (it was ended)."""


def spawn(argv, env=None, **kw) -> subprocess.Popen:
    """Start ``argv`` in a session of its own, output piped (stderr into stdout), recorded
    so that ``end_all`` ends it and its descendants."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                         env=env or ENV, cwd=ROOT, start_new_session=True, errors="replace", **kw)
    with _LOCK:
        _STARTED.append(p)
    return p


def parents() -> dict[int, int]:
    """Every process's parent pid, from /proc (processes that end while it reads are left out)."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as fh:
                out[int(d)] = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return out


def descendants(pid: int) -> list[int]:
    """``pid``'s children, grandchildren and so on (from /proc), whatever their session."""
    children: dict[int, list[int]] = {}
    for child, ppid in parents().items():
        children.setdefault(ppid, []).append(child)
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def end(p: subprocess.Popen) -> None:
    """End ``p``, its process group and every descendant of it (SIGKILL), and reap it."""
    if p.poll() is None:
        pids = [p.pid, *descendants(p.pid)]
        for pid in pids:             # stop first, so that nothing forks or re-parents meanwhile
            _signal(pid, signal.SIGSTOP)
        groups = {g for g in (_pgid(pid) for pid in pids) if g}
        for g in groups:
            try:
                os.killpg(g, signal.SIGKILL)
            except OSError:
                pass
        for pid in pids:
            _signal(pid, signal.SIGKILL)
    else:   # its group may outlive it (a classic ps started by a script that has exited)
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
    try:
        p.wait(30)
    except subprocess.TimeoutExpired:
        pass
    with _LOCK:
        if p in _STARTED:
            _STARTED.remove(p)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def end_all() -> None:
    """End every process the bench started that may still run."""
    with _LOCK:
        started = list(_STARTED)
    for p in started:
        end(p)


def install() -> None:
    """SIGTERM, SIGINT and SIGHUP end every process the bench started, then the bench
    (exit 128 + the signal); figures already measured are in the results file."""
    def stop(signum, _frame):
        for s in STOP_SIGNALS:           # a second signal (Ctrl-C then timeout's TERM) changes nothing
            signal.signal(s, signal.SIG_IGN)
        print(f"bench: stopped by signal {signum}; ending every process it started", file=sys.stderr, flush=True)
        end_all()
        os._exit(128 + signum)
    for s in STOP_SIGNALS:
        signal.signal(s, stop)


def sh(argv, timeout=900, env=None, deadline: float | None = None) -> subprocess.CompletedProcess:
    """Run ``argv`` to its end (a session of its own, recorded as ``spawn``); stdout and
    stderr separately. Past ``timeout`` or the ``deadline`` (time.time()), it is ended:
    OutOfTime."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                         env=env or ENV, cwd=ROOT, start_new_session=True, errors="replace")
    with _LOCK:
        _STARTED.append(p)
    limit = timeout if deadline is None else max(1.0, min(timeout, deadline - time.time()))
    try:
        out, err = p.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        end(p)
        what = os.path.basename(argv[1]) if len(argv) > 1 else argv[0]
        raise OutOfTime(f"{what} ended after {limit:.0f} s") from None
    finally:
        end(p)
    return subprocess.CompletedProcess(argv, p.returncode, out, err)


class Watched:
    """A process whose output lines are read as they come, each ``pattern`` match timed.

    Start-up counts from the launch for tfps and for the classic script alike: the moment
    a worker's first-step line arrives (a process's own "after start" would leave out the
    interpreter's start and, for ``tfps local``, the launcher's). The pattern's group 1
    names what was seen (a worker)."""

    def __init__(self, argv, pattern: re.Pattern, t0: float, env=None):
        self.pattern, self.t0, self.seen, self.lines, self.arrived = pattern, t0, {}, [], []
        self.popen = spawn(argv, env=env)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.popen.stdout:
            self.arrived.append(time.time())
            self.lines.append(line)
            m = self.pattern.search(line)
            if m and m.group(1) not in self.seen:
                self.seen[m.group(1)] = time.time() - self.t0

    def wait(self, timeout: float, deadline: float | None = None) -> str:
        """Its output once it has ended; ended (OutOfTime) past ``timeout`` or ``deadline``."""
        limit = timeout if deadline is None else max(1.0, min(timeout, deadline - time.time()))
        try:
            self.popen.wait(limit)
        except subprocess.TimeoutExpired:
            end(self.popen)
            raise OutOfTime(f"still running after {limit:.0f} s") from None
        self.reader.join(10)
        return "".join(self.lines)

    def text(self) -> str:
        return "".join(self.lines)


def task_pids(launcher: int) -> dict[str, int]:
    """The tasks of a `tfps local`: the launcher's children whose command line (the task's
    ``tfps run ... --job_name=ps --task_index=N``, which tfps sets on a forked task) names one."""
    found = {}
    for pid in (child for child, ppid in parents().items() if ppid == launcher):
        try:
            with open(f"/proc/{pid}/cmdline") as fh:
                cmd = fh.read().replace("\0", " ")
        except OSError:
            continue
        m = re.search(r"--job_name=(ps|worker)\b.*--task_index=(\d+)", cmd)
        if m:
            found[m.group(1) + m.group(2)] = pid
    return found


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system) a process has used, None when it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def rss_now(pid: int) -> int:
    """The process's resident size now in bytes (VmRSS), 0 when it cannot be read."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmRSS:"))
    except (OSError, StopIteration, ValueError):
        return 0
