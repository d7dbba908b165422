"""``tfps local``: a whole cluster as processes on this machine.

Like an orchestrator, and unlike a shell loop: ps first, then workers, all on free ports;
each task's output prefixed (``[ps0]``, ``[worker1]``); the chief's outcome is the exit
code; nothing is left behind (children die with the launcher through PR_SET_PDEATHSIG, and
every exit path terminates what is still running). A stop (Ctrl-C, SIGTERM, SIGHUP) stops the
chief first so that it writes its final checkpoint and export; the signals of one stop that
arrive within ``timeouts.STOP_WINDOW_SECS`` of each other (``timeout`` and CI runners signal
the launcher and then its group) are one stop, and only a deliberate second signal after
that window ends everything at once.

With ``--script`` the tasks run a user's classic program (``--ps_hosts ... --task_index``).
Its ps never exits, so once the chief has exited the launcher ends the remaining tasks, the
way Kubeflow's TFJob does with ``cleanPodPolicy: Running``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time

from tfps import models, timeouts
from tfps.cluster import gpu, local_plan
from tfps.cluster.memory import (
    MemoryEstimate,
    check_fits_host,
    fmt_mb,
    fmt_size,
    host_total_memory,
    versions_on_disk,
)
from tfps.config import RunConfig, check_replicas
from tfps.errors import ConfigError
from tfps.exitcodes import STOPPED_CODES, ExitCode, stopped_code
from tfps.launch.console import JobConsole, is_terminal
from tfps.launch.estimate import ModelRefused, estimate_isolated
from tfps.launch.summary import chief_reported, summarize
from tfps.launch.tasks import (
    LAUNCHER_SIGNALS,
    ForkedTask,
    TaskProcess,
    describe_code,
    import_tensorflow_once,
    say,
    single_threaded,
)
from tfps.models import keras_model
from tfps.notify import notifier_for
from tfps.notify.urls import ENV_URLS, ENV_URLS_FILE, collect_urls
from tfps.outcome import lock, results
from tfps.task.runtime.signals import StopWindow

log = logging.getLogger("tfps")

#: ``TFPS_LOCAL_FORK=0``: spawn every task as a new interpreter instead of forking it.
FORK_ENV = "TFPS_LOCAL_FORK"


def _watch_until_chief_exits(chief: TaskProcess, others: list[TaskProcess], cfg: RunConfig,
                             interrupted, stop_script=None, tick=None) -> list[TaskProcess]:
    """Watch every task until the chief exits; return the tasks that died before it.

    A task that dies mid-job is said at once. The chief's own watchdog ends the job within
    ``--sync_timeout`` when it cannot go on (a lost ps, a lost worker in sync mode); should
    a ps be lost and the chief not end, the launcher stops the chief itself after that
    bound and a grace period, so the job always ends. An async job goes on without a lost
    worker.
    """
    lost: list[TaskProcess] = []
    lost_at: float | None = None
    stopped_chief = 0
    while chief.poll() is None:
        if stop_script is not None and interrupted():
            stop_script()
        for t in (chief, *others):
            t.sample_rss()
        if tick is not None:
            tick()
        for t in others:
            # Killed (a signal, the OOM killer) or crashed; a task that gave up with the job
            # (exit 1 or 2 after the chief's stop) has said why itself.
            if (t not in lost and t.poll() is not None and (t.code < 0 or t.code == ExitCode.INTERNAL)
                    and not interrupted()):
                lost.append(t)
                if t.name.startswith("ps"):
                    lost_at = lost_at or time.monotonic()
                log.error("%s exited with %s while the job runs; the job fails within --sync_timeout (%.0f s) "
                          "if it cannot go on without it", t.name, t.describe_exit(), cfg.sync_timeout)
        if lost_at is not None and not interrupted():
            overdue = time.monotonic() - lost_at - cfg.sync_timeout - timeouts.LOST_TASK_GRACE_SECS
            if overdue > 0 and stopped_chief == 0:
                log.error("the chief did not end within --sync_timeout of losing %s; stopping it",
                          ", ".join(t.name for t in lost))
                stopped_chief = 1
                chief.signal(signal.SIGTERM)
            elif overdue > timeouts.LOCAL_STOP_WAIT_SECS and stopped_chief == 1:
                stopped_chief = 2
                chief.signal(signal.SIGKILL)
        time.sleep(timeouts.LOCAL_WATCH_POLL_SECS)
    return lost


def _wait(tasks: list[TaskProcess], timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if all(t.poll() is not None for t in tasks):
            return True
        time.sleep(timeouts.LOCAL_EXIT_POLL_SECS)
    return all(t.poll() is not None for t in tasks)



#: Seconds of a launcher's check (a user's model builder, run by the memory estimate and the
#: checks against the data) before it says what it is doing: a slow builder is not a hang.
SLOW_CHECK_NOTICE_SECS = 10.0


@contextlib.contextmanager
def _said_when_slow(message: str, after: float | None = None):
    """Log ``message`` (one line) if the block takes longer than ``after`` seconds.

    On a terminal and in a pipe alike (``tfps local ... | tee log``, CI): a slow builder must
    not look like a hang wherever the output goes. A refusal that follows is still its own
    one line (``tfps: error: ...``); the notice before it is a progress line like
    ``tfps local: N ps + M worker(s)``."""
    timer = threading.Timer(SLOW_CHECK_NOTICE_SECS if after is None else after, log.info, (message,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        timer.join()   # no thread of ours left behind: the tasks may be forked from this process


def start_memory_line(memory: MemoryEstimate, total: int, export_every: str | None = None,
                      keep_exports: int | None = None) -> str:
    """``tfps local``'s start line of the variables' memory (``total``: this host's bytes), with
    the disk the versions of ``--export_every`` take (versions_on_disk)."""
    versions = versions_on_disk(memory.export_mb, export_every, keep_exports)
    return (f"{memory.line()} (estimated from the model's shapes); with the chief's export "
            f"({fmt_mb(memory.export_mb)} MB) they need "
            f"{fmt_size(sum(memory.shares_mb.values()) + memory.export_mb)} of this host's "
            f"{total / 2**30:.1f} GiB" + (f"; {versions}" if versions else ""))


def _preflight(cfg: RunConfig, script: str | None, num_workers: int = 1, num_ps: int = 1,
               may_fork: bool = False, verbose: bool = False, replace: bool = False) -> bool:
    """Refuse bad input before any process starts: data, model, model_dir, URLs, and variables
    this host cannot hold. Returns whether the tasks may be forked from this process
    (``ForkedTask``: TensorFlow imported here, and its runtime not started)."""
    notifier_for(cfg.notify, cfg.notify_config)
    if script:
        if not os.path.isfile(script):
            raise ConfigError(f"{script} does not exist", "script")
        return False
    # A model_dir whose job has other settings: refused before anything (tfps.cluster.settings),
    # unless --replace; the chief records them when it claims model_dir.
    from tfps.cluster import settings  # lazy: imports NumPy and PyYAML
    lock.check_free(cfg.model_dir)   # another job runs there: refused at once (taken below, after the checks)
    settings.check(cfg.model_dir, settings.job_settings(cfg, num_ps, num_workers), replace)
    # lazy: imports NumPy, which cmd_local loads only after single_threaded_blas()
    from tfps.task.setup import JobSetup
    setup = JobSetup(cfg, bind=False)   # the data and the model's name; no weight exists yet
    forkable = may_fork and import_tensorflow_once(verbose, keras=models.may_use_keras(cfg.model))
    with _said_when_slow(f"tfps local: building the model {cfg.model} to check it before start…"):
        memory = estimate_isolated(setup, num_ps, num_workers, verbose, isolate=forkable)
    if isinstance(memory, ModelRefused):   # the model failed to build: every task would fail the same way
        raise ConfigError(str(memory))
    total = host_total_memory()
    if isinstance(memory, MemoryEstimate):
        check_fits_host(memory, total)
    # A Keras model was checked against the data by the estimate, which built the whole training
    # graph in its forked child. Only when that child could not give an estimate is the model
    # built here, eagerly: TensorFlow's runtime then runs in this process, and the tasks are
    # spawned, not forked.
    eager = isinstance(setup.model_fn, keras_model.KerasBuilder) and not (
        forkable and isinstance(memory, MemoryEstimate))
    if eager or not isinstance(setup.model_fn, keras_model.KerasBuilder):
        with _said_when_slow(f"tfps local: building the model {cfg.model} once more, to check it against the "
                             "data…"):
            setup.bind()
    setup.check_batch_fits(num_workers)
    results.check_model_dir(cfg.model_dir, setup.identity())   # the chief claims it later
    results.check_export_dir(cfg.export_path, cfg.model_dir)
    # Held until this launcher exits (its chief goes on under it): one job per model_dir.
    lock.acquire(cfg.model_dir, cfg.name, "tfps local")
    if isinstance(memory, MemoryEstimate):
        log.info("tfps local: %s", start_memory_line(memory, total, cfg.export_every, cfg.keep_exports))
    else:
        log.info("tfps local: the variables' memory was not estimated: %s", memory)
    return forkable and not eager and single_threaded()


class StoppedEarly(BaseException):
    """A stop signal that reached the launcher before any task started (a BaseException: a
    user's ``except Exception`` in a model builder the checks run cannot swallow it)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


#: The early stop's signal: the same stop's second signal (`timeout`, then its group) is no news.
_early: list[int] = []


def _stopped_early(signum, _frame):
    if not _early:
        _early.append(signum)
        raise StoppedEarly(signum)


def run_local(cfg: RunConfig, *args, **kwargs) -> ExitCode:
    """Run the cluster (:func:`_run_local`), the stop signals handled from the first moment.

    SIGINT, SIGTERM and SIGHUP are this launcher's own from here on: one that comes while the
    checks before start run (a model builder can take a minute) ends the launcher with one
    line and its stop code (130, 143, 129), nothing started and nothing left running (the
    memory estimate's child is ended with it); once the tasks start, it is the job's stop.

    SIGINT too when it is inherited ignored, as a shell without job control starts ``cmd &``
    (POSIX): a stop here is never destructive (the chief saves and exports, the job resumes
    from its model_dir), a stop that vanishes is (a job that trains on unwatched), and the
    tasks always took SIGINT as a stop. To keep a background job out of a script's Ctrl-C,
    start it in a session of its own: ``setsid tfps local ... &`` (README, "One stop")."""
    _early.clear()
    original = {s: signal.signal(s, _stopped_early) for s in LAUNCHER_SIGNALS}
    try:
        code = _run_local(cfg, *args, **kwargs)
    except StoppedEarly as e:
        say(log.warning, "tfps local: stopped by %s before any task started; nothing was started or left running",
            signal.Signals(e.signum).name)
        return stopped_code(e.signum)   # the handler stays: the same stop's other signals are no news
    except BaseException:
        _early.append(0)   # a refusal on its way out: a signal now is no early stop to report
        raise
    for s, h in original.items():
        signal.signal(s, h)
    return code


def _run_local(cfg: RunConfig, num_ps: int = 1, num_workers: int = 2, script: str | None = None,
               script_args: list[str] | None = None, python: str = sys.executable, out=sys.stdout,
               verbose: bool = False, restarts: int = 0, fork: bool = True, gpus: list[str] | None = None,
               nvidia_smi=gpu.nvidia_smi, replace: bool = False) -> ExitCode:
    """Run the cluster. Tasks are forked from this process (``ForkedTask``) unless ``fork``
    is false or they cannot be; otherwise each is a new interpreter.

    With ``gpus`` (nvidia-smi indices, one per worker), worker ``i`` sees GPU ``gpus[i]`` only
    and every ps none (``gpu.process_env``); ``nvidia_smi`` runs nvidia-smi to check that
    those GPUs exist (tests give it recorded outputs)."""
    if num_ps < 1 or num_workers < 1:
        raise ConfigError("a cluster needs at least 1 ps and 1 worker", "ps" if num_ps < 1 else "workers")
    check_replicas(cfg, num_workers)
    if gpus is not None:
        found = gpu.check_local(gpus, nvidia_smi)
        # The launcher keeps off the GPUs: its checks may start TensorFlow's runtime (reading
        # TFRecords, building a Keras model), which would hold GPU memory for the whole job.
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu.NO_GPU
    # Forked tasks start with TensorFlow imported (``ForkedTask``); a user's script, another
    # interpreter (--python) or TFPS_LOCAL_FORK=0 get fresh processes.
    fork = _preflight(cfg, script, num_workers, num_ps, verbose=verbose, replace=replace,
                      may_fork=(fork and not script and python == sys.executable and hasattr(os, "fork")
                                and os.environ.get(FORK_ENV, "1") != "0"))
    plan = local_plan(num_ps, num_workers, gpus=gpus)
    env = dict(os.environ)   # with TF_CPP_MIN_LOG_LEVEL as tfps.logs set it for this process
    if env.pop("TF_CONFIG", None) is not None:
        log.warning("ignoring the TF_CONFIG of this shell: tfps local gives each task its place in the "
                    "cluster itself")
    env["PYTHONUNBUFFERED"] = "1"
    # URLs travel in the environment, never on a command line that `ps` shows.
    urls = collect_urls(cfg.notify, env)
    env.pop(ENV_URLS, None)
    env.pop(ENV_URLS_FILE, None)
    where = (_script_dir(script_args or []) if script else f"model_dir {os.path.abspath(cfg.model_dir)}")
    log.info("tfps local: %d ps + %d worker(s) on %s%s%s", num_ps, num_workers,
             ", ".join(p.target for p in plan.tasks), f"; {where}" if where else "",
             "; tasks forked from this launcher" if fork else "")
    if gpus is not None:
        log.info("tfps local: %s; every ps on the CPU", ", ".join(
            f"worker{i} on GPU {g.index} ({g.name})" for i, g in enumerate(found)))
    # On a terminal, one live status line for the job; elsewhere (or -v) every task's lines.
    view = JobConsole(cfg.model_dir, out, live=not verbose and not script and is_terminal(out),
                      launched=time.time(), tasks=f"{num_ps} ps + {num_workers} worker(s)")
    out = view.out
    tasks: list[TaskProcess] = []
    for t in plan.tasks:
        ref = plan.task_ref(t)
        task_env = dict(env, **gpu.process_env(t.gpu)) if gpus is not None else dict(env)
        if script:
            argv = [python, "-m", "tfps.task.net.script_guard", script, *ref.to_flags(), *(script_args or [])]
            tasks.append(TaskProcess(t.name, argv, task_env, out, verbose))
            continue
        run_args = [*(["-v"] if verbose else []), *ref.to_flags(), *cfg.to_args(),
                    *([f"--restarts={restarts}"] if restarts else []),
                    *(["--replace"] if replace and t.is_chief else [])]
        if t.is_chief and urls:
            task_env[ENV_URLS] = " ".join(urls)
        argv = [python, "-m", "tfps", "run", *run_args]
        tasks.append(ForkedTask(run_args, t.name, argv, task_env, out, verbose) if fork
                     else TaskProcess(t.name, argv, task_env, out, verbose))
    if not script:
        _keep_logs(tasks, cfg.model_dir)
    chief = next(t for t, p in zip(tasks, plan.tasks) if p.is_chief)
    launched = time.time()
    stops = StopWindow()
    killed: list[str] = []   # why every task was stopped at once (a deliberate second signal)

    def on_signal(signum, _frame):
        name = signal.Signals(signum).name
        seen = stops.note(signum)
        if seen == "first":
            log.warning("stopping (%s): the chief writes its final checkpoint and export first; a second "
                        "signal more than %.0f s from now stops everything at once", name, stops.window)
            # The chief gets the launcher's own signal: its exit code and results say what stopped it.
            chief.signal(signum)
        elif seen == "same":
            log.debug("%s within %.0f s of the %s: the same stop", name, stops.window, stops.signame)
        else:
            if not killed:
                killed.append(f"a second stop signal ({name}) came {stops.since_first():.1f} s after the "
                              f"first ({stops.signame})")
                log.warning("%s: every task is stopped now, before the final save", killed[0])
            for t in tasks:
                t.signal(signal.SIGKILL)

    for s in LAUNCHER_SIGNALS:   # until run_local returns: a late signal is the job's stop, never "early"
        signal.signal(s, on_signal)
    try:
        # ps first: workers then find their ps listening. Every task exists before the first
        # output thread starts, so no fork copies a thread's held lock; a signal that comes
        # meanwhile waits until they all exist, and then stops them.
        signal.pthread_sigmask(signal.SIG_BLOCK, LAUNCHER_SIGNALS)
        try:
            for t in tasks:
                t.spawn()
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, LAUNCHER_SIGNALS)
        view.start()
        for t in tasks:
            t.pump()
        others = [t for t in tasks if t is not chief]
        lost = _watch_until_chief_exits(chief, others, cfg, lambda: stops.count,
                                        stop_script=(lambda: _stop_script_chief(chief, stops)) if script else None,
                                        tick=view.tick)
        view.stop()
        code = chief.code
        if script:
            chief_end = "the chief finished" if code == 0 else f"the chief exited with {describe_code(code)}"
            for t in others:
                if t.poll() is None and not stops.count:   # what a classic script's tasks need to end
                    t.ended_why = (f"the classic ps never exits; {chief_end}" if t.name.startswith("ps")
                                   else chief_end)
                t.signal(signal.SIGTERM)
            _wait(others, timeouts.LOCAL_STOP_WAIT_SECS)
        else:
            if lost and code is not None and code >= 0:
                # A worker that died never says "done": the ps would wait for it for
                # --sync_timeout. Once the live workers have finished, the ps may go (a stop
                # after the chief's final save ends it with 0).
                _wait([t for t in others if t.name.startswith("worker")], timeouts.SETTLE_SECS)
                for t in others:
                    t.signal(signal.SIGTERM)
            settle = timeouts.SETTLE_SECS if code == 0 else timeouts.LOCAL_STOP_WAIT_SECS
            if code == 0 and not chief_reported(cfg, launched):
                settle = 0   # a chief that exited 0 without its results (user code ended it): release the ps now
            if not _wait(others, settle):
                _end_stragglers(others, code, settle)
    finally:
        view.stop()
        for t in tasks:
            t.signal(signal.SIGKILL)
        _wait(tasks, timeouts.LOCAL_KILL_WAIT_SECS)
    for t in tasks:
        if t.ended_why and t.code is not None and t.code < 0:
            say(log.info, "%s ended by tfps: %s", t.name, t.ended_why)
        else:
            say(log.info, "%s exited with %s", t.name, t.describe_exit())
    reported = True
    if not script:
        why = f"killed before the final save: {killed[0]}" if killed else None
        reported = summarize(cfg, code, launched, urls, {t.name: t.describe_exit() for t in lost}, why=why,
                             chief_sent=any(t.sent_without_results for t in tasks))
    return _launcher_code(code, stops, bool(killed), reported, script is not None)


def _keep_logs(tasks: list[TaskProcess], model_dir: str) -> None:
    """Every task's lines, also kept in ``MODEL_DIR.logs/TASK.log`` (``tfps logs --local``)."""
    kept = results.log_dir(model_dir)
    try:
        os.makedirs(kept, exist_ok=True)
    except OSError as e:
        log.warning("tfps local: the tasks' lines are not kept in %s: %s", kept, e.strerror or e)
        return
    for t in tasks:
        t.log_path = os.path.join(kept, f"{t.name}.log")


def _end_stragglers(others: list[TaskProcess], code: int | None, settle: float) -> None:
    """The job has ended (the chief exited) and these tasks did not exit by themselves: one
    SIGTERM (a worker stops, a ps past the chief's final save exits 0), then, after
    ``LOCAL_STOP_WAIT_SECS``, SIGKILL for what still runs (the ``finally`` of the caller).

    Never a second SIGTERM: a task takes a second stop signal past the stop window as a
    person's deliberate "now" and says it exits without its final save (exit 137), which is
    not what happened here: the launcher ended a task after the job."""
    left = [t for t in others if t.poll() is None]
    log.warning("ending tasks that did not exit by themselves: %s", ", ".join(t.name for t in left))
    chief_end = "the chief finished" if code == 0 else f"the chief exited with {describe_code(code)}"
    for t in left:
        t.ended_why = f"it still ran {settle:.0f} s after {chief_end}, and {timeouts.LOCAL_STOP_WAIT_SECS:.0f} s " \
                      "after a SIGTERM"
        t.signal(signal.SIGTERM)
    _wait(left, timeouts.LOCAL_STOP_WAIT_SECS)


#: Flags of classic scripts that name the directory they write (checkpoints, summaries).
SCRIPT_DIR_FLAGS = ("--model_dir", "--train_dir", "--checkpoint_dir", "--logdir", "--log_dir", "--job_dir",
                    "--output_dir")


def _script_dir(script_args: list[str]) -> str:
    """The directory a classic script is told to write to, as its own flag says (``--train_dir
    /x``), or "" when its arguments name none: tfps's model_dir is not the script's."""
    for i, arg in enumerate(script_args):
        name, eq, value = arg.partition("=")
        if name.replace("-", "_").replace("__", "--", 1) in SCRIPT_DIR_FLAGS:
            if not eq:
                value = script_args[i + 1] if i + 1 < len(script_args) else ""
            if value:
                return f"the script's {name} {os.path.abspath(value)}"
    return ""


def _launcher_code(code: int | None, stops: StopWindow, killed: bool, reported: bool, script: bool) -> ExitCode:
    """``tfps local``'s exit code: the chief's, except where only the launcher knows better.

    A deliberate second signal killed everything: ``KILLED``, never a stop's code (which
    promises the final save). A stop's code is the launcher's first signal's (130 for
    SIGINT, 143 for SIGTERM, 129 for SIGHUP). A tfps chief that exited 0 without writing its
    results (a user's model that ended the process) did not succeed."""
    if killed:
        return ExitCode.KILLED
    if code is not None and code in STOPPED_CODES and stops.first_signum:
        return stopped_code(stops.first_signum)
    if code is None or code < 0:
        if stops.first_signum:
            return stopped_code(stops.first_signum) if script else ExitCode.KILLED
        return ExitCode.TASK_LOST
    if code == 0 and not reported:
        return ExitCode.TRAINING_FAILED
    try:
        return ExitCode(code)
    except ValueError:
        return ExitCode.TRAINING_FAILED


def _stop_script_chief(chief: TaskProcess, stops: StopWindow) -> None:
    """A classic script knows nothing of tfps's stop: its chief got the launcher's signal
    (a SIGINT it may never act on while it blocks inside TensorFlow), so after
    ``LOCAL_STOP_WAIT_SECS`` it gets SIGTERM, and SIGKILL after as long again."""
    waited = stops.since_first()
    if waited > 2 * timeouts.LOCAL_STOP_WAIT_SECS and signal.SIGKILL not in chief.signalled:
        say(log.warning, "%s did not exit on SIGTERM: killing it", chief.name)
        chief.signal(signal.SIGKILL)
    elif waited > timeouts.LOCAL_STOP_WAIT_SECS and signal.SIGTERM not in chief.signalled:
        say(log.warning, "%s (your script) did not exit on %s within %.0f s: sending SIGTERM", chief.name,
             stops.signame, timeouts.LOCAL_STOP_WAIT_SECS)
        chief.signal(signal.SIGTERM)

