"""The loopback guard fails closed (issue 36 item 2): when the bind patch misses while
reporting success (as it would if gRPC's bind moved to another library), the check of the
kernel's socket table after the server starts refuses, in one line and exit code 2, and no
port stays open; for a ``tfps run`` task and for a classic script under
tfps.task.net.script_guard alike. The patched GOT page gets back its protection."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest
from integration_helpers import REPO, base_env

pytestmark = pytest.mark.integration

#: Runs argv[2:] (a command line of ``tfps``, or of the script guard) in a process whose
#: loopback patch "succeeds" without patching anything: the server binds the wildcard. The
#: "patch" prints the protection of the page of every GOT slot it would have patched: what
#: the loader left, since nothing in this process patches them.
MISSED = """
import runpy, sys
import tfps.task.net.loopback as loopback
def missed(address="127.0.0.1"):
    try:
        path, base = loopback._library_mapping()
        print("protection", [loopback.page_protection(base + o) for o in loopback._got_offsets(path, "bind")],
              flush=True)
    except Exception as e:
        print("protection unknown:", type(e).__name__, e, flush=True)
    return True
loopback.ensure_loopback_bind = missed
what, sys.argv = sys.argv[1], sys.argv[1:]
if what == "tfps":
    from tfps.cli import main
    sys.exit(main(sys.argv[1:]))
runpy.run_module(what, run_name="__main__", alter_sys=True)
"""

#: A classic ps: starts its server and serves, as a script run by ``tfps local --script`` does.
CLASSIC_PS = """
import argparse, time
import tensorflow as tf
p = argparse.ArgumentParser()
p.add_argument("--ps_hosts"); p.add_argument("--worker_hosts"); p.add_argument("--job_name")
p.add_argument("--task_index", type=int)
a = p.parse_args()
cluster = tf.train.ClusterSpec({"ps": a.ps_hosts.split(","), "worker": a.worker_hosts.split(",")})
server = tf.distribute.Server(cluster, job_name=a.job_name, task_index=a.task_index)
print("serving", flush=True)
time.sleep(120)
"""


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _listeners(port: int) -> list[str]:
    """Hex local addresses of every socket on this machine that listens on ``port``."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                found.append(f[1])
    return found


def _run_missed(*argv: str) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", MISSED, *argv], capture_output=True, text=True, timeout=300,
                         cwd=str(REPO), env=base_env(TF_CPP_MIN_LOG_LEVEL="3"))
    return out, time.monotonic() - t0


def _refusal(out: subprocess.CompletedProcess) -> str:
    lines = [line for line in out.stderr.splitlines() if line.startswith("tfps: error:")]
    assert len(lines) == 1, out.stderr[-3000:]
    return lines[0]


@pytest.fixture(scope="module")
def missed_task(tmp_path_factory):
    """A ``tfps run`` ps whose bind patch misses: (its output, its port)."""
    ps, worker = _free_ports(2)
    out, _ = _run_missed("tfps", "run", f"--ps_hosts=127.0.0.1:{ps}", f"--worker_hosts=127.0.0.1:{worker}",
                         "--job_name=ps", "--task_index=0", "--model_dir",
                         str(tmp_path_factory.mktemp("missed") / "model"))
    return out, ps


def test_a_task_whose_bind_patch_misses_refuses_and_leaves_no_port(missed_task):
    out, ps = missed_task
    assert out.returncode == 2, (out.returncode, out.stderr[-3000:])
    line = _refusal(out)
    assert "ps_hosts: ps0 listens on " in line and f"(every interface) port {ps} although its address " \
        f"127.0.0.1:{ps} is loopback" in line, line
    assert _listeners(ps) == []


def test_a_classic_script_whose_bind_patch_misses_is_ended_before_it_serves(tmp_path):
    script = tmp_path / "classic_ps.py"
    script.write_text(CLASSIC_PS)
    ps, worker = _free_ports(2)
    out, secs = _run_missed("tfps.task.net.script_guard", str(script), f"--ps_hosts=127.0.0.1:{ps}",
                            f"--worker_hosts=127.0.0.1:{worker}", "--job_name=ps", "--task_index=0")
    assert out.returncode == 2, (out.returncode, out.stderr[-3000:])
    assert "serving" not in out.stdout     # ended right after its server started, not 120 s later
    assert secs < 100, secs
    assert f"port {ps} although its address 127.0.0.1:{ps} is loopback" in _refusal(out)
    assert _listeners(ps) == []


def test_the_guarded_script_serves_on_loopback_and_the_got_page_keeps_its_protection(tmp_path, missed_task):
    """The same script without the miss: its server is on 127.0.0.1 only, and the page of
    every patched GOT slot has the protection it had before the patch."""
    script = tmp_path / "classic_ps.py"
    script.write_text(CLASSIC_PS.replace('print("serving", flush=True)', """
from tfps.task.net import loopback
from tfps.task.net.listening import addresses_on
path, base = loopback._library_mapping()
print("protection", [loopback.page_protection(base + o) for o in loopback._got_offsets(path, "bind")])
print("serving", addresses_on(int(a.ps_hosts.rsplit(":", 1)[1])), flush=True)
raise SystemExit(0)"""))
    ps, worker = _free_ports(2)
    # What the loader left (RELRO read-only, or writable under lazy binding): the pages as the
    # task whose patch missed saw them, where nothing was patched.
    before = [line.partition(" ")[2] for line in missed_task[0].stdout.splitlines() if line.startswith("protection ")]
    assert len(before) == 1 and before[0].startswith("["), missed_task[0].stdout
    out = subprocess.run([sys.executable, "-m", "tfps.task.net.script_guard", str(script), f"--ps_hosts=127.0.0.1:{ps}",
                          f"--worker_hosts=127.0.0.1:{worker}", "--job_name=ps", "--task_index=0"],
                         capture_output=True, text=True, timeout=300, cwd=str(REPO),
                         env=base_env(TF_CPP_MIN_LOG_LEVEL="3"))
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"protection {before[0]}" in out.stdout, (before, out.stdout)
    assert "serving ['127.0.0.1']" in out.stdout, out.stdout
