"""``tfps local``: a whole cluster as processes on this machine.

Like an orchestrator, and unlike a shell loop: ps first, then workers, all on free ports;
each task's output prefixed (``[ps0]``, ``[worker1]``); the chief's outcome is the exit
code; nothing is left behind (children die with the launcher through PR_SET_PDEATHSIG, and
every exit path terminates what is still running). Ctrl-C stops the chief first so that it
writes its final checkpoint and export; a second Ctrl-C ends everything at once.

With ``--script`` the tasks run a user's classic program (``--ps_hosts ... --task_index``).
Its ps never exits, so once the chief has exited the launcher ends the remaining tasks, the
way Kubeflow's TFJob does with ``cleanPodPolicy: Running``.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time

from trainer import timeouts
from trainer.cluster import local_plan
from trainer.config import RunConfig
from trainer.errors import ConfigError
from trainer.exitcodes import ExitCode
from trainer.outcome import results

log = logging.getLogger("tfps")

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def _tf_noise(line: str) -> bool:
    """TensorFlow's C++ lines printed whatever TF_CPP_MIN_LOG_LEVEL says: the oneDNN banner,
    and absl's notice that it logs to stderr before being initialised (twice per process)."""
    return ((line.startswith("I0000 ") and "port.cc" in line)
            or line.startswith("WARNING: All log messages before absl::InitializeLog()"))


class TaskProcess:
    """One task of the plan running as a child process, its output prefixed with its name."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], out=sys.stdout, verbose: bool = False):
        self.name, self.argv, self.env, self.out, self.verbose = name, argv, env, out, verbose
        self.proc: subprocess.Popen | None = None
        self.code: int | None = None
        self._reader: threading.Thread | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(self.argv, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True,
                                     preexec_fn=_die_with_parent, bufsize=1, text=True, errors="replace")
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        assert self.proc and self.proc.stdout
        for line in self.proc.stdout:
            if not self.verbose and _tf_noise(line):
                continue
            self.out.write(f"[{self.name}] {line}" if line.endswith("\n") else f"[{self.name}] {line}\n")
            self.out.flush()

    def poll(self) -> int | None:
        if self.code is None and self.proc is not None:
            self.code = self.proc.poll()
            if self.code is not None and self._reader:
                self._reader.join(timeout=5)
        return self.code

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass


def _wait(tasks: list[TaskProcess], timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if all(t.poll() is not None for t in tasks):
            return True
        time.sleep(0.1)
    return all(t.poll() is not None for t in tasks)


def _preflight(cfg: RunConfig, script: str | None) -> None:
    """Refuse bad input before any process starts: data, model, model_dir, URLs."""
    from trainer.notify.notifier import Notifier
    Notifier.from_settings(cfg.notify, cfg.notify_config)
    if script:
        if not os.path.isfile(script):
            raise ConfigError(f"{script} does not exist", "script")
        return
    from trainer.task.setup import JobSetup
    results.check_model_dir(cfg.model_dir, JobSetup(cfg).identity())   # the chief claims it later


def run_local(cfg: RunConfig, num_ps: int = 1, num_workers: int = 2, script: str | None = None,
              script_args: list[str] | None = None, python: str = sys.executable, out=sys.stdout,
              verbose: bool = False) -> ExitCode:
    if num_ps < 1 or num_workers < 1:
        raise ConfigError("a cluster needs at least 1 ps and 1 worker", "ps" if num_ps < 1 else "workers")
    _preflight(cfg, script)
    plan = local_plan(num_ps, num_workers)
    env = dict(os.environ)   # with TF_CPP_MIN_LOG_LEVEL as trainer.logs set it for this process
    env["PYTHONUNBUFFERED"] = "1"
    # URLs travel in the environment, never on a command line that `ps` shows.
    from trainer.notify.urls import ENV_URLS, ENV_URLS_FILE, collect_urls
    urls = collect_urls(cfg.notify, env)
    env.pop(ENV_URLS, None)
    env.pop(ENV_URLS_FILE, None)
    tasks: list[TaskProcess] = []
    for t in plan.tasks:
        ref = plan.task_ref(t)
        task_env = dict(env)
        if script:
            argv = [python, script, *ref.to_flags(), *(script_args or [])]
        else:
            argv = [python, "-m", "trainer", *(["-v"] if verbose else []), "run", *ref.to_flags(), *cfg.to_args()]
            if t.is_chief and urls:
                task_env[ENV_URLS] = " ".join(urls)
        tasks.append(TaskProcess(t.name, argv, task_env, out, verbose))
    chief = next(t for t, p in zip(tasks, plan.tasks) if p.is_chief)
    log.info("tfps local: %d ps + %d worker(s) on %s; model_dir %s", num_ps, num_workers,
             ", ".join(p.target for p in plan.tasks), os.path.abspath(cfg.model_dir))
    launched = time.time()
    interrupted = 0

    def on_signal(signum, _frame):
        nonlocal interrupted
        interrupted += 1
        if interrupted == 1:
            log.warning("stopping: the chief writes its final checkpoint and export first "
                        "(again to stop everything now)")
            chief.signal(signal.SIGTERM)
        else:
            for t in tasks:
                t.signal(signal.SIGKILL)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for t in tasks:     # ps first: workers then find their ps listening
            t.start()
        while chief.poll() is None:
            time.sleep(0.2)
        code = chief.code
        others = [t for t in tasks if t is not chief]
        if script:
            for t in others:
                t.signal(signal.SIGTERM)
            _wait(others, timeouts.LOCAL_STOP_WAIT_SECS)
        elif not _wait(others, timeouts.SETTLE_SECS if code == 0 else timeouts.LOCAL_STOP_WAIT_SECS):
            log.warning("ending tasks that did not exit by themselves: %s",
                        ", ".join(t.name for t in others if t.poll() is None))
            for t in others:      # a ps takes a second signal as "exit now"
                t.signal(signal.SIGTERM)
            time.sleep(0.5)
            for t in others:
                t.signal(signal.SIGTERM)
            _wait(others, timeouts.LOCAL_STOP_WAIT_SECS)
    finally:
        for t in tasks:
            t.signal(signal.SIGKILL)
        _wait(tasks, 5)
        for s, h in old.items():
            signal.signal(s, h)
    for t in tasks:
        log.info("%s exited with %s", t.name, _describe(t.code))
    if not script:
        _summary(cfg, code, launched, urls)
    if code is None or code < 0:
        return ExitCode.TASK_LOST if not interrupted else ExitCode.STOPPED
    try:
        return ExitCode(code)
    except ValueError:
        return ExitCode.TRAINING_FAILED


def _describe(code: int | None) -> str:
    if code is None:
        return "nothing (still running?)"
    if code < 0:
        return f"signal {signal.Signals(-code).name}"
    try:
        return f"{code} ({ExitCode(code).name})"
    except ValueError:
        return str(code)


def _summary(cfg: RunConfig, code, launched: float, urls: list[str]) -> None:
    res = results.read_json(os.path.join(cfg.model_dir, results.RESULTS))
    fresh = res is not None and os.path.getmtime(os.path.join(cfg.model_dir, results.RESULTS)) >= launched
    if not fresh:
        log.error("the chief exited with %s without writing results", _describe(code))
        from trainer.outcome.report import orphan_failure
        orphan_failure(cfg, urls, f"the chief process exited with {_describe(code)} before reporting")
        return
    t = res.get("times", {})
    lines = [
        f"job {res['job']} {res['status'].upper()} at global step {res['global_step']}/{res['train_steps']}",
        f"  final loss {res.get('final_loss')}  metrics {res.get('metrics')}  eval {res.get('eval_metrics')}",
        f"  start-up {t.get('startup_s')} s, training {t.get('training_s')} s, final save {t.get('final_save_s')} s",
        f"  checkpoint {res.get('checkpoint')}",
        f"  export     {res.get('export_dir')} (complete: {res.get('export_complete')})",
        f"  results    {os.path.join(os.path.abspath(cfg.model_dir), results.RESULTS)}",
    ]
    restarts = res.get("restarts") or []
    if restarts:
        lines.append(f"  recovered from {len(restarts)} failure(s): " +
                     "; ".join(f"{r.get('task')} ({r.get('cause')})" for r in restarts))
    if res.get("error"):
        lines.append(f"  error      {res['error']['type']}: {res['error']['message']}")
    print("\n".join(lines), flush=True)
