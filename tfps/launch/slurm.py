"""``tfps slurm``: the job as one Slurm batch job, every task in one ``srun`` step.

It writes an sbatch script (and submits it with ``--submit``). The script runs
``python -m tfps.launch.slurm_step`` once per task with the interpreter that wrote it, so
the nodes must see this installation and the model_dir at the same paths (a shared
filesystem). Each task finds its role, its node and the others' ports itself
(``tfps.cluster.slurm``); see docs/slurm.md for the end of a job, stops and GPUs.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import re
import shlex
import shutil
import subprocess
import sys

from tfps import compat, timeouts
from tfps.config import add_replace_option, add_run_options, from_args
from tfps.errors import ConfigError
from tfps.exitcodes import ExitCode
from tfps.outcome import lock

#: Slurm's longest ``--signal`` lead time (seconds).
MAX_SIGNAL_SECS = 65535
#: Slurm's default KillWait: seconds from a plain scancel's SIGTERM to its SIGKILL.
DEFAULT_KILL_WAIT = 30


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("Slurm")
    g.add_argument("--ps", type=int, default=1, help="number of ps tasks (default %(default)s)")
    g.add_argument("--workers", type=int, default=2, help="number of workers (default %(default)s)")
    g.add_argument("--partition", help="the partition to run in (sbatch --partition)")
    g.add_argument("--time", help="the walltime (sbatch --time: MINUTES, HH:MM:SS, D-HH:MM, ...)")
    g.add_argument("--nodes", type=int, metavar="K", help="nodes to spread the tasks over (sbatch --nodes)")
    g.add_argument("--gpus_per_worker", type=int, default=0, metavar="G",
                   help="GPUs per worker: every task slot on a node gets G GPUs (--gres), each worker uses its "
                        "own G, the ps tasks none (needs --nodes; default 0, CPU only)")
    g.add_argument("--bind_interface", metavar="IFACE",
                   help="each task's TensorFlow server listens on this network interface's IPv4 address only "
                        "(the cluster network's, e.g. ib0), and the tasks reach each other there; default: every "
                        "interface (docs/security.md)")
    g.add_argument("--sbatch_option", action="append", default=[], metavar="OPTION",
                   help="one more #SBATCH line, e.g. --sbatch-option=--mem=8G; repeatable")
    g.add_argument("--requeue", action="store_true",
                   help="let Slurm requeue the job (node failure, preemption): it goes on from its checkpoint")
    g.add_argument("--restarts", type=int, default=0, metavar="N",
                   help="start a task's process again, up to N times, when a signal kills it (as tfps run)")
    g.add_argument("-o", "--output", metavar="FILE",
                   help="where to write the script (default MODEL_DIR.slurm/job.sbatch)")
    g.add_argument("--submit", action="store_true", help="submit it with sbatch and print the job id")
    add_replace_option(p)
    add_run_options(p)


def run_argv(ns: argparse.Namespace, overrides: dict[str, str]) -> list[str]:
    """The ``tfps run`` options that ``ns`` holds, as flags: those that differ from their defaults."""
    template = argparse.ArgumentParser(add_help=False)
    add_run_options(template)
    add_replace_option(template)
    argv: list[str] = []
    for action in compat.parser_actions(template):
        if not action.option_strings:
            continue
        flag = next(s for s in action.option_strings if s.startswith("--"))
        value = overrides.get(action.dest, getattr(ns, action.dest, action.default))
        if value is None or value == action.default:
            continue
        if isinstance(action, argparse.BooleanOptionalAction) or action.nargs == 0:
            argv.append(flag if value else f"--no-{flag[2:]}")
        elif isinstance(value, list):
            for item in value:
                argv += [flag, str(item)]
        else:
            argv += [flag, str(value)]
    return argv


def slurm_dir_of(model_dir: str) -> str:
    """The job's Slurm files (script, output, rendezvous), beside its model_dir: a model_dir holds only
    what the job writes."""
    return model_dir.rstrip(os.sep) + ".slurm"


def walltime_secs(text: str) -> int:
    """Slurm's ``--time`` in seconds: MINUTES, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS."""
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text.strip())
    if not m:
        raise ConfigError(f"{text!r} is not a Slurm time; write MINUTES, HH:MM:SS or D-HH:MM:SS (e.g. 2:00:00)",
                          "time")
    days, a, b, c = (int(x) if x is not None else None for x in m.groups())
    if days is not None:   # D-HH[:MM[:SS]]
        return days * 86400 + a * 3600 + (b or 0) * 60 + (c or 0)
    if c is not None:
        return a * 3600 + b * 60 + c
    if b is not None:
        return a * 60 + b
    return a * 60


def check(ns: argparse.Namespace, grace: int) -> None:
    """Refuse what cannot run, in one line each, before anything is written or submitted."""
    for name in ("ps", "workers"):
        if getattr(ns, name) < 1:
            raise ConfigError(f"{getattr(ns, name)} is not a count of tasks; give at least 1", name)
    total = ns.ps + ns.workers
    if ns.nodes is not None and not 1 <= ns.nodes <= total:
        raise ConfigError(f"{ns.nodes} node(s) for {total} task(s); give 1 to {total}", "nodes")
    if ns.gpus_per_worker < 0:
        raise ConfigError(f"{ns.gpus_per_worker} is negative; give 0 (CPU) or the GPUs of each worker",
                          "gpus_per_worker")
    if ns.gpus_per_worker and ns.nodes is None:
        raise ConfigError("GPUs are asked per node: give --nodes with --gpus-per-worker", "nodes")
    if ns.restarts < 0:
        raise ConfigError(f"{ns.restarts} is negative; use 0 (never) or how many times to restart", "restarts")
    if ns.notify:
        raise ConfigError("URLs on a command line land in the script and in every process list; put them in a "
                          "file on the shared filesystem and give --notify-config FILE (or set APPRISE_URLS_FILE)",
                          "notify")
    if ns.bind_interface is not None and not re.fullmatch(r"[\w.:@-]{1,15}", ns.bind_interface):
        raise ConfigError(f"{ns.bind_interface!r} is not a network interface name; give one such as eth0 or ib0 "
                          "(ip -br addr lists them)", "bind_interface")
    for option in ns.sbatch_option:
        if not option.startswith("-") or "\n" in option:
            raise ConfigError(f"{option!r} is not an sbatch option; write it as sbatch takes it, e.g. --mem=8G",
                              "sbatch_option")
    if grace > MAX_SIGNAL_SECS:
        raise ConfigError(f"the final save's grace ({grace} s) is beyond Slurm's longest --signal lead "
                          f"({MAX_SIGNAL_SECS} s); lower --final-save-timeout", "final_save_timeout")
    if ns.time is not None:
        wall = walltime_secs(ns.time)
        if wall <= grace:
            raise ConfigError(f"{ns.time} ({wall} s) leaves no training before the final save's warning signal, "
                              f"{grace} s before the end (--final-save-timeout + {timeouts.GRACE_MARGIN} s); ask "
                              "for more time or lower --final-save-timeout", "time")


def sbatch_script(*, name: str, num_ps: int, num_workers: int, model_dir: str, slurm_dir: str, workdir: str,
                  python: str,
                  run_options: list[str], grace: int, partition: str | None = None, time: str | None = None,
                  nodes: int | None = None, gpus_per_worker: int = 0, requeue: bool = False,
                  extra: list[str] | None = None, verbose: bool = False, version: str = "",
                  written: str = "", bind_interface: str | None = None) -> str:
    """The text of the sbatch script (pure: unit-tested as it is)."""
    total = num_ps + num_workers
    q = shlex.quote
    ps_ranks = "rank 0 is the ps" if num_ps == 1 else f"ranks 0..{num_ps - 1} are the ps tasks"
    lines = [
        "#!/bin/bash",
        f"# tfps job {name}: {num_ps} ps + {num_workers} worker task(s), one Slurm task each, all in one srun step.",
        f"# Written by tfps slurm{f' {version}' if version else ''}{f' on {written}' if written else ''}; edit it "
        "freely. Submit: sbatch THIS_FILE.",
        "# Stop with the final save: scancel JOBID (SIGTERM to every task; Slurm's SIGKILL follows after",
        "# KillWait), or scancel --signal=TERM JOBID when the final save needs longer than KillWait (the tasks",
        "# end by themselves).",
        "#",
        "# The job's name in squeue and scontrol:",
        f"#SBATCH --job-name={name}",
        f"# One Slurm task per tfps task: {ps_ranks}, rank {num_ps} the chief (worker 0), then the other workers:",
        f"#SBATCH --ntasks={total}",
    ]
    if nodes is not None:
        lines += ["# The nodes the tasks spread over (in rank order, a node's tasks together):",
                  f"#SBATCH --nodes={nodes}"]
    if gpus_per_worker:
        per_node = math.ceil(total / nodes)
        lines += ["# Task slots per node; every slot gets its worker's GPUs (a ps slot's stay unused: ps run on CPU):",
                  f"#SBATCH --ntasks-per-node={per_node}",
                  f"# {gpus_per_worker} GPU(s) per worker x {per_node} slot(s) per node:",
                  f"#SBATCH --gres=gpu:{gpus_per_worker * per_node}"]
    if partition:
        lines += ["# The partition:", f"#SBATCH --partition={partition}"]
    if time:
        lines += ["# The walltime:", f"#SBATCH --time={time}"]
    lines += [
        "# Relative paths (data, model) as where tfps slurm ran:",
        f"#SBATCH --chdir={workdir}",
        "# Every task's output, each line prefixed by its rank (srun --label):",
        f"#SBATCH --output={os.path.join(slurm_dir, 'slurm-%j.out')}",
        f"# Before the walltime: SIGTERM to every task {grace} s ahead (--final_save_timeout + "
        f"{timeouts.GRACE_MARGIN} s), so the final save fits:",
        f"#SBATCH --signal=TERM@{grace}",
    ]
    if requeue:
        lines += ["# Slurm may requeue the job (node failure, preemption); it goes on from its checkpoint:",
                  "#SBATCH --requeue"]
    if extra:
        lines += ["# Options given with --sbatch-option:"] + [f"#SBATCH {opt}" for opt in extra]
    step = [python, "-m", "tfps.launch.slurm_step", "--ps", str(num_ps), "--workers", str(num_workers),
            "--rendezvous", '"$RENDEZVOUS"']
    if gpus_per_worker:
        step += ["--gpus_per_worker", str(gpus_per_worker)]
    if bind_interface:
        step += ["--bind_interface", bind_interface]
    if verbose:
        step.append("-v")
    step.append("--")
    cmd = " ".join(part if part == '"$RENDEZVOUS"' else q(part) for part in step)
    options = " ".join(q(o) for o in run_options)
    lines += [
        "",
        "set -u",
        f"# The job's Slurm files (this script, the output, the addresses), beside its model_dir {model_dir}:",
        f"SLURM_DIR={q(slurm_dir)}",
        "# Where the tasks exchange host:port (free ports, picked by each task on its node): one per run of the job.",
        'RENDEZVOUS="$SLURM_DIR/rendezvous/${SLURM_JOB_ID}-${SLURM_RESTART_COUNT:-0}"',
        'mkdir -p "$RENDEZVOUS"',
        "# scancel signals this shell too: it waits for the step and then reports the chief's exit code.",
        "trap : TERM INT HUP",
        f"srun --ntasks={total} --distribution=block --label --kill-on-bad-exit=0 \\",
        f"    {cmd} \\",
        f"    {options}" if options else "    ",
        "rc=$?",
        "# The job's exit code is the chief's (the ps and the other workers follow it):",
        'if [ -s "$RENDEZVOUS/chief.exit" ]; then',
        '    rc=$(cat "$RENDEZVOUS/chief.exit")',
        '    echo "tfps: Slurm job ${SLURM_JOB_ID}: the chief exited with $rc"',
        "else",
        '    echo "tfps: Slurm job ${SLURM_JOB_ID}: the chief left no exit code (killed?); the step exited with $rc"',
        '    if [ "$rc" = 0 ]; then rc=1; fi',
        "fi",
        'exit "$rc"',
        "",
    ]
    return "\n".join(lines)


def kill_wait() -> int | None:
    """The cluster's KillWait from ``scontrol show config``; None where it cannot be read."""
    if not shutil.which("scontrol"):
        return None
    try:
        out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"^KillWait\s*=\s*(\d+)", out, re.M)
    return int(m.group(1)) if m else None


def main(ns: argparse.Namespace) -> ExitCode:
    import logging
    log = logging.getLogger("tfps")
    cfg = from_args(ns)
    grace = timeouts.grace_period(cfg.final_save_timeout)
    check(ns, grace)
    workdir = os.getcwd()
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    model_dir = os.path.abspath(ns.model_dir or os.path.join("runs", f"{cfg.name}-{stamp}"))
    # A job running in model_dir (its chief holds the lock, seen over the shared filesystem): refused
    # here; a job that starts meanwhile is refused by this job's chief when it starts.
    lock.check_free(model_dir)
    overrides = {"model_dir": model_dir}
    if ns.export_dir:
        overrides["export_dir"] = os.path.abspath(ns.export_dir)
    options = run_argv(ns, overrides)
    if ns.restarts:
        options += ["--restarts", str(ns.restarts)]
    from tfps import __version__
    slurm_dir = slurm_dir_of(model_dir)
    text = sbatch_script(name=cfg.name, num_ps=ns.ps, num_workers=ns.workers, model_dir=model_dir,
                         slurm_dir=slurm_dir, workdir=workdir, python=sys.executable, run_options=options, grace=grace,
                         partition=ns.partition, time=ns.time, nodes=ns.nodes,
                         gpus_per_worker=ns.gpus_per_worker, requeue=ns.requeue, extra=ns.sbatch_option,
                         verbose=ns.verbose, version=__version__, bind_interface=ns.bind_interface,
                         written=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
    path = os.path.abspath(ns.output or os.path.join(slurm_dir, "job.sbatch"))
    try:
        os.makedirs(slurm_dir, exist_ok=True)   # Slurm opens the job's output file there before any task runs
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as fh:
            fh.write(text)
    except OSError as e:
        raise ConfigError(f"cannot write {e.filename or path}: {e.strerror or e}; give a directory this user may "
                          "write on the shared filesystem", "model_dir") from None
    log.info("wrote %s: %d ps + %d worker(s), model_dir %s", path, ns.ps, ns.workers, model_dir)
    wait = kill_wait()
    if cfg.final_save_timeout > (wait if wait is not None else DEFAULT_KILL_WAIT):
        log.info("a plain scancel leaves the final save %s s (KillWait%s), --final-save-timeout allows %g s: for a "
                 "long save stop with scancel --signal=TERM JOBID, and a plain scancel only if that hangs",
                 wait if wait is not None else DEFAULT_KILL_WAIT, "" if wait is not None else ", Slurm's default",
                 cfg.final_save_timeout)
    if not ns.submit:
        return ExitCode.OK
    if not shutil.which("sbatch"):
        raise ConfigError("sbatch is not on the PATH: run tfps slurm --submit on a Slurm login node, or submit "
                          f"{path} there with sbatch", "submit")
    proc = subprocess.run(["sbatch", "--parsable", path], capture_output=True, text=True)
    if proc.returncode != 0:
        reason = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        raise ConfigError(f"sbatch refused {path}: {reason}", "submit")
    job_id = proc.stdout.strip().split(";")[0]
    log.info("submitted Slurm job %s; output in %s", job_id, os.path.join(slurm_dir, f"slurm-{job_id}.out"))
    print(job_id, flush=True)
    return ExitCode.OK
