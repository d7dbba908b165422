"""The compose backend (``tfps compose``, ``--compose``): one container per task on this machine.

``tfps compose`` writes the docker-compose.yml (``tfps.launch.compose``), and ``docker compose
up`` runs it. The job's containers carry Compose's own labels: the project (the job's name,
``compose.project_name``) and the service (the task's name, ``ps0``, ``worker0``). A project
with a ``worker0`` service is a tfps job; ``tfps jobs/status/logs/stop --compose`` read the
containers of this machine's Docker engine through the ``docker`` command. The model_dir is
in the job's volume, so the table shows the containers' states, not the step and loss.
"""

from __future__ import annotations

import argparse
import datetime
import re
import shutil
import subprocess
import time

from tfps import logs, timeouts
from tfps.backends.protocol import Start, age, print_row, render
from tfps.cluster import Launch, Plan
from tfps.errors import ConfigError
from tfps.exitcodes import ExitCode
from tfps.launch import compose as compose_file

PROJECT = "com.docker.compose.project"
SERVICE = "com.docker.compose.service"
#: What ``docker ps`` prints per container: project, service, name, state, status, created.
PS_FORMAT = "\t".join(["{{.Label \"%s\"}}" % PROJECT, "{{.Label \"%s\"}}" % SERVICE, "{{.Names}}", "{{.State}}",
                       "{{.Status}}", "{{.CreatedAt}}"])


def _docker(argv: list[str], timeout: float | None = 60) -> str:
    if not shutil.which("docker"):
        raise ConfigError("docker is not on the PATH: run tfps jobs/logs/status/stop --compose where the job's "
                          "Docker engine is", "compose")
    try:
        proc = subprocess.run(["docker", *argv], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as e:
        raise ConfigError(f"docker {argv[0]} did not answer: {e}", "compose") from None
    if proc.returncode != 0:
        reason = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        raise ConfigError(f"docker {argv[0]} failed: {reason}", "compose")
    return proc.stdout


def parse_ps(text: str) -> list[dict]:
    """``docker ps -a --format PS_FORMAT``: one dict per container of a compose project."""
    out = []
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) == 6 and parts[0] and parts[1]:
            out.append(dict(zip(("project", "service", "name", "state", "status", "created"), parts)))
    return out


def read_containers() -> list[dict]:
    """Every compose container of this machine's Docker engine, running or not."""
    return parse_ps(_docker(["ps", "-a", "--filter", f"label={PROJECT}", "--format", PS_FORMAT]))


def _created(text: str) -> float | None:
    """docker's CreatedAt (``2026-12-07 21:30:05 +0000 UTC``) as a timestamp."""
    try:
        return datetime.datetime.strptime(" ".join(text.split()[:3]), "%Y-%m-%d %H:%M:%S %z").timestamp()
    except ValueError:
        return None


def job_containers(containers: list[dict]) -> dict[str, list[dict]]:
    """The containers of each tfps job (a project with a ``worker0`` service), by project."""
    jobs = {c["project"] for c in containers if c["service"] == "worker0"}
    return {p: sorted((c for c in containers if c["project"] == p), key=lambda c: c["service"]) for p in sorted(jobs)}


def row_of(job: str, containers: list[dict], now: float | None = None) -> dict:
    now = time.time() if now is None else now
    chief = next(c for c in containers if c["service"] == "worker0")
    created = _created(chief["created"])
    ended = re.match(r"Exited \((\d+)\)", chief["status"])
    state = f"exited ({ended.group(1)})" if chief["state"] == "exited" and ended else chief["state"]
    return {"job": job, "state": state, "step": "-", "loss": "-", "examples/s": "-",
            "started": age(now - created) if created else "-", "ETA": "-",
            "hosts": "this machine (" + ",".join(c["service"] for c in containers) + ")"}


class ComposeBackend:
    """Containers on this machine's Docker engine, one compose project per job.

    ``read`` lists the containers (:func:`read_containers`); tests give it what docker ps said."""

    name = "compose"
    option = "--compose"

    def __init__(self, read=None):
        self.read = read or read_containers

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> ComposeBackend:
        return cls()

    def dry_run(self, plan: Plan, launch: Launch) -> list[Start]:
        """Each task is a service of the file, named as the task, in its own network namespace."""
        services = compose_file.compose_plan(plan)
        return [Start(t.name, f"service {t.name}, {t.target}", ("tfps", *launch.argv(services.task_ref(t))))
                for t in services.tasks]

    def submit(self, ns: argparse.Namespace) -> int:
        """``tfps compose``: write the file; ``docker compose up`` (the command it prints) runs it."""
        return ExitCode(compose_file.main(ns))

    def jobs(self) -> tuple[str, bool]:
        rows = [row_of(job, cs) for job, cs in job_containers(self.read()).items()]
        return render(rows, {}, empty="no tfps compose job on this machine's Docker engine"), True

    def _containers(self, job: str) -> list[dict]:
        found = job_containers(self.read()).get(compose_file.project_name(argparse.Namespace(name=job)))
        if not found:
            raise ConfigError(f"no tfps job {job!r} on this machine's Docker engine; `tfps jobs --compose` lists them "
                              "(a compose job is named by its project, the job's name)", "job")
        return found

    def status(self, job: str) -> int:
        return print_row(row_of(job, self._containers(job)))

    def logs(self, job: str, task: str, follow: bool, lines: int) -> int:
        containers = self._containers(job)
        mine = next((c for c in containers if c["service"] == task), None)
        if mine is None:
            raise ConfigError(f"job {job!r} has no task {task}; it has {', '.join(c['service'] for c in containers)}",
                              "task")
        argv = ["docker", "logs", "--tail", str(lines), *(["--follow"] if follow else []), mine["name"]]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
        assert proc.stdout is not None
        for line in proc.stdout:
            if not logs.is_tf_noise(line.rstrip("\n")):
                print(f"[{task}] {line.rstrip(chr(10))}", flush=True)
        return ExitCode.OK if proc.wait() == 0 else ExitCode.TRAINING_FAILED

    def stop(self, job: str, poll: float = 1.0) -> int:
        """The chief first (its stop timeout, compose's stop_grace_period, covers the final save); the
        others then end by themselves, as after a chief that finished; what still runs after
        ``timeouts.SETTLE_SECS`` is stopped (as the Ansible role's stop and ``tfps local`` do)."""
        containers = self._containers(job)
        running = [c for c in containers if c["state"] == "running"]
        if not running:
            print(f"job {job} is not running; nothing to stop", flush=True)
            return ExitCode.OK
        chief = [c["name"] for c in running if c["service"] == "worker0"]
        if chief:
            _docker(["stop", *chief], timeout=None)
        deadline = time.monotonic() + timeouts.SETTLE_SECS
        rest = [c["name"] for c in self._containers(job) if c["state"] == "running"]
        while rest and time.monotonic() < deadline:
            time.sleep(poll)
            rest = [c["name"] for c in self._containers(job) if c["state"] == "running"]
        if rest:
            _docker(["stop", *rest], timeout=None)
        print(f"stopped job {job}: the chief first ({', '.join(chief) or 'already ended'})"
              + (f", then {', '.join(rest)}, which had not ended by themselves" if rest else
                 ", then the other tasks ended by themselves"), flush=True)
        return ExitCode.OK


BACKEND = ComposeBackend
