"""Session fixtures shared by the system tests: the Docker engine and the trainer image.

The engine (with Compose and Buildx) is started by ``.ci/docker-up.sh`` and the trainer
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
TRAINER_IMAGE = os.environ.get("TFPS_TEST_IMAGE", "tfps-trainer:latest")


def _script(name: str, *args: str) -> None:
    proc = subprocess.run(["bash", str(REPO / ".ci" / name), *args], text=True, capture_output=True)
    if proc.returncode != 0:
        pytest.fail(f".ci/{name} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


@pytest.fixture(scope="session")
def docker_client():
    """A docker SDK client for a running engine (started if needed)."""
    docker = pytest.importorskip("docker")
    _script("docker-up.sh")
    client = docker.from_env(timeout=300)
    yield client
    client.close()


@pytest.fixture(scope="session")
def trainer_image(docker_client) -> str:
    """The trainer image built from this checkout, once per session; returns its tag."""
    _script("build-image.sh", TRAINER_IMAGE)
    return TRAINER_IMAGE


def docker_bridge_gateway(client) -> str:
    """Address of this machine on Docker's default bridge (what ``host-gateway`` resolves to)."""
    config = client.networks.get("bridge").attrs["IPAM"]["Config"]
    for entry in config:
        if entry.get("Gateway") and ":" not in entry["Gateway"]:
            return entry["Gateway"]
    pytest.skip("Docker's default bridge has no IPv4 gateway")


class ContainerSMTPServer(SMTPServer):
    """The test SMTP server, listening where containers reach this machine.

    It binds the default bridge's gateway address (not 0.0.0.0), which containers on any
    compose network reach as ``host.docker.internal`` through
    ``extra_hosts: host.docker.internal:host-gateway``.
    """

    container_host = "host.docker.internal"

    def __init__(self, address: str, **kwargs):
        super().__init__(**kwargs)
        from aiosmtpd.controller import Controller

        self.address = address
        handler_kwargs = {}
        if self.auth is not None:
            handler_kwargs = dict(authenticator=self._authenticate, auth_require_tls=False)
        self._controller = Controller(self, hostname=address, port=self.port, **handler_kwargs)

    def url(self, scheme: str = "mailto", userinfo: str = "", **params: str) -> str:
        """An apprise URL for this server as seen from inside a container."""
        query = {"from": self.sender, "to": self.recipient, "mode": "insecure", **params}
        at = f"{userinfo}@" if userinfo else ""
        return f"{scheme}://{at}{self.container_host}:{self.port}?" + "&".join(f"{k}={v}" for k, v in query.items())


@pytest.fixture
def container_smtp_server(docker_client):
    """A real SMTP server that the trainer containers can send to (see ContainerSMTPServer)."""
    with ContainerSMTPServer(docker_bridge_gateway(docker_client)) as server:
        yield server
