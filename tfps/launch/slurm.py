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
import unicodedata

from tfps import __version__, compat, timeouts
from tfps.config import add_replace_option, add_run_options, from_args
from tfps.errors import ConfigError
from tfps.exitcodes import ExitCode
from tfps.launch import owned
from tfps.outcome import lock

#: Slurm's longest ``--signal`` lead time (seconds).
MAX_SIGNAL_SECS = 65535
#: Slurm's default KillWait: seconds from a plain scancel's SIGTERM to its SIGKILL.
DEFAULT_KILL_WAIT = 30
#: The script's first lines: a file that starts so was written by tfps slurm and may be overwritten.
SCRIPT_MARK = "# Written by tfps slurm"


def _unsafe(ch: str) -> bool:
    """A control or format character, or a line or paragraph separator: it would end a line."""
    return unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp", "Cs")


def sbatch_value(value: str, field: str, what: str, also: str = "") -> str:
    """``value`` as ONE word of an ``#SBATCH`` line, or refused in one line naming ``field``.

    sbatch splits such a line at blanks outside double quotes, takes a double quote or a
    backslash as its syntax and an unquoted ``#`` as the start of a comment, and a line break
    ends the line (what follows would be the script's own command). So a value with a blank is
    written double-quoted, and one holding a quote, backslash, ``#``, a line break or another
    control character (or one of ``also``) is refused: no quoting carries it through every
    sbatch there is."""
    bad = next((ch for ch in value if ch in '"\\#' + also or _unsafe(ch)), None)
    if bad is not None:
        raise ConfigError(f"{value!r} holds {bad!r}, which an #SBATCH line of the script cannot carry; give "
                          f"{what} without it", field)
    return f'"{value}"' if any(ch.isspace() for ch in value) else value


def _extra_option(option: str) -> str:
    """An ``--sbatch-option`` as sbatch takes it: ``--name=VALUE`` with VALUE one word (quoted when it
    holds a blank), or words as given (``--mem 8G``)."""
    name, eq, value = option.partition("=")
    what = "--sbatch-option an option as sbatch takes it, e.g. --mem=8G,"
    if eq:
        return f"{sbatch_value(name, 'sbatch_option', what)}={sbatch_value(value, 'sbatch_option', what)}"
    sbatch_value(option, "sbatch_option", what)
    return option


def _output_path(slurm_dir: str) -> str:
    """The job's output file for ``#SBATCH --output``; a ``%`` of the model_dir's own is refused (it
    would start one of Slurm's filename patterns, as ``%j`` does)."""
    sbatch_value(slurm_dir, "model_dir", "--model-dir a path", also="%")
    return sbatch_value(os.path.join(slurm_dir, "slurm-%j.out"), "model_dir", "--model-dir a path")


def _comment(line: str) -> str:
    """A comment line that stays one line whatever a value in it holds (escapes instead of line breaks)."""
    return "".join(ch.encode("unicode_escape").decode("ascii") if _unsafe(ch) else ch for ch in line)


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
        f"#SBATCH --job-name={sbatch_value(name, 'run_name', 'the job a --run-name')}",
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
        lines += ["# The partition:",
                  f"#SBATCH --partition={sbatch_value(partition, 'partition', 'the partition name')}"]
    if time:
        lines += ["# The walltime:", f"#SBATCH --time={sbatch_value(time, 'time', 'a time such as 2:00:00')}"]
    lines += [
        "# Relative paths (data, model) as where tfps slurm ran:",
        f"#SBATCH --chdir={sbatch_value(workdir, 'directory', 'tfps slurm a working directory')}",
        "# Every task's output, each line prefixed by its rank (srun --label):",
        f"#SBATCH --output={_output_path(slurm_dir)}",
        f"# Before the walltime: SIGTERM to every task {grace} s ahead (--final_save_timeout + "
        f"{timeouts.GRACE_MARGIN} s), so the final save fits:",
        f"#SBATCH --signal=TERM@{grace}",
    ]
    if requeue:
        lines += ["# Slurm may requeue the job (node failure, preemption); it goes on from its checkpoint:",
                  "#SBATCH --requeue"]
    if extra:
        lines += ["# Options given with --sbatch-option:"] + [f"#SBATCH {_extra_option(opt)}" for opt in extra]
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
    # The user's values in comments (the name, the model_dir) stay in their comment line.
    return "\n".join(_comment(line) if line.startswith("#") else line for line in lines)


def written_by_tfps(path: str) -> bool:
    """Whether ``path`` is a script that tfps slurm wrote (its first lines say so), or empty."""
    return owned.written_by_tfps(path, "#!/bin/bash", SCRIPT_MARK, within=3)


def write_script(path: str, text: str, slurm_dir: str, field: str) -> None:
    """Write the script and make the job's Slurm directory (Slurm opens the job's output file there
    before any task runs); never over a file tfps did not write. A refusal leaves no directory behind
    that this call made."""
    if os.path.isdir(path):
        raise ConfigError(f"{path} is a directory; give -o the script to write, e.g. "
                          f"{os.path.join(path, 'job.sbatch')}", "output")
    if os.path.lexists(path) and not written_by_tfps(path):
        raise ConfigError(f"{path} exists and tfps slurm did not write it (its first lines are not a tfps slurm "
                          "script), so it was left as it is; give -o a new file, or move that one away", field)
    made: list[str] = []
    try:
        for directory in (os.path.dirname(path), slurm_dir):
            _makedirs(directory, made)
        with open(path, "w") as fh:
            fh.write(text)
    except OSError as e:
        for directory in reversed(made):
            try:
                os.rmdir(directory)
            except OSError:
                pass
        where = e.filename or path
        mine = field == "output" and not str(where).startswith(slurm_dir)
        raise ConfigError(f"cannot write {where}: {e.strerror or e}; give {'-o' if mine else '--model-dir'} a path "
                          "this user may write on the shared filesystem", "output" if mine else "model_dir") from None


def _makedirs(directory: str, made: list[str]) -> None:
    """Make ``directory`` and its missing parents, adding each one made to ``made`` (outermost first)."""
    missing: list[str] = []
    while directory and not os.path.isdir(directory):
        missing.insert(0, directory)
        parent = os.path.dirname(directory)
        if parent == directory:
            break
        directory = parent
    for d in missing:
        os.mkdir(d)
        made.append(d)


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
    slurm_dir = slurm_dir_of(model_dir)
    text = sbatch_script(name=cfg.name, num_ps=ns.ps, num_workers=ns.workers, model_dir=model_dir,
                         slurm_dir=slurm_dir, workdir=workdir, python=sys.executable, run_options=options, grace=grace,
                         partition=ns.partition, time=ns.time, nodes=ns.nodes,
                         gpus_per_worker=ns.gpus_per_worker, requeue=ns.requeue, extra=ns.sbatch_option,
                         verbose=ns.verbose, version=__version__, bind_interface=ns.bind_interface,
                         written=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
    path = os.path.abspath(ns.output or os.path.join(slurm_dir, "job.sbatch"))
    write_script(path, text, slurm_dir, "output" if ns.output else "model_dir")
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
