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

from tfps import timeouts
from tfps.cluster import local_plan
from tfps.config import RunConfig
from tfps.errors import ConfigError
from tfps.exitcodes import ExitCode
from tfps.outcome import results
from tfps.outcome.contract import JobResult, ResultsError
from tfps.task import entry as task_entry

log = logging.getLogger("tfps")

_PR_SET_PDEATHSIG = 1
#: ``TFPS_LOCAL_FORK=0``: spawn every task as a new interpreter instead of forking it.
FORK_ENV = "TFPS_LOCAL_FORK"


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
    """One task of the plan running as a child process, its output prefixed with its name.

    ``spawn`` starts the process, ``pump`` the thread that copies its output. The launcher
    spawns every task before it starts any thread (see ``ForkedTask``)."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], out=sys.stdout, verbose: bool = False):
        self.name, self.argv, self.env, self.out, self.verbose = name, argv, env, out, verbose
        self.pid: int | None = None
        self.code: int | None = None
        self.rss_peak = 0           # bytes, sampled by the launcher (``sample_rss``)
        self.signalled: set[int] = set()   # signals the launcher sent
        self._stream = None
        self._reader: threading.Thread | None = None

    def spawn(self) -> None:
        self.proc = subprocess.Popen(self.argv, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True,
                                     preexec_fn=_die_with_parent, bufsize=1, text=True, errors="replace")
        self.pid, self._stream = self.proc.pid, self.proc.stdout

    def pump(self) -> None:
        self._reader = threading.Thread(target=self._copy, daemon=True)
        self._reader.start()

    def _copy(self) -> None:
        assert self._stream is not None
        for line in self._stream:
            if not self.verbose and _tf_noise(line):
                continue
            self.out.write(f"[{self.name}] {line}" if line.endswith("\n") else f"[{self.name}] {line}\n")
            self.out.flush()

    def _exit_code(self) -> int | None:
        return self.proc.poll()

    def poll(self) -> int | None:
        if self.code is None and self.pid is not None:
            self.code = self._exit_code()
            if self.code is not None and self._reader:
                self._reader.join(timeout=timeouts.LOCAL_OUTPUT_DRAIN_SECS)
        return self.code

    def sample_rss(self) -> None:
        """Remember the task's largest resident size (to tell an OOM kill from another SIGKILL)."""
        if self.pid is None or self.code is not None:
            return
        try:
            with open(f"/proc/{self.pid}/statm") as fh:
                pages = int(fh.read().split()[1])
        except (OSError, ValueError, IndexError):
            return
        self.rss_peak = max(self.rss_peak, pages * os.sysconf("SC_PAGE_SIZE"))

    def describe_exit(self) -> str:
        """How the task ended, in words; a SIGKILL nobody here sent is named for what it likely was."""
        text = _describe(self.code)
        if self.code == -signal.SIGKILL and signal.SIGKILL not in self.signalled:
            total = _host_memory()
            if total and self.rss_peak > total // 4:
                text += (f": killed by the kernel (out of memory): it used {self.rss_peak / 2**30:.1f} GiB of "
                         f"the host's {total / 2**30:.1f} GiB; lower --batch_size or run fewer tasks here")
            else:
                text += " (sent by another program, or the kernel's OOM killer)"
        return text

    def signal(self, sig: int) -> None:
        if self.pid is not None and self.poll() is None:
            self.signalled.add(sig)
            try:
                os.killpg(self.pid, sig)
            except ProcessLookupError:
                pass


class ForkedTask(TaskProcess):
    """A task forked from the launcher, which has imported TensorFlow once for all of them.

    Importing TensorFlow takes about 2 s of CPU. Three tasks importing it at once on two
    cores took about 3.5 s before any of them could serve or train; forked from one
    process that has imported it, they start at once and share its memory pages. The
    launcher forks before it starts any thread of its own, and TensorFlow's import starts
    none (its runtime, gRPC included, starts when a task creates its server), so each child
    begins as a clean single-threaded process. The child then runs ``tfps run <flags>`` as
    the spawned process would (``argv`` minus the interpreter), in its own session, with
    its own environment, and shows that command line in ``ps``.
    """

    def __init__(self, run_args: list[str], *args, **kwargs):
        # What the forked child runs: the task's entry (tfps.task.entry.main) with the flags
        # of ``tfps run``, given as they are rather than sliced out of ``argv``.
        super().__init__(*args, **kwargs)
        self.run_args = run_args

    def spawn(self) -> None:
        title = " ".join(self.argv)
        read_end, write_end = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:                       # the child: never returns
            os.close(read_end)
            _run_forked(self.run_args, self.env, write_end, title)
        os.close(write_end)
        self.pid = pid
        self._stream = os.fdopen(read_end, "r", errors="replace")

    def _exit_code(self) -> int | None:
        pid, status = os.waitpid(self.pid, os.WNOHANG)
        return os.waitstatus_to_exitcode(status) if pid else None


def _run_forked(run_args: list[str], env: dict[str, str], out_fd: int, title: str) -> None:
    """The forked child: become ``tfps run`` with its own session, output and environment."""
    code = int(ExitCode.INTERNAL)   # if anything below fails before the task runs
    try:
        os.setsid()
        _die_with_parent()
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        os.close(out_fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        for s in _LAUNCHER_SIGNALS:
            signal.signal(s, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _LAUNCHER_SIGNALS)
        _set_title(title)     # before the environment changes: it moves environ's strings
        os.environ.clear()
        os.environ.update(env)
        for stream in (sys.stdout, sys.stderr):
            stream.reconfigure(line_buffering=True)
        code = int(task_entry.main(run_args))
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:   # noqa: BLE001 - the child must never return into the launcher
        import traceback
        traceback.print_exc()
    finally:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:   # noqa: BLE001
                pass
        os._exit(code)


def _set_title(title: str) -> None:
    """What ``ps`` and /proc/PID/cmdline show for a forked task: its ``tfps run`` command."""
    try:
        import setproctitle
    except ImportError:
        return
    setproctitle.setproctitle(title)


def _single_threaded() -> bool:
    """Whether this process runs one thread (a fork copies only the calling one)."""
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False


#: Signals the launcher handles itself; blocked while it forks, default again in a child.
_LAUNCHER_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def _import_tensorflow_once(verbose: bool) -> bool:
    """Import TensorFlow in the launcher so that forked tasks start with it imported.

    TensorFlow's C++ side prints a banner on stderr whatever TF_CPP_MIN_LOG_LEVEL says; the
    tasks' copies are filtered (``_tf_noise``), the launcher's own goes nowhere unless
    ``-v``. Returns False (and the tasks are spawned as new interpreters) when the import
    fails here (the task then reports the failure itself), or when this process is no longer
    a clean single-threaded one that may fork."""
    if "tensorflow" in sys.modules:
        # The launcher has used TensorFlow already (reading TFRecord data to check it): its
        # runtime has started threads, which a fork would not copy while their locks stay held.
        return False
    from tfps.task import import_tensorflow
    saved = os.dup(2)
    if not verbose:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        os.close(null)
    try:
        import_tensorflow()
        return _single_threaded()
    except Exception:   # noqa: BLE001 - each task imports it again and says what is wrong
        return False
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def _watch_until_chief_exits(chief: TaskProcess, others: list[TaskProcess], cfg: RunConfig,
                             interrupted) -> list[TaskProcess]:
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
        for t in (chief, *others):
            t.sample_rss()
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


def _preflight(cfg: RunConfig, script: str | None, num_workers: int = 1) -> None:
    """Refuse bad input before any process starts: data, model, model_dir, URLs."""
    from tfps.notify import notifier_for
    notifier_for(cfg.notify, cfg.notify_config)
    if script:
        if not os.path.isfile(script):
            raise ConfigError(f"{script} does not exist", "script")
        return
    from tfps.task.setup import JobSetup
    setup = JobSetup(cfg)
    setup.check_batch_fits(num_workers)
    results.check_model_dir(cfg.model_dir, setup.identity())   # the chief claims it later
    results.check_export_dir(cfg.export_path, cfg.model_dir)


def run_local(cfg: RunConfig, num_ps: int = 1, num_workers: int = 2, script: str | None = None,
              script_args: list[str] | None = None, python: str = sys.executable, out=sys.stdout,
              verbose: bool = False, restarts: int = 0, fork: bool = True) -> ExitCode:
    """Run the cluster. Tasks are forked from this process (``ForkedTask``) unless ``fork``
    is false or they cannot be; otherwise each is a new interpreter."""
    if num_ps < 1 or num_workers < 1:
        raise ConfigError("a cluster needs at least 1 ps and 1 worker", "ps" if num_ps < 1 else "workers")
    from tfps.config import check_replicas
    check_replicas(cfg, num_workers)
    _preflight(cfg, script, num_workers)
    plan = local_plan(num_ps, num_workers)
    env = dict(os.environ)   # with TF_CPP_MIN_LOG_LEVEL as tfps.logs set it for this process
    if env.pop("TF_CONFIG", None) is not None:
        log.warning("ignoring the TF_CONFIG of this shell: tfps local gives each task its place in the "
                    "cluster itself")
    env["PYTHONUNBUFFERED"] = "1"
    # URLs travel in the environment, never on a command line that `ps` shows.
    from tfps.notify.urls import ENV_URLS, ENV_URLS_FILE, collect_urls
    urls = collect_urls(cfg.notify, env)
    env.pop(ENV_URLS, None)
    env.pop(ENV_URLS_FILE, None)
    log.info("tfps local: %d ps + %d worker(s) on %s; model_dir %s", num_ps, num_workers,
             ", ".join(p.target for p in plan.tasks), os.path.abspath(cfg.model_dir))
    # Forked tasks start with TensorFlow imported (``ForkedTask``); a user's script, another
    # interpreter (--python) or TFPS_LOCAL_FORK=0 get fresh processes.
    fork = (fork and not script and python == sys.executable and hasattr(os, "fork")
            and os.environ.get(FORK_ENV, "1") != "0" and _import_tensorflow_once(verbose))
    tasks: list[TaskProcess] = []
    for t in plan.tasks:
        ref = plan.task_ref(t)
        task_env = dict(env)
        if script:
            argv = [python, script, *ref.to_flags(), *(script_args or [])]
            tasks.append(TaskProcess(t.name, argv, task_env, out, verbose))
            continue
        run_args = [*(["-v"] if verbose else []), *ref.to_flags(), *cfg.to_args(),
                    *([f"--restarts={restarts}"] if restarts else [])]
        if t.is_chief and urls:
            task_env[ENV_URLS] = " ".join(urls)
        argv = [python, "-m", "tfps", "run", *run_args]
        tasks.append(ForkedTask(run_args, t.name, argv, task_env, out, verbose) if fork
                     else TaskProcess(t.name, argv, task_env, out, verbose))
    chief = next(t for t, p in zip(tasks, plan.tasks) if p.is_chief)
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
        # ps first: workers then find their ps listening. Every task exists before the first
        # output thread starts, so no fork copies a thread's held lock; a signal that comes
        # meanwhile waits until they all exist, and then stops them.
        signal.pthread_sigmask(signal.SIG_BLOCK, _LAUNCHER_SIGNALS)
        try:
            for t in tasks:
                t.spawn()
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _LAUNCHER_SIGNALS)
        for t in tasks:
            t.pump()
        others = [t for t in tasks if t is not chief]
        lost = _watch_until_chief_exits(chief, others, cfg, lambda: interrupted)
        code = chief.code
        if script:
            for t in others:
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
            if not _wait(others, timeouts.SETTLE_SECS if code == 0 else timeouts.LOCAL_STOP_WAIT_SECS):
                log.warning("ending tasks that did not exit by themselves: %s",
                            ", ".join(t.name for t in others if t.poll() is None))
                for t in others:      # a ps takes a second signal as "exit now"
                    t.signal(signal.SIGTERM)
                time.sleep(timeouts.LOCAL_SECOND_SIGNAL_SECS)
                for t in others:
                    t.signal(signal.SIGTERM)
                _wait(others, timeouts.LOCAL_STOP_WAIT_SECS)
    finally:
        for t in tasks:
            t.signal(signal.SIGKILL)
        _wait(tasks, timeouts.LOCAL_KILL_WAIT_SECS)
        for s, h in old.items():
            signal.signal(s, h)
    for t in tasks:
        log.info("%s exited with %s", t.name, t.describe_exit())
    if not script:
        _summary(cfg, code, launched, urls, {t.name: t.describe_exit() for t in lost})
    if code is None or code < 0:
        return ExitCode.TASK_LOST if not interrupted else ExitCode.STOPPED
    try:
        return ExitCode(code)
    except ValueError:
        return ExitCode.TRAINING_FAILED


def _host_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


def _describe(code: int | None) -> str:
    if code is None:
        return "nothing (still running?)"
    if code < 0:
        return f"signal {signal.Signals(-code).name}"
    try:
        return f"{code} ({ExitCode(code).name})"
    except ValueError:
        return str(code)


def _summary(cfg: RunConfig, code, launched: float, urls: list[str], lost: dict[str, str]) -> None:
    """Read the chief's results.json, add what only the launcher saw, print the summary.

    Results count only if the chief of this launch wrote them (``JobResult.written_since``);
    otherwise the chief died without reporting, and the launcher sends the failure message."""
    path = os.path.join(cfg.model_dir, results.RESULTS)
    res = None
    try:
        res = JobResult.load(path)
    except FileNotFoundError:
        pass
    except (OSError, ResultsError) as e:
        log.error("%s", e)
    if res is None or not res.written_since(launched):
        log.error("the chief exited with %s without writing results", _describe(code))
        from tfps.outcome.report import orphan_failure
        orphan_failure(cfg, urls, f"the chief process exited with {_describe(code)} before reporting",
                       sorted(lost))
        return
    if lost:
        # What only the launcher saw: tasks that died while the job ran (a worker whose
        # loss the job survived, in async mode), next to what the chief recorded.
        res.add_lost_tasks(lost).save(path)
    print("\n".join(res.summary_lines(results_path=os.path.abspath(path))), flush=True)
