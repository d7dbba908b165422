"""Fixtures for the Ansible system tests (imported by tests/system/conftest.py).

Created once per test session and shared: three bare-metal hosts (see hosts.py), the
tfps image as a ``docker save`` archive on the controller, the pinned collections.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_DIR = REPO / "ansible"
HOST_NAMES = ["host1", "host2", "host3"]


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kwargs)


@pytest.fixture(scope="session")
def docker_engine(docker_client, tfps_image):
    """The outer Docker engine with the tfps image of this checkout and the host image.

    ``docker_client`` and ``tfps_image`` are the system tests' shared fixtures
    (tests/system/conftest.py); the host image comes from .ci/base-images.sh.
    """
    _run(["bash", str(REPO / ".ci/base-images.sh")])
    return docker_client


@pytest.fixture(scope="session")
def ansible_collections():
    """community.docker at the pinned version, in ansible/collections."""
    env = dict(os.environ, PYTHON=sys.executable)
    _run(["bash", str(REPO / ".ci/ansible-collections.sh")], env=env)
    return ANSIBLE_DIR / "collections"


@pytest.fixture(scope="session")
def image_archive(docker_engine, tfps_image, tmp_path_factory) -> Path:
    """`docker save` of the tfps image: what an air-gapped site copies to its hosts."""
    path = tmp_path_factory.mktemp("image") / "tfps.tar"
    _run(["docker", "save", tfps_image, "-o", str(path)])
    return path


@pytest.fixture(scope="session")
def bare_metal(docker_engine, tmp_path_factory):
    """Three hosts with sshd and their own dockerd, reachable over SSH with a test key."""
    from hosts import start_hosts
    cluster = start_hosts(HOST_NAMES, tmp_path_factory.mktemp("ssh"))
    yield cluster
    cluster.close()


@pytest.fixture(autouse=True)
def forget_port_reservations(request):
    """A test removes its containers with docker rm, not cleanup.yml, so the ports its jobs
    held stay reserved (for tfps_ports's ttl): forget them after each test on the hosts, as
    cleanup.yml would, so that every test starts from free hosts."""
    yield
    if "bare_metal" in request.fixturenames:
        for host in request.getfixturevalue("bare_metal").hosts:
            host.sh("rm -f /var/lib/tfps/ports.json", check=False)


@pytest.fixture(scope="session")
def network_smtp_server(bare_metal):
    """A real SMTP server the hosts can reach: on the hosts' network gateway (this machine)."""
    from servers import SMTPServer

    with SMTPServer(hostname=bare_metal.gateway) as server:
        yield server


@dataclass
class PlayResult:
    returncode: int
    output: str
    seconds: float
    log: Path



@pytest.fixture(scope="session")
def run_playbook(ansible_collections, tmp_path_factory):
    """Run one of ansible/*.yml against an inventory like a user does; returns PlayResult."""
    logs = tmp_path_factory.mktemp("ansible-logs")
    counter = iter(range(1000))

    def run(playbook: str, inventory: Path, extra_vars: dict | None = None, timeout: float = 600,
            args: list[str] | tuple[str, ...] = ()) -> PlayResult:
        env = dict(os.environ)
        # As docs/ansible.md says: from ansible/, where Ansible reads ansible/ansible.cfg.
        env.pop("ANSIBLE_CONFIG", None)
        env.update({
            "ANSIBLE_HOST_KEY_CHECKING": "False",
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_FORCE_COLOR": "0",
            "ANSIBLE_RETRY_FILES_ENABLED": "0",
            "ANSIBLE_LOCAL_TEMP": str(logs / "tmp"),
        })
        cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), playbook]
        cmd += list(args)
        if extra_vars:
            vars_file = logs / f"extra-{next(counter)}.json"
            vars_file.write_text(json.dumps(extra_vars))
            cmd += ["-e", f"@{vars_file}"]
        log = logs / f"{next(counter):03d}-{playbook.replace('/', '_')}.log"
        start = time.monotonic()
        lines = []
        # The log gets each line with the seconds since the start: where the time goes.
        # The play runs in a session of its own: a timer kills its whole group at `timeout`
        # (even when it prints nothing), and so does any exception here (pytest-timeout's
        # included), so a stuck play never outlives its test.
        proc = subprocess.Popen(cmd, env=env, cwd=ANSIBLE_DIR, text=True, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)

        def kill() -> None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        timer = threading.Timer(timeout, kill)
        timer.start()
        try:
            with open(log, "w") as fh:
                fh.write(" ".join(cmd) + "\n\n")
                for line in proc.stdout:
                    lines.append(line)
                    fh.write(f"{time.monotonic() - start:7.1f} {line}")
            returncode = proc.wait()
        finally:
            timer.cancel()
            if proc.poll() is None:
                kill()
                proc.wait()
            proc.stdout.close()
        seconds = time.monotonic() - start
        return PlayResult(returncode, "".join(lines), seconds, log)

    return run
