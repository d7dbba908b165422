"""The Slurm backend (``tfps slurm``, ``--slurm``): the user's tfps jobs under Slurm, seen from a login node.

``tfps slurm`` writes (and submits) the sbatch script (``tfps.launch.slurm``); its one step
runs ``tfps.launch.slurm_step`` per task. ``tfps jobs/logs/status/stop --slurm`` see the jobs this way.
What Slurm knows comes from ``squeue`` (the user's jobs, finished ones while slurmctld keeps
them: ``MinJobAge``) and ``scontrol show job -o`` (each job's output file and start). A job
is a tfps job when its output file sits in a ``MODEL_DIR.slurm`` directory, as ``tfps
slurm``'s script puts it; its progress comes from the model_dir on the shared filesystem
(``status.json``, ``history.jsonl``, ``results.json``). A job that Slurm has forgotten is
found on disk, under the directories given (``MODEL_DIR.slurm/slurm-JOBID.out``); its state
is its results.json's. No accounting (``sacct``) is needed.

The table and the log lines have the Ansible side's format (``tfps.backends.protocol.render``): a task's
lines are those of its rank in the step's output (``srun --label``), prefixed ``[task] ``.
"""

from __future__ import annotations

import datetime
import getpass
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

from tfps import logs
from tfps.backends import DEFAULT_DIRS
from tfps.backends.protocol import Start, age, print_row, render
from tfps.cluster import Launch, Plan
from tfps.cluster.slurm import expand_hostlist
from tfps.errors import ConfigError
from tfps.exitcodes import ExitCode
from tfps.jsonfile import read_json
from tfps.launch import slurm as slurm_launch
from tfps.outcome.results import HISTORY, RESULTS, STATUS, eta_seconds, read_jsonl

#: Slurm's states of a job that has not ended yet.
ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "RESIZING", "REQUEUED", "REQUEUE_HOLD",
          "REQUEUE_FED", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD"}
#: What squeue prints per job (id, state, name, nodes): names never hold a '|' that matters,
#: the name is read between the second '|' and the last.
SQUEUE_FORMAT = "%i|%T|%j|%N"
#: The suffix of the directory that holds a job's Slurm files beside its model_dir.
SLURM_DIR_SUFFIX = ".slurm"
_LABEL = re.compile(r"^\s*(\d+): ?(.*)$")
_RANK_IS = re.compile(r"\brank (\d+) is ((?:ps|worker)\d+)\b.* on ([^\s:]+):\d+")
_SCONTROL_KEY = re.compile(r"(?:^|\s)([A-Za-z][\w/:]*)=")


# --------------------------------------------------------------------------- Slurm's output

def parse_squeue(text: str) -> list[dict]:
    """``squeue -h -o '%i|%T|%j|%N'``: one ``{id, state, name, nodes}`` per job, in squeue's order."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.strip().split("|", 2)
        if len(parts) < 3 or "|" not in parts[2]:
            continue
        name, nodes = parts[2].rsplit("|", 1)
        out.append({"id": parts[0], "state": parts[1].split()[0] if parts[1] else "", "name": name, "nodes": nodes})
    return out


def parse_scontrol(text: str) -> dict[str, dict[str, str]]:
    """``scontrol show job`` (one line per job with ``-o``, or its indented blocks): each job's
    ``Key=value`` pairs by job id. A value runs to the next `` Key=``."""
    blocks: list[str] = []
    for line in text.splitlines():
        if line.startswith("JobId="):
            blocks.append(line)
        elif blocks and line.strip():
            blocks[-1] += " " + line.strip()
    jobs = {}
    for block in blocks:
        keys = list(_SCONTROL_KEY.finditer(block))
        fields = {}
        for i, m in enumerate(keys):
            end = keys[i + 1].start() if i + 1 < len(keys) else len(block)
            fields[m.group(1)] = block[m.end():end].strip()
        jobs[fields["JobId"]] = fields
    return jobs


def _run(argv: list[str]) -> str:
    if not shutil.which(argv[0]):
        raise ConfigError(f"{argv[0]} is not on the PATH: run tfps jobs/logs --slurm on a Slurm login node (or a "
                          "node with Slurm's commands)", "slurm")
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        raise ConfigError(f"{argv[0]} did not answer: {e}", "slurm") from None
    if proc.returncode != 0:
        reason = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        raise ConfigError(f"{' '.join(argv[:2])} failed: {reason}", "slurm")
    return proc.stdout


def read_slurm() -> dict[str, dict]:
    """This user's jobs as Slurm knows them: squeue's list, each with scontrol's fields."""
    listed = parse_squeue(_run(["squeue", "-h", "-t", "all", "-u", getpass.getuser(), "-o", SQUEUE_FORMAT]))
    if not listed:
        return {}
    details = parse_scontrol(_run(["scontrol", "show", "job", "-o"]))
    return {j["id"]: {**details.get(j["id"], {}), "squeue": j} for j in listed}


# --------------------------------------------------------------------------- a job's files

def _job_of_output(path: str, slurm: dict | None = None) -> dict | None:
    """A tfps job from its output file ``MODEL_DIR.slurm/slurm-JOBID.out``; None for another job's."""
    slurm_dir = os.path.dirname(path)
    m = re.fullmatch(r"slurm-(\d+(?:_\d+)?)\.out", os.path.basename(path))
    if not slurm_dir.endswith(SLURM_DIR_SUFFIX) or not m:
        return None
    script = (slurm or {}).get("Command") or os.path.join(slurm_dir, "job.sbatch")
    return {"id": m.group(1), "out": path, "slurm_dir": slurm_dir, "model_dir": slurm_dir[:-len(SLURM_DIR_SUFFIX)],
            "script": script if os.path.isfile(script) else None, "slurm": slurm}


def _script_settings(script: str | None) -> dict:
    """The job name, ps count and train_steps that tfps slurm wrote into the script."""
    try:
        with open(script) as fh:
            text = fh.read()
    except (OSError, TypeError):
        return {}
    found = {}
    if m := re.search(r'^#SBATCH --job-name=(?:"([^"]*)"|(\S+))', text, re.M):   # quoted when it holds a blank
        found["name"] = m.group(1) if m.group(1) is not None else m.group(2)
    if m := re.search(r"tfps\.launch\.slurm_step'? --ps '?(\d+)'? --workers '?(\d+)", text):
        found["ps"], found["workers"] = int(m.group(1)), int(m.group(2))
    for line in text.splitlines():
        if "--train_steps" in line or "--train-steps" in line:
            try:
                words = shlex.split(line.rstrip("\\"))
            except ValueError:
                continue
            for i, w in enumerate(words):
                if w in ("--train_steps", "--train-steps") and i + 1 < len(words) and words[i + 1].isdigit():
                    found["train_steps"] = int(words[i + 1])
                elif w.startswith(("--train_steps=", "--train-steps=")) and w.split("=", 1)[1].isdigit():
                    found["train_steps"] = int(w.split("=", 1)[1])
    return found


def _results_of(job: dict) -> dict | None:
    """The model_dir's results.json when this Slurm job wrote it (its ``slurm_job`` names the job)."""
    res = read_json(os.path.join(job["model_dir"], RESULTS))
    if not isinstance(res, dict):
        return None
    named = str(res.get("slurm_job") or "")
    return res if named.split(" ")[0] == job["id"] else None


def _hosts_of_output(path: str) -> list[str]:
    hosts = {}
    try:
        with open(path, errors="replace") as fh:
            for line in fh:
                if m := _RANK_IS.search(line):
                    hosts[int(m.group(1))] = m.group(3)
    except OSError:
        return []
    return sorted(set(hosts.values()))


def _when(text: str | None) -> float | None:
    """scontrol's time (the controller's local time, as on this login node); None for Unknown/None."""
    try:
        return datetime.datetime.fromisoformat(text).timestamp() if text else None
    except ValueError:
        return None


def row_of(job: dict, now: float | None = None) -> dict:
    """One row of the table (tfps.backends.protocol.COLUMNS) for a tfps job under Slurm."""
    now = time.time() if now is None else now
    slurm = job.get("slurm") or {}
    settings = _script_settings(job.get("script"))
    state = (slurm.get("squeue") or {}).get("state") or slurm.get("JobState", "").split(" ")[0]
    name = slurm.get("JobName") or settings.get("name") or os.path.basename(job["model_dir"])
    status = read_json(os.path.join(job["model_dir"], STATUS))
    status = status if isinstance(status, dict) else {}
    history = read_jsonl(os.path.join(job["model_dir"], HISTORY))
    results = _results_of(job)
    active = state in ACTIVE
    if active and results is None and status.get("phase") in ("succeeded", "failed", "stopped"):
        status = {**status, "eta_s": 0.0}
    total = int(status.get("train_steps") or (results or {}).get("train_steps") or settings.get("train_steps") or 0)
    newest = history[-1] if history else {}
    step = status.get("step", newest.get("step", (results or {}).get("global_step", 0)))
    loss = status.get("loss", newest.get("loss", (results or {}).get("final_loss")))
    rate = status.get("examples_per_sec") or newest.get("examples_per_sec")
    if active:
        shown = state.lower()
    elif results is not None:
        shown = str(results.get("status"))
        if state:
            shown += f" ({state}{' ' + slurm['ExitCode'] if slurm.get('ExitCode') else ''})"
    else:
        shown = f"{state or 'ended'} {slurm.get('ExitCode', '')}".strip() + ", no results.json"
    started = _when(slurm.get("StartTime"))
    if started is None and results and results.get("started_at"):
        started = _when(str(results["started_at"]).replace("Z", "+00:00"))
    eta = status.get("eta_s")
    if eta is None and len(history) > 1 and total:
        eta = eta_seconds(history[-1], history[-2], total)
    nodes = slurm.get("NodeList") or (slurm.get("squeue") or {}).get("nodes")
    try:
        hosts = expand_hostlist(nodes) if nodes and nodes != "(null)" else _hosts_of_output(job["out"])
    except ConfigError:
        hosts = [nodes]
    return {"job": f"{name} ({job['id']})", "state": shown,
            "step": f"{int(step or 0)}/{total or '?'}",
            "loss": f"{loss:.4f}" if isinstance(loss, (int, float)) else "-",
            "examples/s": f"{rate:.0f}" if isinstance(rate, (int, float)) and rate else "-",
            "started": age(now - started) if started else "-",
            "ETA": f"{eta:.0f} s" if active and state == "RUNNING" and isinstance(eta, (int, float)) else "-",
            "hosts": ",".join(hosts) if hosts else "-"}


def find_jobs(dirs: list[str], slurm: dict[str, dict] | None = None) -> list[dict]:
    """Every tfps job: those Slurm knows (``slurm``, from read_slurm), then those left on disk
    under ``dirs`` (``DIR/*.slurm/slurm-JOBID.out``; per model_dir its newest job only)."""
    found: dict[str, dict] = {}
    for job_id, fields in (slurm or {}).items():
        out = fields.get("StdOut", "")
        job = _job_of_output(out.replace("%j", job_id), fields) if out else None
        if job is not None:
            found[job_id] = job
    newest: dict[str, dict] = {}
    for d in dirs:
        for path in glob.glob(os.path.join(glob.escape(d), f"*{SLURM_DIR_SUFFIX}", "slurm-*.out")):
            job = _job_of_output(os.path.abspath(path))
            if job is None or job["id"] in found:
                continue
            seen = newest.get(job["model_dir"])
            if seen is None or _id_key(job["id"]) > _id_key(seen["id"]):
                newest[job["model_dir"]] = job
    known_dirs = {j["model_dir"] for j in found.values()}
    for job in newest.values():
        if job["model_dir"] not in known_dirs or _results_of(job) is not None:
            found[job["id"]] = job
    return [found[k] for k in sorted(found, key=_id_key)]


def _id_key(job_id: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", job_id))


#: What a job's files may hold that row_of cannot read (a value of the wrong type, a line that is no record).
_UNREADABLE = (TypeError, ValueError, AttributeError, KeyError, OverflowError)


def list_jobs(dirs: list[str], slurm: dict[str, dict] | None = None) -> tuple[str, bool]:
    """(the table, whether every job's files could be read): a job whose files hold values of the
    wrong type is one line after the table, naming its model_dir; the other jobs are listed."""
    rows, errors = [], {}
    for job in find_jobs(dirs, read_slurm() if slurm is None else slurm):
        try:
            rows.append(row_of(job))
        except _UNREADABLE as e:
            why = " ".join(f"{type(e).__name__}: {e}".split())
            errors[f"job {job['id']} ({job['model_dir']})"] = (
                f"a value in its files has the wrong type ({why}); check status.json, history.jsonl and "
                "results.json there")
    if not rows and not errors:
        return "no tfps job in squeue or under " + ", ".join(dirs), True
    if not rows:
        return "\n".join(f"{job}: not read: {error}" for job, error in sorted(errors.items())), False
    return render(rows, errors), not errors


# --------------------------------------------------------------------------- logs

def find_job(key: str, dirs: list[str], slurm: dict[str, dict]) -> dict | None:
    """The job that ``key`` names: a Slurm job id, or a job name (its newest job)."""
    jobs = find_jobs(dirs, slurm)
    for job in reversed(jobs):
        if job["id"] == key:
            return job
    for job in reversed(jobs):
        name = (job.get("slurm") or {}).get("JobName") or _script_settings(job.get("script")).get("name")
        if key in (name, os.path.basename(job["model_dir"])):
            return job
    return None


def rank_of(task: str, text: str, script: str | None) -> int | None:
    """The step rank of ``task`` (ps0, worker1, ...): as the output says it, else from the script's ps count."""
    for m in _RANK_IS.finditer(text):
        if m.group(2) == task:
            return int(m.group(1))
    settings = _script_settings(script)
    m = re.fullmatch(r"(ps|worker)(\d+)", task)
    if "ps" not in settings or m is None:
        return None
    index = int(m.group(2))
    if index >= settings["ps" if m.group(1) == "ps" else "workers"]:
        raise ConfigError(f"the job has {settings['ps']} ps task(s) and {settings['workers']} worker(s): there is "
                          f"no {task}; give ps0..ps{settings['ps'] - 1} or worker0..worker{settings['workers'] - 1}",
                          "task")
    return index + (0 if m.group(1) == "ps" else settings["ps"])


def task_lines(text: str, rank: int | None, task: str) -> list[str]:
    """The lines of ``rank`` in the step's output, prefixed ``[task] ``; the script's and
    Slurm's own unlabelled lines (the chief's exit, a cancel) as ``[slurm] ``."""
    out = []
    for line in text.splitlines():
        m = _LABEL.match(line)
        if m is None:
            if line.strip():
                out.append(f"[slurm] {line}")
        elif rank is not None and int(m.group(1)) == rank and not logs.is_tf_noise(m.group(2)):
            out.append(f"[{task}] {m.group(2)}")
    return out


def _state(job_id: str) -> str:
    """The job's state now: squeue's; '' once Slurm has forgotten it."""
    found = parse_squeue(_run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", SQUEUE_FORMAT])) \
        if shutil.which("squeue") else []
    return found[0]["state"] if found else ""


def show_logs(key: str, task: str, follow: bool, lines: int, dirs: list[str], out=sys.stdout,
              poll: float = 1.0, slurm: dict[str, dict] | None = None) -> bool:
    """Print the task's last ``lines`` lines, and with ``follow`` what it writes next until the
    job ends. False when no job has that id or name. ``slurm``: what :func:`read_slurm` read."""
    slurm = read_slurm() if slurm is None else slurm
    job = find_job(key, dirs, slurm)
    if job is None:
        return False
    rank = rank_of(task, "", job.get("script"))
    done, pending, first, ended = 0, "", True, False
    while True:
        try:
            with open(job["out"], errors="replace") as fh:
                fh.seek(done)
                chunk = fh.read()
                done = fh.tell()
        except FileNotFoundError:   # a pending job's output does not exist yet
            chunk = ""
        complete, _, pending = (pending + chunk).rpartition("\n")
        if rank is None:
            rank = rank_of(task, complete, job.get("script"))
        picked = task_lines(complete, rank, task) if complete else []
        if first:
            picked, first = picked[-lines:], False
        if ended and pending:   # a last line without its newline
            picked += task_lines(pending, rank, task)
        for line in picked:
            print(line, file=out, flush=True)
        if not follow or ended:
            return True
        ended = _state(job["id"]) not in ACTIVE   # one more read after the end: what the job wrote last
        if not ended:
            time.sleep(poll)


# --------------------------------------------------------------------------- the backend

class SlurmBackend:
    """One Slurm job per tfps job: sbatch, squeue/scontrol, the shared filesystem, scancel.

    ``read`` reads what Slurm knows (:func:`read_slurm`); tests give it what squeue said."""

    name = "slurm"
    option = "--slurm"

    def __init__(self, dirs: list[str] | None = None, read=None):
        self.dirs = list(dirs or DEFAULT_DIRS)
        self.read = read or read_slurm

    @classmethod
    def from_args(cls, ns) -> SlurmBackend:
        return cls(getattr(ns, "dir", None))

    def dry_run(self, plan: Plan, launch: Launch) -> list[Start]:
        """Each task is one rank of the job's srun step: ps first, then the workers."""
        num_ps = sum(1 for t in plan.tasks if t.job == "ps")
        step = (sys.executable, "-m", "tfps.launch.slurm_step", "--ps", str(num_ps),
                "--workers", str(len(plan.tasks) - num_ps), "--rendezvous", "$RENDEZVOUS", "--", *launch.run_args)
        return [Start(t.name, f"rank {rank} of the srun step", step) for rank, t in enumerate(plan.tasks)]

    def submit(self, ns) -> int:
        """``tfps slurm``: write the script, and with --submit submit it."""
        return slurm_launch.main(ns)

    def jobs(self) -> tuple[str, bool]:
        return list_jobs(self.dirs, slurm=self.read())

    def _job(self, key: str, slurm: dict[str, dict]) -> dict:
        job = find_job(key, self.dirs, slurm)
        if job is None:
            raise ConfigError(f"no tfps job {key!r} in squeue or under {', '.join(self.dirs)}; `tfps jobs --slurm` "
                              "lists them (--dir DIR for a model_dir elsewhere)", "job")
        return job

    def status(self, job: str) -> int:
        return print_row(row_of(self._job(job, self.read())))

    def logs(self, job: str, task: str, follow: bool, lines: int) -> int:
        slurm = self.read()
        self._job(job, slurm)
        show_logs(job, task, follow, lines, self.dirs, slurm=slurm)
        return ExitCode.OK

    def stop(self, job: str) -> int:
        """``scancel --signal=TERM``: the tasks get SIGTERM, the chief saves and exports within the
        job's grace, the ps exit by themselves (a plain scancel would SIGKILL after KillWait)."""
        found = self._job(job, self.read())
        state = ((found.get("slurm") or {}).get("squeue") or {}).get("state", "")
        if state not in ACTIVE:
            print(f"job {job} (Slurm job {found['id']}) has ended ({row_of(found)['state']}); nothing to stop",
                  flush=True)
            return ExitCode.OK
        _run(["scancel", *(["--signal=TERM"] if state != "PENDING" else []), found["id"]])
        print(f"sent SIGTERM to Slurm job {found['id']}: its chief writes the final checkpoint and export; "
              f"`tfps jobs --slurm` shows it end", flush=True)
        return ExitCode.OK


BACKEND = SlurmBackend
