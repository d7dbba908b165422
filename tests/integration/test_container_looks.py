"""The role's tfps_containers module (deploy.yml's and stop.yml's waits) against this machine's
Docker engine: it sees a container exit within its half-second looks, says which are still
running when its wait runs out, names a container the engine lacks as null, reads the last
records of a history.jsonl, and says when the engine does not answer. Then the module as
Ansible runs it on a host (ansible -m), to the same answer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.fixtures.role_modules import ROLE, load_module

REPO = Path(__file__).resolve().parents[2]
containers = load_module("tfps_containers")
SOCKET = "/var/run/docker.sock"
IMAGE = os.environ.get("TFPS_TEST_IMAGE", "tfps:latest")


@pytest.fixture
def sleeper():
    """start(seconds) runs a container of the tfps image that sleeps that long, then exits 3."""
    names: list[str] = []

    def start(seconds: float) -> str:
        name = f"tfps-looks-{uuid.uuid4().hex[:8]}"
        subprocess.run(["docker", "run", "-d", "--name", name, "--entrypoint", "sh", IMAGE, "-c",
                        f"sleep {seconds}; exit 3"], check=True, capture_output=True, text=True, timeout=120)
        names.append(name)
        return name
    yield start
    for name in names:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=60)


def test_the_wait_ends_when_the_containers_exit_and_reports_who_still_runs(sleeper, tmp_path):
    short, long_ = sleeper(2), sleeper(300)
    missing = f"tfps-looks-none-{uuid.uuid4().hex[:8]}"
    # The long one holds the wait to its end; the short one has exited by then.
    t0 = time.monotonic()
    seen = containers.look(SOCKET, [short, long_, missing], wait=6)
    assert 5.5 <= time.monotonic() - t0 < 30
    assert seen[missing] is None
    assert seen[short]["State"]["Status"] == "exited" and seen[short]["State"]["ExitCode"] == 3
    assert containers.running(seen) == [long_]
    subprocess.run(["docker", "kill", long_], check=True, capture_output=True, timeout=60)
    # Nothing runs: one look, no wait, however long the wait may be.
    t0 = time.monotonic()
    assert containers.running(containers.look(SOCKET, [short, long_, missing], wait=600)) == []
    assert time.monotonic() - t0 < 10


def test_an_exit_is_seen_within_the_looks_not_at_the_end_of_the_wait(sleeper):
    name = sleeper(3)
    t0 = time.monotonic()
    seen = containers.look(SOCKET, [name], wait=120)
    assert seen[name]["State"]["Status"] == "exited"
    assert time.monotonic() - t0 < 60     # (3 s of sleep, a loaded machine's docker run)


def test_an_engine_that_does_not_answer_is_an_error_naming_its_socket(tmp_path):
    sock = str(tmp_path / "no-engine.sock")
    with pytest.raises(containers.EngineError, match=f"the Docker engine at {sock} does not answer"):
        containers.look(sock, ["tfps-x-ps0"], wait=1)


def test_the_last_two_whole_records_of_the_history(tmp_path):
    history = tmp_path / "history.jsonl"
    assert containers.last_records(str(history)) == []                    # not written yet
    history.write_text("".join(json.dumps({"step": s}) + "\n" for s in range(1, 2000)) + '{"step": 20')
    assert containers.last_records(str(history)) == [{"step": 1998}, {"step": 1999}]   # the line being written skipped
    history.write_text(json.dumps({"step": 1}) + "\n")
    assert containers.last_records(str(history)) == [{"step": 1}]


def test_the_module_as_ansible_runs_it(sleeper, tmp_path):
    name = sleeper(1)
    history = tmp_path / "history.jsonl"
    history.write_text(json.dumps({"step": 5, "loss": 0.5}) + "\n" + json.dumps({"step": 9, "loss": 0.4}) + "\n")
    # The role's library and module_utils, as a play of the role finds them.
    env = dict(os.environ, ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_MODULE_UTILS=str(ROLE / "module_utils"))
    args = json.dumps({"names": [name], "wait": 60, "history": str(history)})
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible"), "localhost", "-c", "local",
                           "-M", str(ROLE / "library"), "-m", "tfps_containers", "-a", args,
                           "-e", f"ansible_python_interpreter={sys.executable}"],
                          env=env, capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout.split("=>", 1)[1])          # localhost | SUCCESS => {...}
    assert result["changed"] is False and result["running"] == []
    assert result["containers"][name]["State"]["ExitCode"] == 3
    assert [r["step"] for r in result["records"]] == [5, 9]
