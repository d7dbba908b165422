"""One task of a Slurm step: its place from Slurm's variables, then the normal ``tfps run``.

The script that ``tfps slurm`` writes runs, as one ``srun`` step::

    python -m tfps.launch.slurm_step --ps N --workers M --rendezvous DIR [--gpus_per_worker G] -- RUN OPTIONS

Each task reads its rank and the step's nodes (``tfps.cluster.slurm``), picks a free port
on its node, publishes ``host:port`` in DIR (on the shared filesystem) and waits for every
other task's (``--startup_timeout``). It then runs as ``tfps run --ps_hosts ... --job_name
... --task_index ...`` with the run options: the same code as every other launcher.

The end: the chief writes its exit code to ``DIR/chief.exit`` (the script exits with it, so
Slurm records the chief's code), and rewrites ``DIR/chief.alive`` every 2 s while it lives:
a chief killed without a word (SIGKILL) is known to the others by its silence. The ps
tasks exit by themselves once every worker is done.
A task still running once the chief has exited is ended here as ``tfps local`` ends it: a
stop signal after a settling time (``SETTLE_SECS`` after a chief that succeeded, a few
seconds after one that did not), and a second one past the stop window. Slurm's own
signals (``scancel``, the walltime's ``--signal``) reach every task at once and are one
stop: the chief writes its final save, the ps serve it, and everybody exits.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time

from tfps import logs, timeouts
from tfps.cluster import slurm
from tfps.config import normalize_argv
from tfps.errors import ConfigError
from tfps.exitcodes import ExitCode
from tfps.task import entry
from tfps.task.net.loopback import BIND_ADDRESS_ENV
from tfps.task.runtime.signals import exit_now

log = logging.getLogger("tfps")

#: The file in the rendezvous directory that holds the chief's exit code.
CHIEF_EXIT = "chief.exit"
#: How often a task that is not the chief looks for the chief's exit code.
CHIEF_POLL_SECS = 1.0
#: The file the chief's process rewrites every CHIEF_BEAT_SECS while it lives.
CHIEF_ALIVE = "chief.alive"
CHIEF_BEAT_SECS = 2.0
#: A chief whose heartbeat has not changed for this long, without an exit code, was killed
#: (SIGKILL, the OOM killer): the other tasks stop as after a failed chief. Judged by each
#: task's own clock on what the file holds (a counter), so the nodes' clocks may differ.
CHIEF_SILENT_SECS = 60.0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tfps.launch.slurm_step",
                                description="One task of the Slurm step that tfps slurm's script runs.")
    p.add_argument("--ps", type=int, required=True)
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--rendezvous", required=True, help="a directory on the filesystem every node shares")
    p.add_argument("--gpus_per_worker", type=int, default=0)
    p.add_argument("--bind_interface", metavar="IFACE",
                   help="listen on this interface's IPv4 address only (and publish that address)")
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("run_args", nargs=argparse.REMAINDER, help="after --: the options of tfps run")
    return p


def _run_options(run_args: list[str]):
    try:
        return entry.build_parser().parse_args(run_args)
    except SystemExit as e:
        raise ConfigError("the run options after -- are not those of tfps run", "run options") from e


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    logs.setup(ns.verbose)
    run_args = normalize_argv(ns.run_args[1:] if ns.run_args[:1] == ["--"] else list(ns.run_args))
    try:
        step = slurm.from_environment(os.environ, ns.ps, ns.workers)
        me = step.me
        os.environ.update(slurm.worker_gpu_env(me, ns.gpus_per_worker, os.environ))
        options = _run_options(run_args)
        address = slurm.interface_address(ns.bind_interface, me.host) if ns.bind_interface else None
        port = slurm.pick_port()
        slurm.publish(ns.rendezvous, me, port, address)
        log.info("Slurm job %s step %s: rank %d is %s%s on %s:%d%s; waiting for the others' addresses in %s",
                 step.job_id, step.step_id, me.rank, me.name, " (the chief)" if me.name == "worker0" else "",
                 me.host, port, f" (listening on {ns.bind_interface}'s {address} only)" if address else "",
                 ns.rendezvous)
        if address:   # the task's TensorFlow server binds it alone (tfps.task.net.loopback), checked after its start
            os.environ[BIND_ADDRESS_ENV] = address
        cluster = slurm.gather(ns.rendezvous, step.layout, options.startup_timeout)
    except ConfigError as e:
        print(f"tfps: error: {e}", file=sys.stderr, flush=True)
        return int(ExitCode.BAD_CONFIG)
    log.info("cluster: ps %s, workers %s", ",".join(cluster.ps), ",".join(cluster.worker))
    flags = ["--ps_hosts", ",".join(cluster.ps), "--worker_hosts", ",".join(cluster.worker),
             "--job_name", me.job, "--task_index", str(me.index)]
    if ns.verbose:
        flags.append("-v")
    chief = me.name == "worker0"
    if chief:
        threading.Thread(target=_beat, args=(ns.rendezvous,), name="tfps-slurm-beat", daemon=True).start()
    else:
        threading.Thread(target=_end_after_chief, args=(ns.rendezvous, me.name), name="tfps-slurm-end",
                         daemon=True).start()
    code = int(entry.main(flags + run_args))
    if chief:
        _write_chief_exit(ns.rendezvous, code)
    return code


def _write_chief_exit(directory: str, code: int) -> None:
    path = os.path.join(directory, CHIEF_EXIT)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w") as fh:
            fh.write(f"{code}\n")
        os.replace(tmp, path)
    except OSError as e:
        log.warning("cannot record the chief's exit code in %s: %s", path, e)


def read_chief_exit(directory: str) -> int | None:
    try:
        with open(os.path.join(directory, CHIEF_EXIT)) as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None


def _beat(directory: str) -> None:
    """The chief's heartbeat: a counter rewritten every CHIEF_BEAT_SECS while its process lives."""
    path, beat = os.path.join(directory, CHIEF_ALIVE), 0
    while True:
        beat += 1
        try:
            with open(f"{path}.tmp", "w") as fh:
                fh.write(f"{beat}\n")
            os.replace(f"{path}.tmp", path)
        except OSError:
            pass
        time.sleep(CHIEF_BEAT_SECS)


def _chief_gone(directory: str, clock=time.monotonic, sleep=time.sleep) -> int:
    """Wait until the chief has exited; its exit code, or KILLED when its heartbeat stopped without one."""
    seen, changed = None, None
    while (code := read_chief_exit(directory)) is None:
        try:
            with open(os.path.join(directory, CHIEF_ALIVE)) as fh:
                beat = fh.read()
        except OSError:
            beat = None
        if beat and beat != seen:
            seen, changed = beat, clock()
        elif changed is not None and clock() - changed > CHIEF_SILENT_SECS:
            log.warning("the chief's process has given no sign of life for %.0f s and left no exit code: it "
                        "was killed (SIGKILL, the OOM killer?)", CHIEF_SILENT_SECS)
            return int(ExitCode.KILLED)
        sleep(CHIEF_POLL_SECS)
    return code


def _end_after_chief(directory: str, name: str) -> None:
    """Once the chief has exited, give this task time to end by itself, then stop it."""
    code = _chief_gone(directory)
    settle = timeouts.SETTLE_SECS if code == 0 else timeouts.LOCAL_STOP_WAIT_SECS
    time.sleep(settle)
    why = "the chief finished" if code == 0 else f"the chief exited with {code}"
    log.warning("%s still runs %.0f s after %s: stopping it", name, settle, why)
    # One SIGTERM, never a second: past the stop window the task would take it for a person's
    # deliberate "now" and say it exits without its final save. A ps waiting for a save that
    # never comes is ended below.
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(timeouts.LOCAL_STOP_WAIT_SECS)
    log.warning("%s did not exit within %.0f s of its SIGTERM after the job: ending it", name,
                timeouts.LOCAL_STOP_WAIT_SECS)
    exit_now(ExitCode.KILLED)


if __name__ == "__main__":
    sys.exit(main())
