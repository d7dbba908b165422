"""The processes of ``tfps local``: one task of the plan as a child process (``TaskProcess``,
spawned as a new interpreter, or ``ForkedTask``, forked from a launcher that has imported
TensorFlow once for all of them), its output prefixed with its name, and its exit in words.

Every child dies with the launcher (PR_SET_PDEATHSIG) and takes stop signals again (the
launcher blocks them while it starts the tasks).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading

from tfps import compat, logs, timeouts
from tfps.errors import real_os_exit
from tfps.exitcodes import ExitCode
from tfps.outcome.results import SENT_WITHOUT_RESULTS
from tfps.task import entry as task_entry
from tfps.task import import_tensorflow
from tfps.task.runtime.signals import STOP_SIGNALS

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def _task_preexec() -> None:  # a spawned task, between fork and exec
    """Die with the launcher, and take stop signals again: the launcher blocks them while it
    starts the tasks, and a blocked mask is inherited across exec (a classic script's tasks,
    or ``TFPS_LOCAL_FORK=0``'s, would never see a stop)."""
    die_with_parent()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, LAUNCHER_SIGNALS)


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
        self.ended_why = ""                # why the launcher ended it, when that is the normal end
        self.sent_without_results = False  # the chief said it sent the end message (no results.json)
        self._stream = None
        self._reader: threading.Thread | None = None
        self.log_path: str | None = None   # also keep every line of the task here (tfps logs --local)

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
        kept = _open_log(self.log_path)
        for line in self._stream:
            if kept is not None:
                kept = _keep(kept, line)
            if SENT_WITHOUT_RESULTS in line:
                self.sent_without_results = True
            if gone or (not self.verbose and logs.is_tf_noise(line)):
                continue   # the task's pipe is still read to its end: a task never blocks on its output
            try:
                self.out.write(f"[{self.name}] {line}" if line.endswith("\n") else f"[{self.name}] {line}\n")
                self.out.flush()
            except (OSError, ValueError):
                gone = True   # the terminal has closed (SIGHUP) or the reader has gone
        if kept is not None:
            _keep(kept, None)

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
        text = describe_code(self.code)
        if self.code == -signal.SIGKILL and signal.SIGKILL not in self.signalled:
            total = host_memory()
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


def _open_log(path: str | None):
    """The task's log file, appended to (a resumed job's lines follow the earlier run's); None
    when there is none or it cannot be opened: the job runs on without it."""
    if path is None:
        return None
    try:
        return open(path, "a", buffering=1, errors="replace")
    except OSError:
        return None


def _keep(fh, line: str | None):
    """Write ``line`` to the task's log (None: close it); the log, or None once it cannot be written
    (a full disk): a task's output is never held up by its copy."""
    try:
        if line is None:
            fh.close()
            return None
        fh.write(line if line.endswith("\n") else line + "\n")
        return fh
    except (OSError, ValueError):
        try:
            fh.close()
        except OSError:
            pass
        return None


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
        die_with_parent()
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        os.close(out_fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        for s in LAUNCHER_SIGNALS:
            signal.signal(s, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, LAUNCHER_SIGNALS)
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


def single_threaded() -> bool:
    """Whether this process runs one thread (a fork copies only the calling one)."""
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False


#: Signals the launcher handles itself; blocked while it forks, default again in a child.
LAUNCHER_SIGNALS = set(STOP_SIGNALS)


def import_tensorflow_once(verbose: bool, keras: bool = True) -> bool:
    """Import TensorFlow in the launcher so that forked tasks start with it imported.

    TensorFlow's C++ side prints a banner on stderr whatever TF_CPP_MIN_LOG_LEVEL says; the
    tasks' copies are filtered (``logs.is_tf_noise``), the launcher's own goes nowhere unless
    ``-v``. Returns False (and the tasks are spawned as new interpreters) when the import
    fails here (the task then reports the failure itself), or when this process is no longer
    a clean single-threaded one that may fork.

    tf_keras too, when it is installed and the model may use it (``models.may_use_keras``:
    not a built-in model): every worker then imports it to build its graph
    (``partition.partitioned``), and so does the memory estimate (``estimate.estimate_isolated``),
    forked from here before them; imported once, it is shared by all of them. Its import
    starts no thread either."""
    if "tensorflow" in sys.modules and not single_threaded():
        # The launcher has used TensorFlow already (reading TFRecord data to check it): its
        # runtime has started threads, which a fork would not copy while their locks stay held.
        # (A user's model module that imports TensorFlow itself, and uses nothing of it yet,
        # leaves this process single-threaded: its tasks are forked.)
        return False
    saved = os.dup(2)
    if not verbose:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        os.close(null)
    try:
        import_tensorflow()
        if keras and compat.keras_installed():
            import tf_keras  # noqa: F401
        return single_threaded()
    except Exception:   # noqa: BLE001 - each task imports it again and says what is wrong
        return False
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def say(fn, *args) -> None:
    """A log line that may find its terminal gone (SIGHUP): never an exception for that."""
    try:
        fn(*args)
    except (OSError, ValueError):
        pass


def host_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


def describe_code(code: int | None) -> str:
    """An exit code in words: a signal by its name, a tfps code with its ``ExitCode`` name."""
    if code is None:
        return "nothing (still running?)"
    if code < 0:
        return f"signal {signal.Signals(-code).name}"
    try:
        return f"{code} ({ExitCode(code).name})"
    except ValueError:
        return str(code)

