"""The role's tfps_image_load module (image.yml) against this machine's Docker engine, with a
small image built here (FROM scratch, no registry): several plays loading the same archive
on a host at once (jobs deployed at the same moment onto hosts without the image) all end
well, the image is there and the archive deleted; a copy with another sha256 and a file
that is no image archive are refused with what to do, and the copy is kept for the play's
rescue to delete."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from tests.fixtures.role_modules import ROLE, load_module

loader = load_module("tfps_image_load")
SOCKET = "/var/run/docker.sock"


def docker(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=300, check=check)


@pytest.fixture
def archive(tmp_path):
    """(tag, image id, path, sha256) of a saved one-file image that the engine no longer has."""
    tag = f"tfps-load-test:{uuid.uuid4().hex[:8]}"
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "hello").write_text(tag + "\n")
    (ctx / "Dockerfile").write_text("FROM scratch\nCOPY hello /hello\n")
    docker("build", "-q", "-t", tag, str(ctx))
    image_id = docker("image", "inspect", "-f", "{{.Id}}", tag).stdout.strip()
    path = tmp_path / "image.tar"
    docker("save", "-o", str(path), tag)
    docker("rmi", tag)
    yield tag, image_id, path, hashlib.sha256(path.read_bytes()).hexdigest()
    docker("rmi", "-f", tag, check=False)


def copy_as_ansible_does(src: Path, dest: Path) -> None:
    """ansible.builtin.copy: a temporary file in the destination's directory, renamed onto it."""
    tmp = dest.parent / f".ansible-tmp-{uuid.uuid4().hex}"
    shutil.copyfile(src, tmp)
    os.replace(tmp, dest)


def test_plays_loading_one_archive_at_once_all_end_well(archive, tmp_path):
    tag, image_id, src, sha = archive
    remote = tmp_path / "remote"
    remote.mkdir()
    dest = remote / "tfps-image-test.tar"
    results, errors = [], []

    def play() -> None:   # image.yml on one host: copy, then load
        try:
            copy_as_ansible_does(src, dest)
            results.append(loader.load(str(dest), sha, SOCKET, 300))
        except Exception as e:   # noqa: BLE001 - collected and asserted below
            errors.append(repr(e))

    plays = [threading.Thread(target=play) for _ in range(3)]
    for t in plays:
        t.start()
    # A fourth play at the same moment as Ansible runs it (the role's module and module_utils).
    copy_as_ansible_does(src, dest)
    env = dict(os.environ, ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_MODULE_UTILS=str(ROLE / "module_utils"))
    adhoc = subprocess.run([str(Path(sys.executable).parent / "ansible"), "localhost", "-c", "local",
                            "-M", str(ROLE / "library"), "-m", "tfps_image_load",
                            "-a", json.dumps({"path": str(dest), "sha256": sha}),
                            "-e", f"ansible_python_interpreter={sys.executable}"],
                           env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    for t in plays:
        t.join(300)
    assert adhoc.returncode == 0, adhoc.stdout[-3000:] + adhoc.stderr[-3000:]
    results.append(json.loads(adhoc.stdout.split("=>", 1)[1]))
    assert errors == []
    assert len(results) == 4
    # Each play either loaded the archive or found it loaded and deleted by another.
    assert all(r["gone"] or r["loaded"] for r in results), results
    assert any(tag in r["loaded"] for r in results), results
    assert not dest.exists()
    assert docker("image", "inspect", "-f", "{{.Id}}", tag).stdout.strip() == image_id
    assert (remote / loader.LOCK_NAME).exists() and [p.name for p in remote.iterdir()] == [loader.LOCK_NAME]


def test_a_damaged_copy_or_another_file_is_refused_and_kept(archive, tmp_path):
    tag, _, src, sha = archive
    dest = tmp_path / "tfps-image-test.tar"
    data = bytearray(src.read_bytes())
    data[len(data) // 2] ^= 0xFF
    dest.write_bytes(bytes(data))
    with pytest.raises(loader.LoadError) as e:
        loader.load(str(dest), sha, SOCKET, 300)
    assert f"the copy {dest} has sha256 {hashlib.sha256(bytes(data)).hexdigest()}, the original {sha}" in str(e.value)
    assert "check the disk space" in str(e.value) and dest.exists()
    assert docker("image", "inspect", tag, check=False).returncode != 0   # nothing was loaded

    dest.write_text("user,ad\nu1,a1\n")
    with pytest.raises(loader.LoadError) as e:
        loader.load(str(dest), "", SOCKET, 300)
    assert f"the Docker engine at {SOCKET}" in str(e.value) and str(dest) in str(e.value)
    assert dest.exists()
