"""The shared session settings and the task's TensorFlow server.

Every session of a task (the training session, the ps's own, the chief's watch and feeder)
takes its ConfigProto from ``session_config``: thread pools sized to the CPUs the task
shares (``auto_threads``), device filters so a worker never waits on other workers, the
step timeout. ``start_server`` starts the task's server, kept on loopback when the cluster
knows it there (tfps.task.net), with one line for a port another program holds.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys

from tfps import timeouts
from tfps.cluster.spec import split_target
from tfps.errors import ConfigError
from tfps.task.net import loopback as guard
from tfps.task.net.listening import require_address_only, require_loopback_only
from tfps.task.net.loopback import bind_address, ensure_loopback_bind, is_loopback_host

log = logging.getLogger("tfps")


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
