"""Signals, the "done" queue on each ps, the shared session settings, the health file.

The ps never blocks in ``server.join()``: it waits for one token per worker on a queue it
hosts (``done_queue``) and exits 0 by itself. Workers enqueue their index when they are
finished; the chief does so only after its final checkpoint and export are on disk, so the
ps always outlives the final save.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import tempfile
import threading
import time

from tfps import timeouts
from tfps.cluster.spec import split_target
from tfps.errors import ConfigError, real_os_exit
from tfps.exitcodes import ExitCode, stopped_code
from tfps.task.net import loopback as guard
from tfps.task.net.listening import require_address_only, require_loopback_only
from tfps.task.net.loopback import bind_address, ensure_loopback_bind, is_loopback_host

log = logging.getLogger("tfps")

#: Room for many duplicate tokens (a restarted worker reports again): enqueues never block.
DONE_QUEUE_CAPACITY = 1024


_abandoned_rpc = False


def abandon_rpc() -> None:
    """A thread is left blocked in TensorFlow (an end RPC to a ps that has gone)."""
    global _abandoned_rpc
    _abandoned_rpc = True


def left_in_tensorflow(thread: threading.Thread, bound: float) -> bool:
    """Wait up to ``bound`` seconds for a helper thread that calls TensorFlow (a non-chief's
    watch for the job's end) to end; if it has not, it is abandoned (:func:`abandon_rpc`)
    and the process ends without the interpreter's shutdown.

    A daemon thread whose TensorFlow call returns while the interpreter shuts down is
    ended by it from inside TensorFlow's C++ frames, which abort the process ("terminate
    called ... FATAL: exception not rethrown", exit -6) after a job that succeeded.
    Returns True when the thread was abandoned."""
    thread.join(bound)
    if not thread.is_alive():
        return False
    log.debug("%s is still in TensorFlow after %.1f s: the process ends without waiting for it",
              thread.name, bound)
    abandon_rpc()
    return True


def rpc_abandoned() -> bool:
    """True when the process must end without the interpreter's shutdown, which could wait
    on (or tear TensorFlow down under) the abandoned thread."""
    return _abandoned_rpc


#: The signals that stop a job: SIGTERM (``docker stop``, ``timeout``, Slurm), SIGINT (Ctrl-C)
#: and SIGHUP (a closed terminal or SSH session; ``nohup`` for a job that must outlive it).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class StopWindow:
    """One stop however it is sent: which of the stop signals that reach a process are new.

    ``timeout`` and CI runners signal a process and then its whole group, and Ctrl-C reaches
    every process of the terminal's foreground group, milliseconds apart: a launcher and
    its tasks see two signals for one stop. Every signal within ``window`` seconds of the
    first is that same stop; one after it is a deliberate second signal ("now, please"),
    which ends everything at once. Pure, so the launcher and every task judge alike.
    """

    def __init__(self, window: float = timeouts.STOP_WINDOW_SECS, clock=time.monotonic):
        self.window, self.clock = window, clock
        self.first_signum: int | None = None
        self.first_at: float | None = None
        self.count = 0

    def note(self, signum: int) -> str:
        """``"first"``, ``"same"`` (within the window: the same stop) or ``"second"``."""
        now = self.clock()
        self.count += 1
        if self.first_at is None:
            self.first_signum, self.first_at = int(signum), now
            return "first"
        return "same" if now - self.first_at <= self.window else "second"

    @property
    def signame(self) -> str:
        return signal.Signals(self.first_signum).name if self.first_signum else ""

    def since_first(self) -> float:
        return self.clock() - self.first_at if self.first_at is not None else 0.0


class StopSignal:
    """SIGTERM, SIGINT and SIGHUP become a stop request instead of killing the process mid-save.

    Signals within the stop window of the first are the same stop (:class:`StopWindow`); a
    deliberate second one after it ends the task at once, without its final save, with
    ``ExitCode.KILLED``. The exit code of a task that stopped is the first signal's
    (:meth:`exit_code`: 130, 143 or 129).

    Python runs a signal handler in the main thread only, between two bytecodes: a main
    thread waiting inside TensorFlow (a sync step's wait for its token, a dequeue from a ps)
    would take neither signal until that call returns, maybe never. So each signal is judged
    as it arrives by a watcher thread that reads the signal wakeup fd (``signal.set_wakeup_fd``,
    written by the interpreter's C handler at once); the Python handler then has nothing left
    to do. Where no wakeup fd can be set (not the main thread), the handler judges."""

    def __init__(self) -> None:
        self.window = StopWindow()
        self._event = threading.Event()
        self._lock = threading.Lock()
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)
        self._watched = _watch_wakeups(self)

    def _handle(self, signum, _frame) -> None:
        if not (self._watched and _watcher is not None and _watcher.is_alive()):
            self.judge(signum)

    def judge(self, signum: int) -> None:
        """A stop signal arrived: a stop request, the same stop, or a second signal (exit now)."""
        with self._lock:
            name = signal.Signals(signum).name
            seen = self.window.note(signum)
            if seen == "second":
                log.warning("received %s %.1f s after %s, past the %.0f s window of one stop: exiting now, "
                            "without the final save (exit 137)", name, self.window.since_first(), self.window.signame,
                            self.window.window)
                exit_now(ExitCode.KILLED)
            self._event.set()
            if seen == "first":
                log.warning("received %s: finishing the current step, then the final save", name)
            else:
                log.info("received %s again within %.0f s: the same stop", name, self.window.window)

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    @property
    def count(self) -> int:
        return self.window.count

    @property
    def first_at(self) -> float | None:
        return self.window.first_at

    @property
    def signame(self) -> str:
        return self.window.signame

    def exit_code(self) -> ExitCode:
        """The code of a task stopped by this request: 128 + the first signal's number."""
        return stopped_code(self.window.first_signum)


#: The StopSignal the wakeup watcher reports to (the newest; one watcher per process).
_watched_stop: StopSignal | None = None
_watcher: threading.Thread | None = None


def _watch_wakeups(stop: StopSignal) -> bool:
    """Judge every stop signal in a thread as it arrives (see :class:`StopSignal`): the signal
    wakeup fd's bytes are the numbers of the signals caught. False where Python allows no
    wakeup fd (not the main thread)."""
    global _watched_stop, _watcher
    if _watcher is None:
        if threading.current_thread() is not threading.main_thread():
            return False
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)
        try:
            signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        except (ValueError, OSError):
            os.close(read_end)
            os.close(write_end)
            return False
        _watcher = threading.Thread(target=_read_wakeups, args=(read_end,), name="tfps-signals", daemon=True)
        _watcher.start()
    _watched_stop = stop
    return True


def _read_wakeups(fd: int) -> None:
    stops = {int(s) for s in STOP_SIGNALS}
    while True:
        try:
            data = os.read(fd, 64)
        except InterruptedError:
            continue
        except OSError:
            return
        if not data:
            return
        for signum in data:
            if signum in stops and _watched_stop is not None:
                _watched_stop.judge(signum)


def exit_now(code: int) -> None:
    """End the process at once, logs and stdio flushed, without the interpreter's shutdown (a
    deliberate second stop signal; a thread abandoned inside TensorFlow)."""
    try:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        real_os_exit(int(code))


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity, capped by a cgroup v2 CPU quota (docker --cpus)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max") as fh:
            quota, period = fh.read().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, int(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cpus)


def auto_threads(task, cpus: int | None = None) -> int:
    """Threads for a task's op pools when ``--tf_threads`` is not given.

    Every task starts pools as large as the machine by default, so tasks that share a host
    (``tfps local``, several workers on one host) would run several times more threads than
    there are CPUs, and time-slice each other's steps. A worker shares this host's CPUs with
    the other workers on it; a ps, which only applies updates, with every task on it.
    """
    cpus = cpus or usable_cpus()
    ps_here, workers_here = task.neighbours()
    return max(1, cpus // (workers_here if task.job == "worker" else ps_here + workers_here))


def session_config(task, cfg):
    """ConfigProto for a task. Device filters keep a worker from waiting on other workers."""
    import tensorflow as tf
    threads = cfg.tf_threads or auto_threads(task)
    c = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=threads,
        inter_op_parallelism_threads=threads,
        allow_soft_placement=True,
    )
    # Grappler's MLIR ("tfg") passes sort and infer every graph a session runs again, for
    # each new set of fetches: about 40 ms of each task's start-up (TF_CPP_VMODULE=
    # meta_optimizer=1 shows it), and with the ps serving the job trained about 0.1 s sooner
    # without them. The classic rewrites (layout, remapper fusions, constant folding, ...)
    # stay on.
    c.graph_options.rewrite_options.disable_tfg_optimizer = True
    if task.job == "worker":
        c.device_filters.extend(["/job:ps", f"/job:worker/task:{task.index}"])
        c.operation_timeout_in_ms = timeouts.step_timeout_ms(cfg)
    elif task.job == "ps":
        # The ps's own session (its "done" queue) needs no other task. Without a filter its
        # creation waits for every worker, forever if one is gone, and its early failed
        # connections to workers that are still starting break their first steps.
        c.device_filters.append(f"/job:ps/task:{task.index}")
    return c


def start_server(task, cfg):
    """This task's TensorFlow server, listening on loopback when the cluster knows it there.

    A task whose own address is a loopback one (``tfps local``, a cluster on one box) gets a
    server on 127.0.0.1 only (``tfps.task.net.loopback``): TensorFlow would otherwise listen on
    every interface, and its port runs any graph sent to it. When that cannot be arranged the
    task refuses to start rather than open the port; and once the server has started, the
    kernel's own table of this process's sockets must show the port on loopback only
    (``tfps.task.net.listening``: a patch that reported success may still have missed), or the
    task refuses, and its exit closes the port. A port that another program holds is one
    line, not TensorFlow's traceback.
    """
    import tensorflow as tf

    host = split_target(task.target)[0]
    loopback = is_loopback_host(host)
    if loopback and not ensure_loopback_bind(bind_address(host)):
        raise ConfigError(f"{task.name} would listen on every interface although its address {task.target} is "
                          "loopback, and this TensorFlow build cannot be kept on loopback; give the task the "
                          "address of an interface that the hosts' firewall protects", "ps_hosts")
    bound = None if loopback else os.environ.get(guard.BIND_ADDRESS_ENV)   # tfps slurm --bind_interface
    if bound and not guard.ensure_address_bind(bound):
        raise ConfigError(f"{task.name} cannot be kept on {bound}: this TensorFlow build's bind call was not found; "
                          "drop --bind-interface (the cluster's network then protects the port)", "bind_interface")
    try:
        with _tf_chatter_hidden():
            server = tf.distribute.Server(cluster_spec(task), job_name=task.job, task_index=task.index,
                                          config=session_config(task, cfg), start=True)
    except (tf.errors.OpError, RuntimeError) as e:
        if _port_taken(host, task.port):
            raise ConfigError(f"{task.name} cannot listen on port {task.port}: another program holds it; stop "
                              "that program or give this task another port", "ps_hosts" if task.job == "ps"
                              else "worker_hosts") from None
        first = (getattr(e, "message", None) or str(e)).strip().splitlines()
        raise ConfigError(f"{task.name} could not start its TensorFlow server on {task.target}: "
                          f"{first[0] if first else type(e).__name__}") from None
    if loopback:
        require_loopback_only(task.name, task.target, task.port, "ps_hosts" if task.job == "ps" else "worker_hosts")
    elif bound:
        require_address_only(task.name, task.target, task.port, bound)
    return server


@contextlib.contextmanager
def _tf_chatter_hidden():
    """gRPC's C++ lines while a server starts ("Failed to add port to server", absl's
    notice) go to file descriptor 2 whatever TF_CPP_MIN_LOG_LEVEL says; without ``-v``
    they are dropped, and tfps says what went wrong in one line of its own."""
    if log.isEnabledFor(logging.DEBUG):
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    os.close(null)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _port_taken(host: str, port: int) -> bool:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((bind_address(host) if is_loopback_host(host) else "0.0.0.0", port))
        except OSError:
            return True
    return False


def cluster_spec(task):
    import tensorflow as tf
    return tf.train.ClusterSpec(task.cluster.as_dict())


def done_queue(ps_index: int, num_workers: int):
    """The queue of "worker i is done" tokens hosted by ps ``ps_index`` (same op everywhere)."""
    import tensorflow as tf
    with tf.device(f"/job:ps/task:{ps_index}"):
        return tf.compat.v1.FIFOQueue(DONE_QUEUE_CAPACITY, [tf.int32], shapes=[[]],
                                      shared_name=f"tfps_done_ps{ps_index}", name=f"tfps_done_ps{ps_index}")


def stop_flag():
    """The chief's "stop now" to every worker: a variable on ps 0, shared by name.

    A local variable, so it is never checkpointed: a job resumed from a stopped one does
    not stop again at once.
    """
    import tensorflow as tf
    v1 = tf.compat.v1
    with v1.device("/job:ps/task:0"):
        return v1.get_variable("tfps_stop_requested", initializer=False, trainable=False,
                               collections=[v1.GraphKeys.LOCAL_VARIABLES])


def health_file() -> str:
    return os.environ.get("TFPS_HEALTH_FILE") or os.path.join(tempfile.gettempdir(), "tfps-task.json")


def write_health(task) -> None:
    """Tell ``tfps healthcheck`` which port this task serves (containers' HEALTHCHECK)."""
    try:
        with open(health_file(), "w") as fh:
            json.dump({"pid": os.getpid(), "port": task.port, "name": task.name}, fh)
    except OSError as e:
        log.debug("cannot write health file: %s", e)


def healthcheck() -> ExitCode:
    """0 if this container's task process is alive and its gRPC port accepts connections."""
    import socket
    try:
        with open(health_file()) as fh:
            info = json.load(fh)
        os.kill(int(info["pid"]), 0)
        with socket.create_connection(("127.0.0.1", int(info["port"])), timeout=timeouts.HEALTHCHECK_CONNECT_SECS):
            pass
    except (OSError, ValueError, KeyError) as e:
        print(f"unhealthy: {e}")
        return ExitCode.TRAINING_FAILED
    print(f"healthy: {info['name']} serves port {info['port']}")
    return ExitCode.OK
