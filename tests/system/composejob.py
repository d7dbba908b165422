"""One compose project driven through the compose CLI and the docker SDK (tests/system).

Used by the compose tests (test_compose*.py, test_security.py) through the ``compose_job``
fixture of conftest.py, or directly.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import tarfile
import time
import uuid
from pathlib import Path

import docblocks
import faults
import pytest

CHIEF = "worker0"
MODEL_DIR = "/data/model"
#: What the generated files and docs/how-to/compose.md say to run (``-p`` is added per test):
#: the page's ``docker compose up`` line, read from it.
(UP,) = [argv[2:] for argv in docblocks.commands("how-to/compose.md", "tests/system/composejob.py")
         if argv[:3] == ["docker", "compose", "up"]]
assert UP == ["up", "--exit-code-from", CHIEF, "--attach", CHIEF], UP   # what the generated files' headers say


class ComposeJob:
    """One compose project in its own directory, driven through the compose CLI and the SDK."""

    def __init__(self, client, directory: Path, file: str = "docker-compose.yml"):
        self.client = client
        self.directory = directory
        self.file = file
        self.project = f"tfpst{uuid.uuid4().hex[:10]}"
        self.log = directory / "compose-up.log"
        self._up: subprocess.Popen | None = None
        self._log_fh = None

    # -- compose CLI -------------------------------------------------------------------
    def argv(self, *args: str) -> list[str]:
        return ["docker", "compose", "-p", self.project, "-f", self.file, *args]

    def compose(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run(self.argv(*args), cwd=self.directory, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"docker compose {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        return proc

    def start(self) -> None:
        """``docker compose up --exit-code-from worker0 --attach worker0`` in the background."""
        self._log_fh = open(self.log, "w")
        self._up = subprocess.Popen(self.argv(*UP), cwd=self.directory, stdout=self._log_fh,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def wait(self, timeout: float) -> int:
        """Exit status of ``up``: the chief's exit status."""
        assert self._up is not None
        try:
            return self._up.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"docker compose up did not end within {timeout} s; end of its output:\n{self.tail()}")
        finally:
            if self._up.poll() is not None and self._log_fh:
                self._log_fh.close()

    def run(self, timeout: float) -> int:
        self.start()
        return self.wait(timeout)

    def tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def ps(self, all_: bool = True) -> dict[str, dict]:
        """Service -> compose's JSON record of its container (State, ExitCode, ...)."""
        out = self.compose("ps", *(["--all"] if all_ else []), "--format", "json").stdout.strip()
        if not out:
            return {}
        # Compose 2.21+ prints one JSON object per line; older versions a JSON array.
        records = json.loads(out) if out.startswith("[") else [json.loads(line) for line in out.splitlines()]
        return {r["Service"]: r for r in records}

    def down(self) -> None:
        if self._up is not None and self._up.poll() is None:
            self._up.send_signal(signal.SIGINT)
            try:
                self._up.wait(30)
            except subprocess.TimeoutExpired:
                self._up.kill()
                self._up.wait(5)
        if self._log_fh and not self._log_fh.closed:
            self._log_fh.close()
        # Every task's log, for a failed test (pytest keeps tmp_path of recent runs).
        logs = self.compose("logs", "--no-color", "--timestamps", timeout=60, check=False)
        (self.directory / "compose-logs.txt").write_text(logs.stdout + logs.stderr)
        self.compose("down", "--volumes", "--remove-orphans", "--timeout", "5", timeout=180, check=False)

    # -- docker SDK --------------------------------------------------------------------
    def containers(self) -> list:
        return self.client.containers.list(all=True, filters={"label": f"com.docker.compose.project={self.project}"})

    def container(self, service: str):
        found = self.client.containers.list(all=True, filters={"label": [
            f"com.docker.compose.project={self.project}", f"com.docker.compose.service={service}"]})
        assert len(found) == 1, f"expected one container of {service}, found {len(found)}"
        found[0].reload()
        return found[0]

    def files(self, path: str, service: str = CHIEF) -> dict[str, bytes | None]:
        """Files under ``path`` in a (possibly stopped) container: relative name -> bytes (None for dirs)."""
        stream, _ = self.container(service).get_archive(path)
        tar = tarfile.open(fileobj=io.BytesIO(b"".join(stream)))
        top = os.path.basename(path.rstrip("/"))
        out: dict[str, bytes | None] = {}
        for member in tar.getmembers():
            # A directory comes as top/..., a single file as the member "top" itself.
            name = member.name[len(top) + 1:] if member.name.startswith(f"{top}/") else member.name
            out[name] = tar.extractfile(member).read() if member.isfile() else None
        return out

    def read_json(self, path: str, service: str = CHIEF) -> dict:
        return json.loads(self.files(path, service)[os.path.basename(path)])

    def history(self) -> list[dict] | None:
        """The running chief's history.jsonl records, None while it cannot be read."""
        try:
            code, out = self.container(CHIEF).exec_run(["cat", f"{MODEL_DIR}/history.jsonl"])
        except Exception:  # noqa: BLE001 - not running (yet / any more), or restarting
            return None
        return faults.history(out.decode(errors="replace")) if code == 0 else None

    def chief_step(self) -> int:
        """Newest global step in the running chief's history.jsonl (0 before the first record)."""
        return max((r["step"] for r in self.history() or []), default=0)

    def wait_for_step(self, step: int, timeout: float) -> int:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            current = self.chief_step()
            if current >= step:
                return current
            if self._up is not None and self._up.poll() is not None:
                pytest.fail(f"the job ended before step {step}:\n{self.tail()}")
            time.sleep(0.5)   # each look is a docker exec: CPU the job's containers share
        pytest.fail(f"the chief did not reach step {step} within {timeout} s:\n{self.tail()}")
