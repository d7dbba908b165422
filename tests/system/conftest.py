"""Fixtures shared by the system tests: the Docker engine, the tfps image, compose jobs,
and the Ansible harness.

The engine (with Compose and Buildx) is started by ``.ci/docker-up.sh`` and the tfps
image is built once per test session by ``.ci/build-image.sh`` (an unchanged tree rebuilds
from the cache in seconds), so every system test runs the code of this checkout.

The Ansible tests share, once per session: three bare-metal hosts (see hosts.py), the tfps
image as a ``docker save`` archive on the controller, the pinned collections, an SMTP
server the hosts reach and a runner of the playbooks.
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
from composejob import ComposeJob
from plays import ANSIBLE_DIR
from servers import SMTPServer

REPO = Path(__file__).resolve().parents[2]
HOST_NAMES = ["host1", "host2", "host3"]
TFPS_IMAGE = os.environ.get("TFPS_TEST_IMAGE", "tfps:latest")


def _script(name: str, *args: str) -> None:
    proc = subprocess.run(["bash", str(REPO / ".ci" / name), *args], text=True, capture_output=True)
    if proc.returncode != 0:
        pytest.fail(f".ci/{name} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


@pytest.fixture(scope="session")
def docker_client():
    """A docker SDK client for a running engine (started if needed)."""
    import docker  # a dev dependency: a missing SDK is an error, not a skip

    _script("docker-up.sh")
    client = docker.from_env(timeout=300)
    yield client
    client.close()


@pytest.fixture(scope="session")
def compose_cli(docker_client) -> None:
    """Compose v2, which .ci/docker-up.sh (run by docker_client) installs where it is missing."""
    proc = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True)
    assert proc.returncode == 0, f"docker compose does not work after .ci/docker-up.sh:\n{proc.stderr}"


@pytest.fixture(scope="session")
def tfps_image(docker_client) -> str:
    """The tfps image built from this checkout, once per session; returns its tag."""
    _script("build-image.sh", TFPS_IMAGE)
    return TFPS_IMAGE


def docker_bridge_gateway(client) -> str:
    """Address of this machine on Docker's default bridge (what ``host-gateway`` resolves to).

    The bridge's IPAM gateway where the engine lists one; Debian 12's docker.io lists only
    the subnet, so otherwise the IPv4 address of the bridge's interface (docker0), read
    from the kernel. Never a skip: an engine that runs has that address.
    """
    attrs = client.networks.get("bridge").attrs
    for entry in (attrs.get("IPAM") or {}).get("Config") or []:
        if entry.get("Gateway") and ":" not in entry["Gateway"]:
            return entry["Gateway"]
    interface = (attrs.get("Options") or {}).get("com.docker.network.bridge.name", "docker0")
    try:
        return interface_ipv4(interface)
    except OSError as e:
        pytest.fail(f"Docker's default bridge lists no IPv4 gateway and its interface {interface} has no "
                    f"IPv4 address ({e}): is the engine running with its default bridge?")


def interface_ipv4(interface: str) -> str:
    """The IPv4 address of a network interface of this machine (ioctl SIOCGIFADDR)."""
    import fcntl
    import socket
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", interface.encode()[:15]))  # SIOCGIFADDR
    return socket.inet_ntoa(packed[20:24])


class ContainerSMTPServer(SMTPServer):
    """The test SMTP server, listening where containers reach this machine.

    It binds the default bridge's gateway address (not 0.0.0.0), which containers on any
    compose network reach as ``host.docker.internal`` through
    ``extra_hosts: host.docker.internal:host-gateway``; ``url()`` names that host.
    """

    container_host = "host.docker.internal"

    def __init__(self, address: str, **kwargs):
        super().__init__(hostname=address, url_host=self.container_host, **kwargs)


@pytest.fixture
def container_smtp_server(docker_client):
    """A real SMTP server that the tfps containers can send to (see ContainerSMTPServer)."""
    with ContainerSMTPServer(docker_bridge_gateway(docker_client)) as server:
        yield server


@pytest.fixture
def compose_job(docker_client, compose_cli, tfps_image, tmp_path):
    """Makes ComposeJobs (composejob.py); each is taken down after the test, leaving no container."""
    jobs: list[ComposeJob] = []

    def make(directory: Path, file: str = "docker-compose.yml") -> ComposeJob:
        job = ComposeJob(docker_client, directory, file)
        jobs.append(job)
        return job

    yield make
    for job in jobs:
        job.down()
        assert job.containers() == [], f"{job.project}: containers left after down"


# ------------------------------------------------------------------ the Ansible harness
def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kwargs)


@pytest.fixture(scope="session")
def docker_engine(docker_client, tfps_image):
    """The outer Docker engine with the tfps image of this checkout and the host image.

    The host image comes from .ci/base-images.sh.
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
def paced_model_dir(tmp_path_factory) -> Path:
    """A user's model directory holding only tests/fixtures/paced_model.py: the demo MLP whose
    training steps sleep TFPS_TEST_STEP_SECS each where the task's environment sets it. For a
    job that only has to be running (a re-deploy, a stop, a probe of its ports) without
    taking the machine's cores from the plays that look at it. (tests/fixtures whole would
    be dozens of files for the role to copy to every host.)"""
    directory = tmp_path_factory.mktemp("pacedmodel")
    (directory / "paced_model.py").write_text((REPO / "tests/fixtures/paced_model.py").read_text())
    return directory


@pytest.fixture(scope="session")
def finished_job(bare_metal, image_archive, run_playbook, tmp_path_factory):
    """One job deployed by deploy.yml -vvv and trained to its end (plays.deploy_finished_job),
    shared by the tests that only read what it left: its containers stay until the session ends."""
    from plays import PASSWORD, SMTP_USER, deploy_finished_job

    with SMTPServer(hostname=bare_metal.gateway, auth=(SMTP_USER, PASSWORD)) as smtp:
        job = deploy_finished_job(bare_metal, image_archive, run_playbook, tmp_path_factory.mktemp("airgap"), smtp)
    yield job
    for host in bare_metal.hosts:
        for name in host.containers(f"tfps.job={job.job}"):
            host.sh(f"docker rm -f {name}", check=False)


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
            args: list[str] | tuple[str, ...] = (), command: list[str] | None = None) -> PlayResult:
        """``command``: run ``tfps COMMAND...`` (a tutorial's line, e.g. ``deploy -i INV --check``)
        instead of ansible-playbook (``playbook`` then only names the log)."""
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
        if command:
            cmd = [sys.executable, "-m", "tfps", *command]
        else:
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
