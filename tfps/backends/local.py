"""The local backend (``tfps local``, ``--local``): a job as processes on this machine.

A local job is its model_dir. ``tfps local`` holds the model_dir's lock for as long as it
runs (``tfps.outcome.lock``: its pid, host and job), and the chief leaves ``status.json``,
``history.jsonl`` and ``results.json`` there. So ``tfps jobs --local`` lists the model_dirs
under ``--dir`` (default ``.`` and ``./runs``, where ``tfps local`` puts them), ``status``
shows one, and ``stop`` sends the launcher SIGTERM: one stop, the chief's final checkpoint
and export first, as Ctrl-C in its terminal. The launcher prints its tasks' lines on its own
terminal and keeps them in ``MODEL_DIR.logs/TASK.log`` too (``tfps.outcome.results.log_dir``),
which ``tfps logs --local`` shows.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import time

from tfps import logs
from tfps.backends import DEFAULT_DIRS
from tfps.backends.protocol import Start, age, print_row, render
from tfps.cluster import Launch, Plan, gpu, local_plan
from tfps.config import from_args
from tfps.errors import ConfigError
from tfps.exitcodes import ExitCode
from tfps.jsonfile import read_json
from tfps.outcome import lock, results
from tfps.outcome.results import HISTORY, RESULTS, RUN_IDENTITY, STATUS, eta_seconds, read_jsonl
from tfps.task import single_threaded_blas
from tfps.task.entry import require_tensorflow

#: A directory is a job's model_dir when it holds one of these (tfps writes them, nobody else).
MARKERS = (RUN_IDENTITY, RESULTS, STATUS, lock.LOCK_FILE)


def job_of(path: str) -> dict | None:
    """The job whose model_dir is ``path``: ``{id, name, model_dir, mtime}``; None if tfps wrote nothing there."""
    marks = [os.path.join(path, m) for m in MARKERS if os.path.exists(os.path.join(path, m))]
    if not marks:
        return None
    path = os.path.abspath(path)
    results = read_json(os.path.join(path, RESULTS))
    identity = read_json(os.path.join(path, RUN_IDENTITY))
    name = (identity.get("run_name") if isinstance(identity, dict) else None) \
        or (results.get("job") if isinstance(results, dict) else None) or os.path.basename(path)
    return {"id": os.path.basename(path), "name": str(name), "model_dir": path,
            "mtime": max(os.path.getmtime(m) for m in marks)}


def find_jobs(dirs: list[str]) -> list[dict]:
    """Every model_dir directly under ``dirs`` (or given itself), oldest first."""
    found: dict[str, dict] = {}
    for d in dirs:
        try:
            children = sorted(e.path for e in os.scandir(d) if e.is_dir())
        except OSError:
            continue
        for path in [d, *children]:
            job = job_of(path)
            if job is not None:
                found[job["model_dir"]] = job
    return sorted(found.values(), key=lambda j: j["mtime"])


def find_job(key: str, dirs: list[str]) -> dict | None:
    """The job ``key`` names: a model_dir (its path, or its name under a --dir), else the newest job of that name."""
    if os.sep in key and os.path.isdir(key):
        return job_of(key)
    jobs = find_jobs(dirs)
    for job in reversed(jobs):
        if key == job["id"]:
            return job
    return next((job for job in reversed(jobs) if job["name"] == key), None)


def row_of(job: dict, now: float | None = None) -> dict:
    """One row of the jobs table for a local job: the lock says whether it runs, its files the rest."""
    now = time.time() if now is None else now
    model_dir = job["model_dir"]
    holder = lock.holder(model_dir)
    status = read_json(os.path.join(model_dir, STATUS))
    status = status if isinstance(status, dict) else {}
    results = read_json(os.path.join(model_dir, RESULTS))
    results = results if isinstance(results, dict) and holder is None else {}
    history = read_jsonl(os.path.join(model_dir, HISTORY))
    newest = history[-1] if history else {}
    total = int(status.get("train_steps") or results.get("train_steps") or 0)
    step = status.get("step", newest.get("step", results.get("global_step", 0)))
    loss = status.get("loss", newest.get("loss", results.get("final_loss")))
    rate = status.get("examples_per_sec") or newest.get("examples_per_sec")
    if holder is not None:
        state = "running"
    elif results:
        state = str(results.get("status"))
    else:
        state = "ended, no results.json"
    eta = status.get("eta_s")
    if eta is None and len(history) > 1 and total:
        eta = eta_seconds(history[-1], history[-2], total)
    started = os.path.getmtime(os.path.join(model_dir, RUN_IDENTITY)) \
        if os.path.exists(os.path.join(model_dir, RUN_IDENTITY)) else None
    return {"job": f"{job['name']} ({job['id']})", "state": state, "step": f"{int(step or 0)}/{total or '?'}",
            "loss": f"{loss:.4f}" if isinstance(loss, (int, float)) else "-",
            "examples/s": f"{rate:.0f}" if isinstance(rate, (int, float)) and rate else "-",
            "started": age(now - started) if started else "-",
            "ETA": f"{eta:.0f} s" if holder is not None and isinstance(eta, (int, float)) else "-",
            "hosts": str((holder or {}).get("host") or socket.gethostname())}


class LocalBackend:
    """Processes on this machine (``tfps.launch.processes``); jobs are the model_dirs under ``dirs``."""

    name = "local"
    option = "--local"

    def __init__(self, dirs: list[str] | None = None):
        self.dirs = list(dirs or DEFAULT_DIRS)

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> LocalBackend:
        return cls(getattr(ns, "dir", None))

    def dry_run(self, plan: Plan, launch: Launch) -> list[Start]:
        """Each task is a process on a free port of this machine, ps first."""
        gpus = [t.gpu for t in plan.tasks if t.job == "worker"]
        num_ps = sum(1 for t in plan.tasks if t.job == "ps")
        here = local_plan(num_ps, len(plan.tasks) - num_ps, gpus=gpus if all(g is not None for g in gpus) else None)
        return [Start(t.name, f"process, {t.target}",
                      (sys.executable, "-m", "tfps", "run", *here.task_ref(t).to_flags(), *launch.run_args))
                for t in here.tasks]

    def submit(self, ns: argparse.Namespace) -> int:
        """``tfps local``: the whole job in the foreground; the chief's outcome is the exit code."""
        from tfps.launch.processes import run_local  # lazy: loads the models and the tasks; only tfps local runs them
        require_tensorflow()
        single_threaded_blas()   # the launcher's checks may load NumPy, and its tasks fork from it
        cfg = from_args(ns)
        if ns.model_dir is None:    # a fresh directory per launch: never resume by accident
            cfg.model_dir = os.path.join("runs", f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}")
        args = list(ns.script_args)
        if args and args[0] == "--":
            args = args[1:]
        if ns.restarts < 0:
            raise ConfigError(f"{ns.restarts} is negative; use 0 (never) or how many times to restart", "restarts")
        if ns.restarts and ns.script:
            raise ConfigError("restarts tfps's own tasks only; drop --restarts with --script", "restarts")
        if ns.replace and ns.script:
            raise ConfigError("concerns the model_dir of tfps's own tasks only; drop --replace with --script",
                              "replace")
        gpus = None if ns.gpus is None else gpu.worker_gpus(ns.gpus, ns.workers, uuids=False)
        ns.workers = len(gpus) if gpus else (2 if ns.workers is None else ns.workers)
        return run_local(cfg, num_ps=ns.ps, num_workers=ns.workers, script=ns.script,
                         script_args=args, python=ns.python, verbose=ns.verbose, restarts=ns.restarts, gpus=gpus,
                         replace=ns.replace)

    def jobs(self) -> tuple[str, bool]:
        rows = [row_of(job) for job in find_jobs(self.dirs)]
        return render(rows, {}, empty=f"no tfps local job under {', '.join(self.dirs)}"), True

    def _job(self, key: str) -> dict:
        job = find_job(key, self.dirs)
        if job is None:
            raise ConfigError(f"no tfps job {key!r} under {', '.join(self.dirs)}; `tfps jobs --local` lists them "
                              "(--dir DIR for a model_dir elsewhere)", "job")
        return job

    def status(self, job: str) -> int:
        return print_row(row_of(self._job(job)))

    def logs(self, job: str, task: str, follow: bool, lines: int, poll: float = 1.0) -> int:
        """The task's lines as ``tfps local`` kept them (``MODEL_DIR.logs/TASK.log``); with ``follow``,
        what it writes next, until the launcher has let go of the model_dir."""
        found = self._job(job)
        kept = results.log_dir(found["model_dir"])
        path = os.path.join(kept, f"{task}.log")
        if not os.path.isfile(path):
            have = sorted(n[:-4] for n in os.listdir(kept) if n.endswith(".log")) if os.path.isdir(kept) else []
            if have:
                raise ConfigError(f"job {found['name']!r} has no task {task}; it has {', '.join(have)}", "task")
            raise ConfigError(f"job {found['name']!r} kept no log in {kept}: it ran a --script, or under a tfps "
                              "older than its logs; its lines went to the terminal that ran it", "job")
        done, pending, first = 0, "", True
        while True:
            running = lock.holder(found["model_dir"]) is not None
            with open(path, errors="replace") as fh:
                fh.seek(done)
                chunk = fh.read()
                done = fh.tell()
            complete, _, pending = (pending + chunk).rpartition("\n")
            shown = [line for line in complete.splitlines() if not logs.is_tf_noise(line)] if complete else []
            if not (follow and running) and pending:   # a last line without its newline
                shown.append(pending)
            for line in shown[-lines:] if first else shown:
                print(f"[{task}] {line}", flush=True)
            first = False
            if not (follow and running):   # read once more after the end: what the task wrote last
                return ExitCode.OK
            time.sleep(poll)

    def stop(self, job: str) -> int:
        """SIGTERM to whoever holds the model_dir's lock (the launcher, or a chief on its own): one stop."""
        found = self._job(job)
        holder = lock.holder(found["model_dir"])
        pid = (holder or {}).get("pid")
        if holder is None or not isinstance(pid, int):
            print(f"job {found['name']} ({found['model_dir']}) is not running ({row_of(found)['state']}); "
                  "nothing to stop", flush=True)
            return ExitCode.OK
        if holder.get("host") not in (None, socket.gethostname()):
            raise ConfigError(f"job {found['name']!r} runs on {holder['host']} (pid {pid}), not on this machine; run "
                              "tfps stop --local there", "job")
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            print(f"job {found['name']} ({found['model_dir']}) has just ended; nothing to stop", flush=True)
            return ExitCode.OK
        print(f"sent SIGTERM to {holder.get('by') or 'the job'} (pid {pid}): the chief writes its final checkpoint "
              f"and export first; `tfps status --local --job {job}` shows it end", flush=True)
        return ExitCode.OK


BACKEND = LocalBackend
