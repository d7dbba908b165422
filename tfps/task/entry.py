"""One task's process, from its ``tfps run`` flags to its exit: the one entry of a task.

``tfps run FLAGS`` (what every container runs) and each task ``tfps local`` forks both call
:func:`main` with the flags after ``run``. It holds the process policy: the one-line refusal
of bad input, the ``--restarts`` supervisor, the signals of the process's last seconds, and
the hard exit when a thread of TensorFlow still waits for a ps that has gone. It imports
TensorFlow only when the task starts (``tfps.task.run_task``), so the CLI can import it to
describe its options.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from tfps import logs, use_tf_keras
from tfps.config import ArgumentParser, add_replace_option, add_run_options, check_replicas, from_args, normalize_argv
from tfps.errors import ConfigError
from tfps.exitcodes import ExitCode
from tfps.task import run_task

#: When this process began (for a forked task: when the launcher imported tfps), the start of
#: the task's start-up timings.
PROCESS_START = time.time()


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``tfps run``: where the task sits in the cluster, and the job's options."""
    g = p.add_argument_group("cluster (classic flags; or set TF_CONFIG)")
    g.add_argument("--ps_hosts", help="comma-separated host:port of the ps tasks")
    g.add_argument("--worker_hosts", help="comma-separated host:port of the workers (the first is the chief)")
    g.add_argument("--job_name", help="ps or worker")
    g.add_argument("--task_index", type=int, help="index of this task in its job")
    add_run_options(p)
    p.add_argument("--restarts", type=int, default=0, metavar="N",
                   help="start the task's process again, up to N times, when a signal kills it (the OOM "
                        "killer, a crash) and nobody asked it to stop; the container or launcher around it "
                        "sees one process that lives on (default %(default)s)")
    add_replace_option(p, "the chief: ")


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="tfps run", description="Run one task of a cluster.")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="debug logging, and TensorFlow's own log lines (hidden otherwise)")
    add_arguments(p)
    return p


#: What to install when TensorFlow is missing: tfps itself installs without it.
TF_EXTRAS_HINT = "pip install 'tfps[cpu]' (or 'tfps[gpu]' on a host with NVIDIA GPUs)"


def require_tensorflow() -> None:
    """Refuse a training command before anything starts when TensorFlow is not installed.

    ``find_spec`` only looks the package up; importing TensorFlow takes seconds.
    """
    import importlib.util
    if importlib.util.find_spec("tensorflow") is None:
        raise ConfigError(f"TensorFlow is not installed, and tfps needs it to train; install it with {TF_EXTRAS_HINT}")


def main(argv: list[str]) -> ExitCode | int:
    """Run the task that the ``tfps run`` flags ``argv`` describe; return its exit code.

    The caller exits with it. Bad input is one line on stderr and ``BAD_CONFIG``.
    """
    use_tf_keras()   # a forked task of tfps local enters here: tf.keras is tf_keras unless the user said otherwise
    argv = normalize_argv(list(argv))
    try:
        ns = build_parser().parse_args(argv)
    except SystemExit as e:          # argparse has printed its own one line (or --help)
        return ExitCode.OK if e.code == 0 else ExitCode.BAD_CONFIG
    logs.setup(ns.verbose)
    try:
        return _run(ns, argv)
    except ConfigError as e:
        print(f"tfps: error: {e}", file=sys.stderr)
        return ExitCode.BAD_CONFIG
    except KeyboardInterrupt:
        return ExitCode.STOPPED


def _run(ns: argparse.Namespace, argv: list[str]) -> ExitCode | int:
    from tfps.cluster import TaskRef  # lazy: only a running task needs it, not the parser
    require_tensorflow()
    cfg = from_args(ns)
    task = TaskRef.resolve(ns.ps_hosts, ns.worker_hosts, ns.job_name, ns.task_index)
    check_replicas(cfg, task.num_workers)
    if task.is_chief:   # refuse malformed notification URLs before anything starts
        from tfps.notify import notifier_for  # lazy: only a running task needs it, not the parser
        notifier_for(cfg.notify, cfg.notify_config)
    if ns.restarts < 0:
        raise ConfigError(f"{ns.restarts} is negative; use 0 (never) or how many times to restart", "restarts")
    from tfps.task.runtime.supervise import (  # lazy: only a running task needs it, not the parser
        SUPERVISED_ENV,
        supervise,
    )
    if ns.restarts > 0 and not os.environ.get(SUPERVISED_ENV):
        return supervise(["run", *argv], ns.restarts, task.name)
    # lazy: only a running task needs it, not the parser
    from tfps.task.runtime.signals import StopSignal, exit_now, rpc_abandoned
    code = run_task(task, cfg, StopSignal(), PROCESS_START, replace=ns.replace)
    # The task is over and its exit status decided; only the interpreter and TensorFlow
    # shut down now (a second or two), and Python restores SIGTERM's default action for
    # that. An orchestrator cleaning up at this moment (`docker compose up --exit-code-from`
    # stops the other tasks as soon as the chief exits) must not turn a clean exit into
    # "killed by SIGTERM" (143).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if rpc_abandoned():   # a thread still waits in TensorFlow for a ps that has gone
        exit_now(code)
    return code
