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
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time

from tfps import logs, timeouts
from tfps.cluster import gpu, local_plan
from tfps.config import RunConfig
from tfps.errors import ConfigError, real_os_exit
from tfps.exitcodes import STOPPED_CODES, ExitCode, stopped_code
from tfps.outcome import results
from tfps.outcome.contract import JobResult, ResultsError
from tfps.task import entry as task_entry
from tfps.task.lifecycle import STOP_SIGNALS, StopWindow

log = logging.getLogger("tfps")

_PR_SET_PDEATHSIG = 1
#: ``TFPS_LOCAL_FORK=0``: spawn every task as a new interpreter instead of forking it.
FORK_ENV = "TFPS_LOCAL_FORK"


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def _task_preexec() -> None:  # a spawned task, between fork and exec
    """Die with the launcher, and take stop signals again: the launcher blocks them while it
    starts the tasks, and a blocked mask is inherited across exec (a classic script's tasks,
    or ``TFPS_LOCAL_FORK=0``'s, would never see a stop)."""
    _die_with_parent()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _LAUNCHER_SIGNALS)


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
                                     preexec_fn=_task_preexec, bufsize=1, text=True, errors="replace")
        self.pid, self._stream = self.proc.pid, self.proc.stdout

    def pump(self) -> None:
        self._reader = threading.Thread(target=self._copy, daemon=True)
        self._reader.start()

    def _copy(self) -> None:
        assert self._stream is not None
        gone = False
        for line in self._stream:
            if gone or (not self.verbose and logs.is_tf_noise(line)):
                continue   # the task's pipe is still read to its end: a task never blocks on its output
            try:
                self.out.write(f"[{self.name}] {line}" if line.endswith("\n") else f"[{self.name}] {line}\n")
                self.out.flush()
            except (OSError, ValueError):
                gone = True   # the terminal has closed (SIGHUP) or the reader has gone

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
                # A ps holds its share of the variables; a worker, its batches and the model's activations.
                hint = ("a ps holds its share of the variables (the 'variables per ps task' line): add ps tasks, "
                        "make the largest table smaller, or use an optimizer with fewer slots"
                        if self.name.startswith("ps") else "lower --batch_size or run fewer tasks here")
                text += (f": killed by the kernel (out of memory): it used {self.rss_peak / 2**30:.1f} GiB of "
                         f"the host's {total / 2**30:.1f} GiB; {hint}")
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
        real_os_exit(code)


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
_LAUNCHER_SIGNALS = set(STOP_SIGNALS)


def _import_tensorflow_once(verbose: bool, keras: bool = True) -> bool:
    """Import TensorFlow in the launcher so that forked tasks start with it imported.

    TensorFlow's C++ side prints a banner on stderr whatever TF_CPP_MIN_LOG_LEVEL says; the
    tasks' copies are filtered (``logs.is_tf_noise``), the launcher's own goes nowhere unless
    ``-v``. Returns False (and the tasks are spawned as new interpreters) when the import
    fails here (the task then reports the failure itself), or when this process is no longer
    a clean single-threaded one that may fork.

    tf_keras too, when it is installed and the model may use it (``models.may_use_keras``:
    not a built-in model): every worker then imports it to build its graph
    (``placement.partitioned``), and so does the memory estimate (``_estimate_isolated``),
    forked from here before them; imported once, it is shared by all of them. Its import
    starts no thread either."""
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
        from tfps import compat
        if keras and compat.keras_installed():
            import tf_keras  # noqa: F401
        return _single_threaded()
    except Exception:   # noqa: BLE001 - each task imports it again and says what is wrong
        return False
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def _watch_until_chief_exits(chief: TaskProcess, others: list[TaskProcess], cfg: RunConfig,
                             interrupted, stop_script=None) -> list[TaskProcess]:
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


# --------------------------------------------------------------------------- the variables' memory
# What each ps task will hold, known before any task starts: ``tfps local`` prints it and
# refuses variables this host cannot hold; ``tfps plan -i`` and the role's ``tfps_memory``
# action ask for it on the controller (``plan_estimate``: ``python -m tfps.launch.processes``).
# It lives here, not in tfps.task.placement, because it builds the graph with the worker's
# own code (tfps.task.worker), which imports placement: a launcher may import a task's
# modules, a task's modules never import back.

#: How long an estimate may take (TensorFlow's import and one graph of the model).
ESTIMATE_TIMEOUT_SECS = 300


def estimate_memory(job, num_ps: int, num_workers: int = 1):
    """Each ps task's share of the variables, the optimizer's slots included (``placement.MemoryEstimate``).

    Builds the training graph exactly as a worker does (``tfps.task.worker.Worker.build``:
    the same ``placement.partitioned(num_ps, partition_mb)``, optimizer and ``ByteBalancer``,
    whose shares the chief logs and results.json records as ``ps_shares_mb``) in a
    throwaway graph, and never creates a session, so nothing is allocated. ``job`` is a
    ``JobSetup`` or a ``RunConfig``. A JobSetup made with ``bind=False`` (or from a
    RunConfig) is bound in a throwaway graph, on a copy, so a Keras model's weights are
    shapes, not gigabytes of initial values. Needs TensorFlow, the model and the training
    data (for its columns).
    """
    import copy

    from tfps.cluster.spec import ClusterSpec, TaskRef
    from tfps.task import import_tensorflow
    from tfps.task.lifecycle import StopSignal
    from tfps.task.placement import MemoryEstimate
    from tfps.task.setup import JobSetup
    from tfps.task.worker import Worker
    tf = import_tensorflow()
    with _quiet():
        if not isinstance(job, JobSetup):
            job = JobSetup(job, evaluates=False, bind=False)
        setup = job
        if not setup.bound:
            with tf.Graph().as_default():
                setup = copy.copy(job).bind()
        cluster = ClusterSpec(tuple(f"127.0.0.1:{1 + i}" for i in range(num_ps)),
                              tuple(f"127.0.0.1:{1 + num_ps + i}" for i in range(max(num_workers, 1))))
        worker = Worker(TaskRef(cluster, "worker", 0), setup.cfg, StopSignal())
        worker.build(setup)
    return MemoryEstimate.of(worker.balancer, setup.optimizer)


def estimate_shares(job, num_ps: int) -> dict[str, float]:
    """``{"ps0": MB, ...}``: :func:`estimate_memory`'s shares."""
    return estimate_memory(job, num_ps).shares_mb


class ModelRefused(str):
    """Why the estimate could not be made when the job itself is at fault: the user's model
    raised while its training graph was built (or tfps refused what it built). Every task
    would fail the same way, so ``tfps local`` refuses the job before start (``_preflight``);
    elsewhere (``tfps plan -i``) it is a reason like any other."""


def _raised_in_user_code(error: BaseException) -> bool:
    """Whether a frame of ``error``'s traceback is the user's code: not tfps, not an installed
    package (TensorFlow, tf_keras), not Python's standard library."""
    import sysconfig
    import traceback
    own = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the tfps package
    std = {os.path.abspath(sysconfig.get_paths()[k]) for k in ("stdlib", "platstdlib")}
    for frame in traceback.extract_tb(error.__traceback__):
        path = os.path.abspath(frame.filename)
        if (path.startswith(own + os.sep) or "site-packages" in path or "dist-packages" in path
                or any(path.startswith(d + os.sep) for d in std) or frame.filename.startswith("<")):
            continue
        return True
    return False


def try_estimate(job, num_ps: int, num_workers: int = 1):
    """:func:`estimate_memory`, or why it could not be made (one line): never raises for that.

    A ``ModelRefused`` reason when the model is at fault (tfps refused it, or the user's code
    raised): not when TensorFlow is missing, or something in tfps or TensorFlow failed."""
    import importlib.util
    if importlib.util.find_spec("tensorflow") is None:
        return "TensorFlow is not installed here"
    try:
        return estimate_memory(job, num_ps, num_workers)
    except ConfigError as e:
        return ModelRefused(str(e))
    except (Exception, SystemExit) as e:  # noqa: BLE001 - a user's model: refused, or the estimate is advice
        first = (str(e).strip().splitlines() or [""])[0]
        line = f"{type(e).__name__}: {first}" if first else type(e).__name__
        if _raised_in_user_code(e):
            cfg = getattr(job, "cfg", job)
            return ModelRefused(f"model: {getattr(cfg, 'model', 'the model')} raised {line} (checked before start, "
                                "building its training graph); fix the model (call it alone in Python to see the "
                                "whole traceback)")
        return line


@contextlib.contextmanager
def _quiet():
    """The worker's own lines ("worker0: optimizer ...") and TensorFlow's deprecation warnings
    belong to the tasks that train, not to an estimate (``-v`` shows TensorFlow's)."""
    tf_log = logging.getLogger("tensorflow")
    levels = log.level, tf_log.level
    log.setLevel(max(levels[0], logging.WARNING))
    if tf_log.level >= logging.WARNING or tf_log.level == logging.NOTSET:
        tf_log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(levels[0])
        tf_log.setLevel(levels[1])


def _answer(result) -> dict:
    from tfps.task.placement import MemoryEstimate
    if isinstance(result, ModelRefused):
        return {"refused": str(result)}
    return {"estimate": result.to_json()} if isinstance(result, MemoryEstimate) else {"skipped": result}


def _from_answer(answer: dict):
    from tfps.task.placement import MemoryEstimate
    if "refused" in answer:
        return ModelRefused(answer["refused"])
    return MemoryEstimate.from_json(answer["estimate"]) if "estimate" in answer else str(answer["skipped"])


def _estimate_isolated(setup, num_ps: int, num_workers: int, verbose: bool, isolate: bool):
    """:func:`try_estimate` of the launcher's job.

    With ``isolate`` (this process has imported TensorFlow and may fork), in a forked
    child: the graph's threads and memory go with it, so the tasks are still forked from a
    clean single-threaded launcher. Otherwise in a new interpreter, so that a launcher that
    spawns its tasks never imports TensorFlow.
    """
    import json
    import select
    if not isolate:   # the tasks are spawned: this launcher stays without TensorFlow
        return _estimate_in_a_process(setup.cfg, num_ps, num_workers)
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:   # the child: never returns
        code = 0
        try:
            os.close(read_end)
            _die_with_parent()
            if not verbose:   # TensorFlow's C++ lines
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, 2)
                os.close(null)
            answer = _answer(try_estimate(setup, num_ps, num_workers))
            with os.fdopen(write_end, "w") as fh:
                fh.write(json.dumps(answer))
        except BaseException:   # noqa: BLE001 - the child must never return into the launcher
            code = 1
        finally:
            real_os_exit(code)
    os.close(write_end)
    chunks: list[bytes] = []
    deadline = time.monotonic() + ESTIMATE_TIMEOUT_SECS
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([read_end], [], [], left)[0]:
                return f"building the model's graph took more than {ESTIMATE_TIMEOUT_SECS} s"
            chunk = os.read(read_end, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_end)
        if os.waitpid(pid, os.WNOHANG)[0] == 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    try:
        return _from_answer(json.loads(b"".join(chunks)))
    except (ValueError, KeyError):
        return "the process that built the model's graph ended without an answer"


def config_of(run_args) -> RunConfig:
    """The RunConfig of ``tfps run`` options (the plan's ``job.run_args``)."""
    import argparse

    from tfps.config import add_run_options, from_args, normalize_argv
    parser = argparse.ArgumentParser(add_help=False)
    add_run_options(parser)
    ns, _ = parser.parse_known_args(normalize_argv([str(a) for a in run_args]))
    return from_args(ns)


def plan_estimate(plan: dict, data_src: str | None = None, train_data: str | None = None,
                  user_model_dir: str | None = None):
    """The estimate of a planned job (``tfps plan -i``, the role's ``tfps_memory`` action),
    made on the controller; or why it was skipped (one line): no TensorFlow there, a classic
    script, training data that lives on the hosts only, a model that cannot be built there.

    The data is read where the controller has it: ``tfps_data_src`` (the play copies it
    from there), else tfps's demo data when the job names none. ``user_model_dir`` is put on
    the model's import path, as the containers mount it. The graph is built in a subprocess
    (:func:`estimate_main`), so the caller never imports TensorFlow.
    """
    import importlib.util

    from tfps.cluster.plan import DATA_MOUNT
    tasks = plan.get("tasks") or []
    if tasks and tasks[0].get("entrypoint"):
        return "the job runs a classic script (tfps_script), whose variables tfps does not know"
    if importlib.util.find_spec("tensorflow") is None:
        return f"TensorFlow is not installed in the controller's Python ({sys.executable})"
    cfg = config_of(plan["job"]["run_args"])
    if data_src:
        from tfps.cluster import datasrc
        cfg.train_data = datasrc._base_and_train(data_src, train_data or None)[1]
    elif cfg.train_data:
        return (f"the training data ({cfg.train_data}) is on the hosts ({DATA_MOUNT} is their tfps_data_dir), "
                "not on the controller; set tfps_data_src to estimate here")
    return _estimate_in_a_process(cfg, len(plan["cluster"]["ps"]), len(plan["cluster"]["worker"]), user_model_dir)


def _estimate_in_a_process(cfg: RunConfig, num_ps: int, num_workers: int, user_model_dir: str | None = None):
    """:func:`try_estimate` in a new interpreter (:func:`estimate_main`): the caller never
    imports TensorFlow."""
    import json
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1")
    # The caller's import path (a --model module in its working directory, say), then the model dir's.
    path = [os.path.abspath(user_model_dir)] if user_model_dir else []
    path += [p for p in sys.path if p] + [env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
    request = {"run_args": cfg.to_args(), "num_ps": num_ps, "num_workers": num_workers}
    try:
        done = subprocess.run([sys.executable, "-m", "tfps.launch.processes"], input=json.dumps(request),
                              capture_output=True, text=True, env=env, timeout=ESTIMATE_TIMEOUT_SECS)
    except subprocess.TimeoutExpired:
        return f"building the model's graph took more than {ESTIMATE_TIMEOUT_SECS} s"
    except OSError as e:
        return f"cannot run {sys.executable}: {e}"
    try:
        return _from_answer(json.loads(done.stdout.strip().splitlines()[-1]))
    except (IndexError, ValueError, KeyError):
        tail = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        return f"the estimate failed: {tail}"


def estimate_main() -> int:
    """``python -m tfps.launch.processes``: one JSON request on stdin (run options, ps and
    worker counts), one JSON answer on stdout (the estimate, or why it was skipped)."""
    import json
    request = json.loads(sys.stdin.read())
    try:
        result = try_estimate(config_of(request["run_args"]), int(request["num_ps"]), int(request["num_workers"]))
    except (ConfigError, SystemExit) as e:
        result = f"the job's options: {e}"
    print(json.dumps(_answer(result)), flush=True)
    return 0


#: Seconds of a launcher's check (a user's model builder, run by the memory estimate and the
#: checks against the data) before it says what it is doing: a slow builder is not a hang.
SLOW_CHECK_NOTICE_SECS = 10.0


def _watched() -> bool:
    """Whether a person watches stderr (a terminal): only then is the notice said, so that a
    refusal read by a program (CI, a wrapper, the tests) stays the one line it promises."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


@contextlib.contextmanager
def _said_when_slow(message: str, after: float | None = None):
    """Log ``message`` (one line) if the block takes longer than ``after`` seconds, on a terminal."""
    if not _watched():
        yield
        return
    timer = threading.Timer(SLOW_CHECK_NOTICE_SECS if after is None else after, log.info, (message,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        timer.join()   # no thread of ours left behind: the tasks may be forked from this process


def _preflight(cfg: RunConfig, script: str | None, num_workers: int = 1, num_ps: int = 1,
               may_fork: bool = False, verbose: bool = False, replace: bool = False) -> bool:
    """Refuse bad input before any process starts: data, model, model_dir, URLs, and variables
    this host cannot hold. Returns whether the tasks may be forked from this process
    (``ForkedTask``: TensorFlow imported here, and its runtime not started)."""
    from tfps.notify import notifier_for
    notifier_for(cfg.notify, cfg.notify_config)
    if script:
        if not os.path.isfile(script):
            raise ConfigError(f"{script} does not exist", "script")
        return False
    # A model_dir whose job has other settings: refused before anything (tfps.cluster.settings),
    # unless --replace; the chief records them when it claims model_dir.
    from tfps.cluster import settings
    settings.check(cfg.model_dir, settings.job_settings(cfg, num_ps, num_workers), replace)
    from tfps import keras_model, models
    from tfps.task import placement
    from tfps.task.setup import JobSetup, host_total_memory
    setup = JobSetup(cfg, bind=False)   # the data and the model's name; no weight exists yet
    forkable = may_fork and _import_tensorflow_once(verbose, keras=models.may_use_keras(cfg.model))
    with _said_when_slow(f"tfps local: building the model {cfg.model} to check it before start…"):
        memory = _estimate_isolated(setup, num_ps, num_workers, verbose, isolate=forkable)
    if isinstance(memory, ModelRefused):   # the model failed to build: every task would fail the same way
        raise ConfigError(str(memory))
    total = host_total_memory()
    if isinstance(memory, placement.MemoryEstimate):
        placement.check_fits_host(memory, total)
    # A Keras model is built here, eagerly (after its variables were found to fit): TensorFlow's
    # runtime then runs in this process, and the tasks are spawned, not forked.
    eager = isinstance(setup.model_fn, keras_model.KerasBuilder)
    with _said_when_slow(f"tfps local: building the model {cfg.model} once more, to check it against the data…"):
        setup.bind()
    setup.check_batch_fits(num_workers)
    results.check_model_dir(cfg.model_dir, setup.identity())   # the chief claims it later
    results.check_export_dir(cfg.export_path, cfg.model_dir)
    if isinstance(memory, placement.MemoryEstimate):
        log.info("tfps local: %s (estimated from the model's shapes); with the chief's export (%s MB) they need "
                 "%s of this host's %.1f GiB", memory.line(), placement.fmt_mb(memory.export_mb),
                 placement.fmt_size(sum(memory.shares_mb.values()) + memory.export_mb), total / 2**30)
    else:
        log.info("tfps local: the variables' memory was not estimated: %s", memory)
    return forkable and not eager and _single_threaded()


def run_local(cfg: RunConfig, num_ps: int = 1, num_workers: int = 2, script: str | None = None,
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
    from tfps.config import check_replicas
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
    from tfps.notify.urls import ENV_URLS, ENV_URLS_FILE, collect_urls
    urls = collect_urls(cfg.notify, env)
    env.pop(ENV_URLS, None)
    env.pop(ENV_URLS_FILE, None)
    log.info("tfps local: %d ps + %d worker(s) on %s; model_dir %s", num_ps, num_workers,
             ", ".join(p.target for p in plan.tasks), os.path.abspath(cfg.model_dir))
    if gpus is not None:
        log.info("tfps local: %s; every ps on the CPU", ", ".join(
            f"worker{i} on GPU {g.index} ({g.name})" for i, g in enumerate(found)))
    tasks: list[TaskProcess] = []
    for t in plan.tasks:
        ref = plan.task_ref(t)
        task_env = dict(env, **gpu.process_env(t.gpu)) if gpus is not None else dict(env)
        if script:
            argv = [python, script, *ref.to_flags(), *(script_args or [])]
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

    old = {s: signal.signal(s, on_signal) for s in _LAUNCHER_SIGNALS}
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
        lost = _watch_until_chief_exits(chief, others, cfg, lambda: stops.count,
                                        stop_script=(lambda: _stop_script_chief(chief, stops)) if script else None)
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
            settle = timeouts.SETTLE_SECS if code == 0 else timeouts.LOCAL_STOP_WAIT_SECS
            if code == 0 and not _chief_reported(cfg, launched):
                settle = 0   # a chief that exited 0 without its results (user code ended it): release the ps now
            if not _wait(others, settle):
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
        _say(log.info, "%s exited with %s", t.name, t.describe_exit())
    reported = True
    if not script:
        why = f"killed before the final save: {killed[0]}" if killed else None
        reported = _summary(cfg, code, launched, urls, {t.name: t.describe_exit() for t in lost}, why=why)
    return _launcher_code(code, stops, bool(killed), reported, script is not None)


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
        _say(log.warning, "%s did not exit on SIGTERM: killing it", chief.name)
        chief.signal(signal.SIGKILL)
    elif waited > timeouts.LOCAL_STOP_WAIT_SECS and signal.SIGTERM not in chief.signalled:
        _say(log.warning, "%s (your script) did not exit on %s within %.0f s: sending SIGTERM", chief.name,
             stops.signame, timeouts.LOCAL_STOP_WAIT_SECS)
        chief.signal(signal.SIGTERM)


def _say(fn, *args) -> None:
    """A log line that may find its terminal gone (SIGHUP): never an exception for that."""
    try:
        fn(*args)
    except (OSError, ValueError):
        pass


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


def _chief_reported(cfg: RunConfig, launched: float) -> bool:
    """Whether the chief of this launch wrote its results.json (``JobResult.written_since``)."""
    try:
        return JobResult.load(os.path.join(cfg.model_dir, results.RESULTS)).written_since(launched)
    except (OSError, ResultsError):
        return False


def _summary(cfg: RunConfig, code, launched: float, urls: list[str], lost: dict[str, str],
             why: str | None = None) -> bool:
    """Read the chief's results.json, add what only the launcher saw, print the summary.

    Results count only if the chief of this launch wrote them (``JobResult.written_since``);
    otherwise the chief died without reporting, and the launcher sends the failure message
    (``why`` says what ended it, when the launcher knows). Returns whether the chief reported."""
    path = os.path.join(cfg.model_dir, results.RESULTS)
    res = None
    try:
        res = JobResult.load(path)
    except FileNotFoundError:
        pass
    except (OSError, ResultsError) as e:
        log.error("%s", e)
    if res is None or not res.written_since(launched):
        _say(log.error, "the chief exited with %s without writing results%s", _describe(code),
             f" ({why})" if why else "")
        from tfps.outcome.report import orphan_failure
        orphan_failure(cfg, urls, why or f"the chief process exited with {_describe(code)} before reporting",
                       sorted(lost))
        return False
    if lost:
        # What only the launcher saw: tasks that died while the job ran (a worker whose
        # loss the job survived, in async mode), next to what the chief recorded.
        res.add_lost_tasks(lost).save(path)
    try:
        print("\n".join(res.summary_lines(results_path=os.path.abspath(path))), flush=True)
    except (OSError, ValueError):
        pass   # the terminal has closed (SIGHUP): results.json and the message have it all
    return True


if __name__ == "__main__":   # the controller's estimate (plan_estimate)
    sys.exit(estimate_main())
