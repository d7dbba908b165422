"""Session fixtures shared by the system tests: the Docker engine and the tfps image.

The engine (with Compose and Buildx) is started by ``.ci/docker-up.sh`` and the tfps
image is built once per test session by ``.ci/build-image.sh`` (an unchanged tree rebuilds
from the cache in seconds), so every system test runs the code of this checkout.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest_ansible import *  # noqa: F401,F403 - fixtures of the Ansible system tests
from servers import SMTPServer

REPO = Path(__file__).resolve().parents[2]
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
