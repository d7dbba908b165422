"""Helpers for the integration tests: real clusters as processes, and nothing left behind.

Every cluster is driven through the real command line (``python -m tfps ...``) as
subprocesses in their own sessions, with their output in a log file that tests read while
the job runs. A ``Processes`` registry remembers every process it started and, through a
watcher thread, every descendant of those processes (the tasks that ``tfps local``
starts run in sessions of their own); teardown kills all of them by process group.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tfps.task.output.checkpoint import checkpoint_step as step_of_checkpoint

REPO = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- /proc
def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, start time) of a process, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            text = fh.read()
    except OSError:
        return None
    rest = text[text.rindex(")") + 2:].split()
    return rest[0], int(rest[1]), int(rest[19])


def _all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def pids_with_cmdline(fragment: str) -> list[int]:
    """Live (non-zombie) processes whose command line contains ``fragment``."""
    out = []
    for pid in _all_pids():
        if pid == os.getpid() or fragment not in _cmdline(pid):
            continue
        st = _stat(pid)
        if st and st[0] != "Z":
            out.append(pid)
    return out


def cluster_pids(ports: list[int]) -> list[int]:
    """Live processes of a cluster: every task's command line names the ps's host:port."""
    found: set[int] = set()
    for port in ports:
        found.update(pids_with_cmdline(f"127.0.0.1:{port}"))
    return sorted(found)


def maps_tensorflow(pid: int) -> bool:
    with open(f"/proc/{pid}/maps") as fh:
        return "libtensorflow_framework" in fh.read()


def tasks_of(launcher_pid: int, timeout: float) -> dict[str, int]:
    """The launcher's three task processes, by the job and index their command line shows."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = {}
        for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
            st = _stat(pid)
            if not st or st[1] != launcher_pid:
                continue
            cmd = _cmdline(pid)
            for name, flags in (("ps0", "--job_name=ps --task_index=0"), ("worker0", "--job_name=worker --task_index=0"),
                                ("worker1", "--job_name=worker --task_index=1")):
                if flags in cmd:
                    found[name] = pid
        if len(found) == 3:
            return found
        time.sleep(0.1)
    pytest.fail(f"the launcher {launcher_pid} did not show 3 tasks within {timeout} s")


# ----------------------------------------------------------------------------- processes
class Proc:
    """One started process: its log, its exit code and (tracked) descendants."""

    def __init__(self, name: str, argv: list[str], log_path: Path, env: dict[str, str],
                 stderr_path: Path | None = None):
        self.name, self.argv, self.log_path, self.stderr_path = name, argv, log_path, stderr_path
        self._fh = open(log_path, "w")
        self._err = open(stderr_path, "w") if stderr_path else None
        self.popen = subprocess.Popen(argv, stdout=self._fh, stderr=self._err or subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, env=env, cwd=str(REPO), start_new_session=True)
        self.pid = self.popen.pid
        self.started = time.monotonic()
        st = _stat(self.pid)
        #: pid -> start time of this process and every descendant seen while it ran.
        self.family: dict[int, int] = {self.pid: st[2] if st else -1}

    # output ---------------------------------------------------------------
    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def lines(self, pattern: str) -> list[re.Match]:
        rx = re.compile(pattern)
        return [m for m in (rx.search(line) for line in self.output().splitlines()) if m]

    def wait_for(self, pattern: str, timeout: float) -> re.Match:
        """The first line matching ``pattern``; fails if the process exits or time runs out first."""
        rx = re.compile(pattern)
        end = time.monotonic() + timeout
        while True:
            for line in self.output().splitlines():
                m = rx.search(line)
                if m:
                    return m
            if self.popen.poll() is not None:
                pytest.fail(f"{self.name} exited with {self.popen.returncode} before logging /{pattern}/:\n"
                            f"{self.tail()}")
            if time.monotonic() > end:
                pytest.fail(f"{self.name} did not log /{pattern}/ within {timeout} s:\n{self.tail()}")
            time.sleep(0.2)

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path else ""

    def tail(self, n: int = 60) -> str:
        return "\n".join((self.output() + self.stderr()).splitlines()[-n:])

    # lifetime -------------------------------------------------------------
    def wait(self, timeout: float) -> int:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{self.name} still running after {timeout} s:\n{self.tail()}")

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            os.kill(self.pid, sig)

    def alive_family(self) -> list[int]:
        """The process and its known descendants that still run (same pid and start time)."""
        out = []
        for pid, start in list(self.family.items()):   # the watcher thread adds to it
            st = _stat(pid)
            if st and st[0] != "Z" and st[2] == start:
                out.append(pid)
        return out

    def kill(self) -> None:
        for pid in self.alive_family():
            for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
                try:
                    kill()
                except (ProcessLookupError, PermissionError):
                    pass
        try:
            self.popen.wait(10)
        except subprocess.TimeoutExpired:
            pass
        self._fh.close()
        if self._err:
            self._err.close()


class Processes:
    """Starts processes, follows their descendants, kills whatever is left at teardown."""

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self.procs: list[Proc] = []
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, daemon=True)
        self._watcher.start()

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None,
              separate_stderr: bool = False) -> Proc:
        proc = Proc(name, argv, self.log_dir / f"{name}.log", env or base_env(),
                    self.log_dir / f"{name}.stderr" if separate_stderr else None)
        self.procs.append(proc)
        return proc

    def tfps(self, name: str, *args: str, env: dict[str, str] | None = None, separate_stderr: bool = False) -> Proc:
        return self.start(name, [sys.executable, "-m", "tfps", *map(str, args)], env, separate_stderr)

    def _watch(self) -> None:
        while not self._stop.wait(0.5):   # a scan reads every process of the machine
            procs = [p for p in self.procs if p.popen.poll() is None or p.alive_family()]
            if not procs:
                continue
            parents = {}
            for pid in _all_pids():
                st = _stat(pid)
                if st:
                    parents[pid] = (st[1], st[2])
            for p in procs:
                changed = True
                while changed:
                    changed = False
                    for pid, (ppid, start) in parents.items():
                        if ppid in p.family and pid not in p.family:
                            p.family[pid] = start
                            changed = True

    def cleanup(self) -> None:
        self._stop.set()
        self._watcher.join(5)
        for p in self.procs:
            p.kill()


# ----------------------------------------------------------------------------- environment
#: The launcher's progress line while a slow model builder runs its checks before start
#: (tfps.launch.processes._said_when_slow): said in a pipe too, so a loaded machine may add it
#: before a refusal's one line.
SLOW_CHECK_NOTICE = " I tfps local: building the model "


def refusal_lines(stderr: str) -> list[str]:
    """The non-empty lines of a launcher's stderr but the slow-check notice."""
    return [line for line in stderr.splitlines() if line.strip() and SLOW_CHECK_NOTICE not in line]


def base_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    for key in ("TF_CONFIG", "APPRISE_URLS"):   # no cluster or notification from the caller
        env.pop(key, None)
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)   # tfps.logs sets it, the one place that does
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env


# ----------------------------------------------------------------------------- job outcomes
@dataclasses.dataclass
class FinishedJob:
    """A `tfps local` job a module's tests share: its launcher, directory, ports, exit code."""
    proc: Proc
    model_dir: Path
    ports: list[int]
    rc: int

    @property
    def results(self) -> dict:
        return read_results(self.model_dir)


def read_results(model_dir: Path) -> dict:
    path = Path(model_dir) / "results.json"
    assert path.is_file(), f"no results.json in {model_dir}: {sorted(os.listdir(model_dir)) if Path(model_dir).is_dir() else 'no model_dir'}"
    from tfps.outcome.contract import SCHEMA_VERSION, JobResult
    raw = json.loads(path.read_text())
    # Every job's file is a whole record of the schema, and reads back as it was written.
    assert raw.get("schema_version") == SCHEMA_VERSION, raw.get("schema_version")
    assert JobResult.load(str(path)).to_dict() == raw
    return raw


def read_history(model_dir: Path) -> list[dict]:
    path = Path(model_dir) / "history.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def launcher_ports(proc: Proc, timeout: float = 240) -> list[int]:
    """The ports of the tasks ``tfps local`` started, from its first log line.

    A wait, not a bound on start-up: before that line the launcher imports TensorFlow and
    the user's model, checks the data and builds the model's graph for the memory estimate.
    On 2 cores shared with the system tests, a Keras model's launcher has taken over 60 s."""
    m = proc.wait_for(r"tfps local: \d+ ps \+ \d+ worker\(s\) on ([^;]*)(;|$)", timeout)
    return [int(t.rpartition(":")[2]) for t in m.group(1).split(", ")]


def task_exit(proc: Proc, task: str) -> str:
    """What ``tfps local`` said about a task's exit, e.g. ``0 (OK)`` or ``signal SIGTERM``."""
    found = proc.lines(rf"\b{task} exited with (.*)$")
    assert found, f"the launcher did not report how {task} exited:\n{proc.tail()}"
    return found[-1].group(1).strip()


def first_step_secs(proc: Proc, task: str) -> float:
    """Seconds from process start to the task's first training step, as the task logs it."""
    found = proc.lines(rf"{task}: first training step done ([0-9.]+) s after start")
    assert found, f"{task} never logged its first training step:\n{proc.tail()}"
    return float(found[0].group(1))


def load_and_predict(export_dir: str | Path, x):
    """Load the SavedModel like a serving user would and run its default signature."""
    import tensorflow as tf
    loaded = tf.saved_model.load(str(export_dir))
    fn = loaded.signatures["serving_default"]
    out = fn(features=tf.constant(x, dtype=tf.float32))
    return {k: v.numpy() for k, v in out.items()}


def load_csv(path: str):
    import numpy as np
    data = np.loadtxt(path, delimiter=",", skiprows=1, dtype=np.float32)
    return data[:, :-1], data[:, -1].astype(np.int64)


def assert_nothing_left(ports: list[int], *procs: Proc, timeout: float = 10) -> None:
    """No process of the cluster runs any more: neither by command line nor by known pid."""
    end = time.monotonic() + timeout
    while True:
        left = set(cluster_pids(ports))
        for p in procs:
            left.update(p.alive_family())
        if not left:
            return
        if time.monotonic() > end:
            pytest.fail("processes of the cluster still run: " +
                        "; ".join(f"{pid}: {_cmdline(pid)[:200]}" for pid in sorted(left)))
        time.sleep(0.2)


def run_flags(model_dir: Path, *extra: str, steps: int = 300) -> list[str]:
    """Run options every integration job shares: few steps, one TF thread per task."""
    return ["--model_dir", str(model_dir), "--train_steps", str(steps), "--tf_threads", "1",
            "--log_steps", "20", *map(str, extra)]


def checkpoint_step(model_dir: Path) -> int:
    """Global step of the newest checkpoint, from the ``checkpoint`` index file (0 if none)."""
    try:
        text = (model_dir / "checkpoint").read_text()
    except OSError:
        return 0
    m = re.search(r'^model_checkpoint_path: "(.*)"', text, re.M)
    return step_of_checkpoint(m.group(1)) if m else 0


def poll(predicate, timeout: float, what: str, *watch: Proc, interval: float = 0.05):
    """Wait for ``predicate()`` to return something truthy; fail if a watched process exits."""
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        for p in watch:
            if p.returncode is not None:
                pytest.fail(f"{p.name} exited with {p.returncode} while waiting for {what}:\n{p.tail()}")
        if time.monotonic() > end:
            pytest.fail(f"timed out after {timeout} s waiting for {what}:\n" +
                        "\n".join(f"--- {p.name}\n{p.tail(15)}" for p in watch))
        time.sleep(interval)


def task_child(supervisor: Proc) -> int | None:
    """The pid of the task process a ``tfps run --restarts`` supervisor runs now."""
    for pid in supervisor.alive_family():
        st = _stat(pid)
        if pid != supervisor.pid and st and st[1] == supervisor.pid:
            return pid
    return None


def kill_task(supervisor: Proc) -> None:
    """SIGKILL the task process under a ``tfps run --restarts`` supervisor (as the OOM killer would)."""
    pid = poll(lambda: task_child(supervisor), 30, f"the task process of {supervisor.name}", supervisor)
    os.kill(pid, signal.SIGKILL)


def listening_addresses(ports: list[int]) -> dict[int, set[str]]:
    """Local addresses listening on each port, from the kernel's socket tables (IPv4 and IPv6)."""
    import ipaddress
    found: dict[int, set[str]] = {p: set() for p in ports}
    for table, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state = fields[1], fields[3]
            if state != "0A":   # LISTEN
                continue
            addr_hex, port_hex = local.split(":")
            port = int(port_hex, 16)
            if port not in found:
                continue
            raw = bytes.fromhex(addr_hex)
            if v6:
                words = [raw[i:i + 4][::-1] for i in range(0, 16, 4)]
                found[port].add(str(ipaddress.IPv6Address(b"".join(words))))
            else:
                found[port].add(".".join(str(b) for b in raw[::-1]))
    return found


def assert_progressive(model_dir: Path, res: dict, names: set[str]) -> dict:
    """results.json's ``progressive`` block (each batch scored before it trained, the job's last
    window) holds ``names`` as numbers, and TensorBoard's ``progressive`` run has them as
    scalars, its last point at most the job's step. Returns the block."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    block = res.get("progressive")
    assert block and block["examples"] > 0 and block["window"] > 0, res.get("progressive")
    assert all(isinstance(block.get(n), float) for n in names), block
    run = EventAccumulator(str(model_dir / "progressive"))
    run.Reload()
    assert names <= set(run.Tags()["scalars"]), run.Tags()
    last = run.Scalars(sorted(names)[0])[-1]
    assert 0 < last.step <= res["global_step"] + 2, (last, res["global_step"])
    return block
