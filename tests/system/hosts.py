""""Bare-metal hosts" for system tests: containers that run sshd and their own Docker engine.

Each host is a container of ``tfps-host:bookworm-3`` on a user-defined Docker network, with
its own address, an sshd that accepts a key made for the test, and its own dockerd (Docker
in Docker, started as ENVIRONMENT.md says: all capabilities but SYS_RESOURCE, no seccomp
or AppArmor profile, the cgroup tree mounted, an anonymous volume on /var/lib/docker so
the inner engine gets overlay2). Ansible reaches them over SSH exactly as it reaches real
hosts; what runs inside them (``docker run --network host``) shares the host's address.

Checks on what the play did go through the outer engine: :meth:`Host.sh` runs a command
in the host container (``docker exec``), e.g. ``docker ps`` against the inner engine.
"""

from __future__ import annotations

import io
import shutil
import socket
import subprocess
import tarfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import docker
import yaml

HOST_IMAGE = "tfps-host:bookworm-3"
#: How long a new host may take until sshd and its inner dockerd answer.
START_TIMEOUT = 90


def ensure_ssh_client() -> None:
    """Ansible needs an OpenSSH client on the controller (this machine)."""
    if shutil.which("ssh") and shutil.which("ssh-keygen"):
        return
    subprocess.run(["apt-get", "install", "-y", "-q", "openssh-client"], check=True,
                   stdout=subprocess.DEVNULL)


def make_key(directory: Path) -> Path:
    """A new ed25519 key pair without passphrase; returns the private key's path."""
    ensure_ssh_client()
    key = directory / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "tfps-system-test", "-f", str(key)],
                   check=True)
    return key


@dataclass
class Host:
    name: str
    container: docker.models.containers.Container
    address: str

    def sh(self, command: str, check: bool = True) -> tuple[int, str]:
        """Run ``sh -c command`` in the host (as root); returns (exit code, output)."""
        code, out = self.container.exec_run(["sh", "-c", command])
        text = out.decode("utf-8", "replace")
        if check and code != 0:
            raise AssertionError(f"{self.name}: `{command}` exited with {code}:\n{text}")
        return code, text

    def put_file(self, path: str, content: bytes, mode: int = 0o600) -> None:
        directory, _, name = path.rpartition("/")
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(content), mode, int(time.time())
            tar.addfile(info, io.BytesIO(content))
        self.sh(f"mkdir -p {directory}")
        self.container.put_archive(directory, buf.getvalue())

    def containers(self, label: str = "tfps.job") -> list[str]:
        """Names of the inner engine's containers that carry ``label`` (any state)."""
        _, out = self.sh(f"docker ps -a --filter label={label} --format '{{{{.Names}}}}'")
        return sorted(line for line in out.split() if line)

    def reboot(self, timeout: float = 30) -> None:
        """Restart the host container: the host's reboot. It gets a new network namespace, so
        no live firewall rule survives it; its boot (host-init) restores the saved ones
        (netfilter-persistent) before it starts sshd and its engine, and the engine starts
        the containers whose restart policy says so. Returns once sshd and the engine answer."""
        self.container.restart(timeout=timeout)
        _wait_ready(self, time.monotonic() + START_TIMEOUT)

    def exists(self, path: str) -> bool:
        return self.sh(f"test -e '{path}'", check=False)[0] == 0


@dataclass
class HostCluster:
    """Several hosts on one network; ``close()`` removes them and the network."""

    client: docker.DockerClient
    network: docker.models.networks.Network
    hosts: list[Host]
    key: Path
    gateway: str
    prefix: str
    _closed: bool = field(default=False, repr=False)

    def __getitem__(self, name: str) -> Host:
        return next(h for h in self.hosts if h.name == name)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for host in self.hosts:
            try:
                host.container.remove(force=True, v=True)
            except docker.errors.APIError:
                pass
        try:
            self.network.remove()
        except docker.errors.APIError:
            pass

    def inventory(self, directory: Path, layout: dict, group_vars: dict | None = None,
                  host_vars: dict | None = None) -> Path:
        """Write an Ansible YAML inventory for these hosts.

        ``layout`` maps group names (ps, worker, or anything else) to host names, or to
        dicts host name -> extra inventory variables. Every host gets its address and
        the SSH settings of this cluster.
        """
        children = {}
        for group, members in layout.items():
            if not isinstance(members, dict):
                members = {m: {} for m in members}
            hosts = {}
            for name, extra in members.items():
                base = name.split("-")[0]  # "host1-ps" runs on host1
                hosts[name] = {"ansible_host": self[base].address, **(extra or {})}
            children[group] = {"hosts": hosts}
        data = {"all": {"vars": {
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(self.key),
            "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
                                       "-o ConnectTimeout=10 -o LogLevel=ERROR",
            "ansible_python_interpreter": "/usr/bin/python3",
        }, "children": children}}
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "hosts.yml").write_text(yaml.safe_dump(data, sort_keys=False))
        for kind, content in (("group_vars", group_vars), ("host_vars", host_vars)):
            for name, values in (content or {}).items():
                (directory / kind).mkdir(exist_ok=True)
                (directory / kind / f"{name}.yml").write_text(yaml.safe_dump(values, sort_keys=False))
        return directory


def _wait_ready(host: Host, deadline: float) -> None:
    last = ""
    while time.monotonic() < deadline:
        host.container.reload()
        if host.container.status != "running":
            raise RuntimeError(f"host {host.name} stopped: {host.container.logs(tail=30).decode()}")
        code, out = host.sh("docker info --format '{{.Driver}}'", check=False)
        if code == 0:
            try:
                with socket.create_connection((host.address, 22), timeout=2) as s:
                    if s.recv(4).startswith(b"SSH"):
                        return
            except OSError as exc:
                last = f"sshd: {exc}"
        else:
            last = f"dockerd: {out.strip()[-200:]}"
        time.sleep(0.5)
    raise RuntimeError(f"host {host.name} did not get ready in {START_TIMEOUT} s ({last})")


def start_hosts(names: list[str], workdir: Path, image: str = HOST_IMAGE) -> HostCluster:
    """Start one host container per name on a new network, reachable over SSH with a new key."""
    client = docker.from_env()
    prefix = f"tfps-st-{uuid.uuid4().hex[:6]}"
    key = make_key(workdir)
    public = (key.with_suffix(".pub")).read_bytes()
    network = client.networks.create(prefix, driver="bridge")
    cluster = HostCluster(client, network, [], key, "", prefix)
    try:
        for name in names:
            container = client.containers.run(
                image, name=f"{prefix}-{name}", hostname=name, network=network.name, detach=True,
                cap_add=["ALL"], cap_drop=["SYS_RESOURCE"],
                security_opt=["seccomp=unconfined", "apparmor=unconfined"],
                volumes={"/sys/fs/cgroup": {"bind": "/sys/fs/cgroup", "mode": "rw"}},
                # An anonymous volume: the inner dockerd gets overlay2 instead of vfs.
                tmpfs=None, labels={"tfps.system-test": prefix},
                **{"mounts": [docker.types.Mount("/var/lib/docker", None, type="volume")]},
            )
            container.reload()
            address = container.attrs["NetworkSettings"]["Networks"][network.name]["IPAddress"]
            cluster.hosts.append(Host(name, container, address))
        network.reload()
        cluster.gateway = network.attrs["IPAM"]["Config"][0]["Gateway"]
        deadline = time.monotonic() + START_TIMEOUT
        for host in cluster.hosts:
            host.put_file("/root/.ssh/authorized_keys", public, 0o600)
            host.sh("chmod 700 /root/.ssh")
        for host in cluster.hosts:
            _wait_ready(host, deadline)
    except BaseException:
        cluster.close()
        raise
    return cluster
