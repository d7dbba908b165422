"""A real Slurm cluster in three containers, for tests/system/test_slurm.py.

Debian 12's slurm-wlm (slurmctld, slurmd) and munge from ``tests/system/slurm/Dockerfile``
(built once, cached by the Dockerfile's hash), three containers on a user-defined network,
started with ``--init``, without ``--privileged``: node 1 runs slurmctld and slurmd, nodes 2
and 3 slurmd. Every node mounts one named volume on ``/shared`` (the shared filesystem), and
this checkout's venv and the interpreter it was made from read-only at the same paths: tfps
itself is installed from the project's wheel (tests/wheelbuild.py, built once per version of
the sources) into a venv on the shared volume, ``/shared/venv`` (TensorFlow and the rest
reached through a .pth file to the mounted venv), as a lab installs it. ``tfps slurm`` run
with its python on node 1 writes a script whose ``python`` every node has; the checkout is
not mounted, and the models the tests import come from ``/shared/code`` (a copy of
tests/fixtures). The
settings that make Slurm work without cgroups are ENVIRONMENT.md's: proctrack/linuxproc,
task/none, no accounting (``scontrol show job`` is the record, kept for MinJobAge).
Jobs run as the unprivileged user ``lab``. :meth:`SlurmCluster.close` removes the
containers, the network and the volume.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import wheelbuild

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE_DIR = Path(__file__).resolve().parent / "slurm"
#: How long the daemons may take until sinfo shows every node idle.
START_TIMEOUT = 90
#: The user that submits the jobs (created in the image).
USER = "lab"


def _docker(*args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args[:3])} ... failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return proc


def image() -> str:
    """The Slurm node image, built when this Dockerfile's version is not there yet."""
    digest = hashlib.sha256((DOCKERFILE_DIR / "Dockerfile").read_bytes()).hexdigest()[:12]
    tag = f"tfps-slurm:{digest}"
    if _docker("image", "inspect", tag, check=False).returncode != 0:
        _docker("build", "-q", "-t", tag, str(DOCKERFILE_DIR), timeout=900)
    return tag


def _mounts(wheel_dir: Path) -> list[str]:
    """The venv, its interpreter's installation and the wheel, read-only at the same paths."""
    base = Path(os.path.realpath(sys.executable)).parents[1]   # e.g. /root/.pyenv/versions/3.11.7 or /usr
    paths = [Path(sys.prefix), wheel_dir]
    if base != Path("/usr"):
        paths.append(base)
    args: list[str] = []
    for path in paths:
        args += ["-v", f"{path}:{path}:ro"]
    return args


class SlurmCluster:
    """Three Slurm nodes; node names ``<prefix>-1..3`` (a hostlist ``<prefix>-[1-3]``)."""

    #: The venv on the shared volume that tfps's wheel is installed into, and its python.
    VENV = Path("/shared/venv")
    python = str(VENV / "bin" / "python")
    #: PYTHONPATH for the test models (tests.fixtures.paced_model, ...): a copy on the shared volume.
    code = "/shared/code"

    def __init__(self) -> None:
        self.prefix = f"tfpsl{os.getpid() % 100000}{secrets.token_hex(2)}"
        self.names = [f"{self.prefix}-{i}" for i in (1, 2, 3)]
        self.network = f"{self.prefix}-net"
        self.volume = f"{self.prefix}-shared"
        self.conf_dir = Path(tempfile.mkdtemp(prefix="tfps-slurm-conf-"))
        self.started: list[str] = []

    # ------------------------------------------------------------------ start and stop
    def start(self) -> SlurmCluster:
        tag = image()
        wheel = wheelbuild.wheel()
        (self.conf_dir / "munge.key").write_bytes(secrets.token_bytes(1024))
        os.chmod(self.conf_dir, 0o755)
        _docker("network", "create", self.network)
        _docker("volume", "create", self.volume)
        for name in self.names:
            _docker("run", "-d", "--init", "--name", name, "--hostname", name, "--network", self.network,
                    "-v", f"{self.volume}:/shared", "-v", f"{self.conf_dir}:/etc/slurm-test:ro",
                    *_mounts(wheel.path.parent),
                    tag, "sleep", "infinity")
            self.started.append(name)
        # Each node's CPU and memory line as slurmd itself reads the machine.
        hw = self.sh(self.names[0], "slurmd -C | head -1").strip()
        node_line = re.sub(r"^NodeName=\S+\s*", "", hw)
        (self.conf_dir / "slurm.conf").write_text(self._conf(node_line))
        self.sh(self.names[0], f"install -d -o {USER} -g {USER} /shared/jobs /shared/venv {self.code}/tests")
        # tfps from the wheel, installed by the lab user as a lab would, on the shared volume.
        wheelbuild.venv(self.VENV, runner=lambda argv: self.sh(self.names[0], shlex.join(argv), user=USER))
        _docker("cp", str(REPO / "tests" / "fixtures"), f"{self.names[0]}:{self.code}/tests/")
        for name in self.names:
            self.sh(name, "ln -sf /etc/slurm-test/slurm.conf /etc/slurm/slurm.conf && "
                          "install -o munge -g munge -m 0400 /etc/slurm-test/munge.key /etc/munge/munge.key && "
                          "install -d -o munge -g munge /run/munge && runuser -u munge -- /usr/sbin/munged")
        self.sh(self.names[0], "slurmctld")
        for name in self.names:
            self.sh(name, "slurmd")
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            out = self.sh(self.names[0], "sinfo -h -N -o '%N %t'", check=False)
            if sum(line.split()[-1] == "idle" for line in out.splitlines() if line.strip()) == 3:
                return self
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Slurm nodes are not idle after {START_TIMEOUT} s:\n{out}\n"
                                   + self.sh(self.names[0], "tail -20 /var/log/slurm/slurmctld.log", check=False))
            time.sleep(0.5)

    def _conf(self, node_line: str) -> str:
        return "\n".join([
            "ClusterName=tfpstest",
            f"SlurmctldHost={self.names[0]}",
            "SlurmUser=slurm",
            "AuthType=auth/munge",
            "StateSaveLocation=/var/spool/slurmctld",
            "SlurmdSpoolDir=/var/spool/slurmd",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "MpiDefault=none",
            "ReturnToService=2",
            # Slurm's default is 30 s: room for a final save on a quiet node, not always on a
            # 2-core machine running other test suites beside this cluster (at a load of 40 a
            # chief wrote results.json 46 s after the scancel, and the job was CANCELLED before its
            # message came).
            # Only a bound: the tasks end by themselves after the final save. A site whose saves
            # take longer raises it, or stops with scancel --signal=TERM (docs/slurm.md).
            "KillWait=150",
            "MinJobAge=3600",
            "SlurmctldLogFile=/var/log/slurm/slurmctld.log",
            "SlurmdLogFile=/var/log/slurm/slurmd.log",
            f"NodeName={self.prefix}-[1-3] {node_line} State=UNKNOWN",
            "PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
            "",
        ])

    def close(self) -> None:
        for name in self.started:
            _docker("rm", "-f", "-v", name, check=False)
        _docker("network", "rm", self.network, check=False)
        _docker("volume", "rm", "-f", self.volume, check=False)
        for f in self.conf_dir.iterdir():
            f.unlink()
        self.conf_dir.rmdir()

    # ------------------------------------------------------------------ use
    def sh(self, node: str, command: str, user: str = "root", check: bool = True,
           timeout: float = 300) -> str:
        proc = _docker("exec", "-u", user, "-w", "/shared/jobs" if user == USER else "/", node,
                       "bash", "-c", command, check=False, timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{node}: {command!r} exited {proc.returncode}:\n{proc.stdout[-3000:]}"
                               f"\n{proc.stderr[-3000:]}")
        return proc.stdout + proc.stderr

    def run(self, command: str) -> subprocess.CompletedProcess:
        """``command`` as the lab user on the login node (node 1), in /shared/jobs."""
        return _docker("exec", "-u", USER, "-w", "/shared/jobs", self.names[0], "bash", "-c", command,
                       check=False)

    def tfps(self, args: str) -> subprocess.CompletedProcess:
        """``tfps ARGS`` of the wheel's venv, as the lab user on the login node."""
        return self.run(f"{self.python} -m tfps {args}")

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` as key=value pairs (JobState, ExitCode, EndTime, ...)."""
        out = self.sh(self.names[0], f"scontrol show job -o {job_id}", check=False)
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def wait_state(self, job_id: str, states: set[str], timeout: float) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while True:
            info = self.job(job_id)
            if info.get("JobState") in states:
                return info
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} is {info.get('JobState')} after {timeout} s, not one of "
                                     f"{sorted(states)}")
            time.sleep(0.5)

    def read(self, path: str) -> str:
        return self.sh(self.names[0], f"cat {shlex.quote(path)}", check=False)

    def exists(self, path: str) -> bool:
        return _docker("exec", self.names[0], "test", "-e", path, check=False).returncode == 0
