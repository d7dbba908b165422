"""Faults sent to a job's containers on the test hosts (hosts.py), for tests/chaos.py's
injector: a crash of a container (SIGKILL of its PID 1, from the host: it exits 137 and
Docker's restart policy starts it again, as after the OOM killer) or ``docker pause`` of it
for a few seconds. Used by test_ansible.py's fault test."""

from __future__ import annotations

import time
from dataclasses import dataclass

import chaos


@dataclass
class Target:
    """A running container of the job on its host, and its PID 1 as the host sees it."""

    host: object
    container: str
    pid: int


def inspect(host, container: str, fmt: str) -> str | None:
    code, out = host.sh(f"docker inspect {container} --format '{fmt}'", check=False)
    return out.strip() if code == 0 else None


def find(host, container: str) -> Target | None:
    """The container when it runs and is not paused, else None (the injector looks again)."""
    out = inspect(host, container, "{{.State.Status}} {{.State.Pid}}")
    if not out or out.split()[0] != "running" or out.split()[1] == "0":
        return None
    return Target(host, container, int(out.split()[1]))


def send(target: Target, kind: str) -> None:
    """A kill: SIGKILL of the container's PID 1. A pause: ``docker pause``, tried again when
    the cgroup freezer could not freeze every process at once (``unable to freeze``)."""
    if kind == chaos.KILL:
        code, out = target.host.sh(f"kill -KILL {target.pid}", check=False)
        if code != 0:   # it died between the look and the signal: the injector looks again
            raise ProcessLookupError(out)
        return
    for attempt in range(4):
        code, out = target.host.sh(f"docker pause {target.container}", check=False)
        if code == 0:
            return
        if "is not running" in out:
            raise ProcessLookupError(out)
        if "unable to freeze" not in out or attempt == 3:
            raise AssertionError(f"docker pause {target.container}: {out}")
        time.sleep(0.5)


def resume(target: Target) -> None:
    target.host.sh(f"docker unpause {target.container}")


def restart_count(host, container: str) -> int | None:
    out = inspect(host, container, "{{.RestartCount}}")
    return int(out) if out else None
