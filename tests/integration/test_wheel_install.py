"""Installed like any tool: the wheel ``pip wheel .`` builds, in a fresh venv outside the
checkout, run from an empty directory, finds its playbooks, role and catalogue.

The venv reaches the project venv's site-packages through a .pth file (TensorFlow,
ansible-core and the rest are not downloaded again), but tfps itself is the wheel's copy.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import docblocks
import pytest
import wheelbuild

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(900)

#: The Keras tutorial's model (docs/tutorials/keras-model.md): `import tensorflow as tf` and
#: tf.keras, which the installed tfps makes tf_keras.
KERAS_MODEL = docblocks.block("tutorials/keras-model.md", "# mymodels/small.py", lang="python")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the venv's tfps command, an empty working directory, the wheel)."""
    base = tmp_path_factory.mktemp("wheel")
    built = wheelbuild.wheel()   # shared with the other wheel tests, built once per version of the sources
    assert "Warning" not in built.build_log, built.build_log   # no setuptools warning (license, package data)
    wheelbuild.venv(base / "venv")
    venv = base / "venv"
    work = base / "empty"
    work.mkdir()
    return venv / "bin" / "tfps", work, built.path


def _tfps(installed, *args, env=None, timeout=300):
    tfps, work, _ = installed
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ANSIBLE_CONFIG")}
    environ["HOME"] = str(work.parent / "home")
    environ.update(env or {})
    return subprocess.run([str(tfps), *args], cwd=work, env=environ, capture_output=True, text=True,
                          timeout=timeout)


def test_the_wheel_ships_the_playbooks_and_role_but_no_collections(installed):
    names = zipfile.ZipFile(installed[2]).namelist()
    for path in ("tfps/ansible/deploy.yml", "tfps/ansible/stop.yml", "tfps/ansible/status.yml",
                 "tfps/ansible/cleanup.yml", "tfps/ansible/jobs.yml", "tfps/ansible/ansible.cfg",
                 "tfps/ansible/requirements.yml", "tfps/ansible/roles/tfps/meta/argument_specs.yml",
                 "tfps/ansible/roles/tfps/defaults/main.yml", "tfps/ansible/roles/tfps/tasks/main.yml",
                 "tfps/ansible/roles/tfps/library/tfps_ports.py", "tfps/ansible/filter_plugins/tfps_jobs.py",
                 "tfps/ansible/roles/tfps/module_utils/tfps_docker.py"):
        assert path in names, path
    assert not [n for n in names if "ansible_collections" in n or "__pycache__" in n]


def test_version_and_plan_from_an_empty_directory(installed):
    version = _tfps(installed, "-V")
    assert version.returncode == 0 and version.stdout.startswith("tfps ") and "ansible-core " in version.stdout
    inventory = installed[1].parent / "inventory"
    if not inventory.exists():
        shutil.copytree(REPO / "inventory" / "example", inventory)
    plan = _tfps(installed, "plan", "-i", str(inventory))
    assert plan.returncode == 0, plan.stderr
    assert "job example" in plan.stdout and "worker0" in plan.stdout
    where = _tfps(installed, "plan", "-i", str(inventory), "-v")   # the wheel's copy, not the checkout
    assert str(REPO) not in where.stderr


def _unreachable(installed) -> str:
    path = installed[1].parent / "unreachable.ini"
    # TEST-NET addresses: nothing answers; a short SSH timeout.
    path.write_text("[ps]\nh1 ansible_host=192.0.2.1\n[worker]\nh2 ansible_host=192.0.2.2\n[all:vars]\n"
                    "ansible_ssh_common_args='-o ConnectTimeout=3'\n")
    return str(path)


def test_a_missing_collection_is_one_line_naming_the_command(installed):
    env = {"TFPS_INSTALL_COLLECTIONS": "0", "ANSIBLE_COLLECTIONS_PATH": str(installed[1].parent / "none")}
    for command in (["jobs"], ["deploy", "--check"]):
        done = _tfps(installed, *command, "-i", _unreachable(installed), env=env)
        assert done.returncode == 2, done.stderr
        assert done.stderr.splitlines() == [
            "tfps: error: collections: the Ansible collections community.docker 4.8.5, "
            "community.library_inventory_filtering_v1 1.1.5 are not installed; install with: tfps collections "
            "(or, in a checkout, make collections)"], done.stderr


def test_a_missing_collection_is_installed_once_on_first_use(installed, tmp_path):
    """From PyPI's ansible wheel (sha256-checked) into tfps's own directory, with one line."""
    env = {"ANSIBLE_COLLECTIONS_PATH": str(tmp_path / "none"), "XDG_DATA_HOME": str(tmp_path / "data"),
           "ANSIBLE_HOST_KEY_CHECKING": "False"}
    jobs = _tfps(installed, "jobs", "-i", _unreachable(installed), env=env, timeout=600)
    assert jobs.stderr.splitlines()[0] == (
        "tfps: installing the Ansible collections community.docker 4.8.5, community.library_inventory_filtering_v1 "
        f"1.1.5 into {tmp_path / 'data' / 'tfps' / 'collections'} (from PyPI's ansible==12.3.0; once)"), jobs.stderr
    assert jobs.returncode == 1 and jobs.stdout.startswith("no tfps job on these hosts"), jobs.stdout + jobs.stderr
    assert (tmp_path / "data/tfps/collections/ansible_collections/community/docker/MANIFEST.json").is_file()
    again = _tfps(installed, "collections", "--check", env=env)
    assert again.returncode == 0 and again.stdout.startswith("installed: community.docker 4.8.5"), again.stdout


def test_jobs_and_deploy_find_their_playbooks_and_fail_about_the_hosts(installed):
    env = {"ANSIBLE_COLLECTIONS_PATH": str(REPO / "tfps" / "ansible" / "collections"),
           "ANSIBLE_HOST_KEY_CHECKING": "False"}
    jobs = _tfps(installed, "jobs", "-i", _unreachable(installed), env=env)
    assert jobs.returncode == 1, jobs.stdout + jobs.stderr
    lines = jobs.stdout.splitlines()
    assert lines[0] == "no tfps job on these hosts"
    assert lines[1:] == [f"{h}: not read: cannot be reached over SSH; check its address, ansible_user and SSH access "
                         f"(`ansible -i INVENTORY {h} -m ping` shows Ansible's reason)" for h in ("h1", "h2")]
    logs = _tfps(installed, "logs", "-i", _unreachable(installed), "somejob", env=env)
    assert logs.returncode == 1, logs.stdout + logs.stderr    # as tfps jobs for a host it could not read
    assert logs.stderr.strip().splitlines() == [
        "tfps: error: task worker0 of job 'somejob' could not be looked for, no host was read: h1, h2 could not be "
        "read: cannot be reached over SSH; check its address, ansible_user and SSH access (`ansible -i INVENTORY "
        "HOST -m ping` shows Ansible's reason)"], logs.stderr
    deploy = _tfps(installed, "deploy", "--check", "-i", _unreachable(installed), env=env)
    assert deploy.returncode == 4, deploy.stdout[-3000:] + deploy.stderr    # README: 4, a host unreachable
    assert "h1 (192.0.2.1) cannot be reached over SSH" in deploy.stdout
    assert deploy.stderr.strip().splitlines()[-1] == (
        "tfps: error: deploy: h1 (192.0.2.1), h2 (192.0.2.2) cannot be reached over SSH (ansible-playbook exited 2: "
        "the role's check failed): check the inventory's addresses, ansible_user and SSH access "
        "(`ansible -i INVENTORY HOST -m ping` shows Ansible's reason)")


def test_local_trains_a_plain_tf_keras_model(installed):
    """The Keras tutorial: its model file and its command, at 1 worker and 20 steps."""
    work = installed[1]
    (work / "mymodels").mkdir(exist_ok=True)
    (work / "mymodels" / "small.py").write_text(KERAS_MODEL)
    command = docblocks.tfps_args("tutorials/keras-model.md", "tests/integration/test_wheel_install.py", "local")
    assert command[command.index("--model") + 1] == "mymodels.small:build_model", command
    done = _tfps(installed, "local", *command, "--workers", "1",
                 "--train-steps", "20", "--checkpoint-steps", "10", "--model-dir", str(work / "run"),
                 env={"TF_CPP_MIN_LOG_LEVEL": "3"}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (work / "run" / "results.json").is_file() and (work / "run" / "export" / "saved_model.pb").is_file()


def test_the_first_tutorials_install_block_runs_as_written(tmp_path):
    """docs/tutorials/first-job.md's pip block, as written, with bash, in a copy of the checkout
    (what ``pip wheel`` reads of it) and a fresh venv whose ``pip`` is this venv's pip run by the
    fresh venv's python. pip runs offline: no index, and as its find-links the recorded metadata
    of every dependency (tests/fixtures/tf_resolution.json, as stub wheels) and a real setuptools
    wheel for the build (downloaded once, from pip's cache or PyPI, as the wheel builds of
    tests/wheelbuild.py need too). The dependencies the project venv holds are taken from it
    (the fresh venv reaches it through a .pth file); ``tensorflow`` (this venv has tensorflow-cpu)
    is a stub's metadata over the same files. About 50 s (one wheel build), no TF cluster."""
    block = docblocks.block("tutorials/first-job.md", "# run by tests/integration/test_wheel_install.py")
    checkout, wheels, venv = tmp_path / "checkout", tmp_path / "wheels", tmp_path / "venv"
    for f in wheelbuild._sources():
        target = checkout / f.relative_to(REPO)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, target)
    wheels.mkdir()
    for meta in json.loads((REPO / "tests" / "fixtures" / "tf_resolution.json").read_text())["distributions"]:
        if meta["name"] != "setuptools":   # the build's setuptools must be a real one
            _stub_wheel(wheels, meta)
    got = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
                          "--disable-pip-version-check", "-d", str(wheels), "setuptools>=77"],
                         capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    (site / "project-venv.pth").write_text(wheelbuild.SITE + "\n")
    (venv / "bin" / "pip").write_text(f'#!/bin/sh\nexec {venv}/bin/python -m pip "$@"\n')
    (venv / "bin" / "pip").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k not in ("PYTHONPATH", "ANSIBLE_CONFIG")}
    env.update(PATH=f"{venv}/bin:/usr/bin:/bin", HOME=str(tmp_path), PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1",
               PIP_FIND_LINKS=str(wheels), PIP_DISABLE_PIP_VERSION_CHECK="1", TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=checkout, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    # The wheel the page names, installed into the fresh venv; its tfps, not the checkout's, answered -V.
    (wheel,) = (checkout / "dist").glob("tfps-*.whl")
    assert f"dist/{wheel.name}" in block, wheel.name
    assert (venv / "bin" / "tfps").is_file() and list(site.glob("tfps-*.dist-info"))
    versions = [line.split()[0] for line in done.stdout.splitlines() if line and not line.startswith(" ")]
    assert versions[-5:] == ["tfps", "TensorFlow", "tf_keras", "ansible-core", "Python"], done.stdout
    where = subprocess.run([f"{venv}/bin/python", "-c", "import tfps; print(tfps.__file__)"], env=env,
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert where.stdout.startswith(str(site)), where.stdout + where.stderr


def runnable_blocks() -> list[tuple[str, str]]:
    """Every ```sh block of README.md and the docs site's pages (docs/**/*.md) whose first line
    is a ``# test`` comment: (where, the block dedented)."""
    found = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        for m in re.finditer(r"^( *)```sh\n(.*?)^ *```", doc.read_text(), re.S | re.M):
            block = textwrap.dedent(m.group(2))
            if block.startswith("# test"):
                found.append((f"{doc.relative_to(REPO)}:{doc.read_text()[:m.start()].count(chr(10)) + 1}", block))
    return found


def test_there_are_runnable_blocks():
    where = [w for w, _ in runnable_blocks()]
    assert any(w.startswith("README.md") for w in where) and any(w.startswith("docs/ansible.md") for w in where)
    assert any(w.startswith("docs/reference/commands.md") for w in where), where


@pytest.mark.parametrize("where, block", runnable_blocks(), ids=[w for w, _ in runnable_blocks()])
def test_runnable_doc_blocks_run_as_written(installed, tmp_path, where, block):
    """In a fresh directory with a copy of the checkout's inventory/ (inventory/mycluster
    copied from the example, as the docs tell first), against the installed wheel; HOME holds
    ~/.vault_pass. The project venv's bin/ comes after the wheel's, for ansible-vault."""
    tfps, _, _ = installed
    shutil.copytree(REPO / "inventory", tmp_path / "inventory")
    shutil.copytree(REPO / "inventory" / "example", tmp_path / "inventory" / "mycluster")
    home = tmp_path / "home"
    home.mkdir()
    (home / ".vault_pass").write_text("docs-test-password\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ANSIBLE_CONFIG")}
    env.update(HOME=str(home), PATH=f"{tfps.parent}:{Path(sys.executable).parent}:/usr/bin:/bin",
               TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, f"{where}: exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"


#: Distributions that each install the ``tensorflow/`` package (two of them would overwrite each other).
TENSORFLOWS = {"tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel", "tensorflow-macos",
               "tensorflow-rocm", "tensorflow-aarch64"}


def _stub_wheel(directory: Path, meta: dict) -> None:
    """A wheel holding only ``meta`` as its METADATA: what pip's resolver reads of it."""
    name, version = meta["name"], meta["version"]
    stem = f"{re.sub(r'[-_.]+', '_', name)}-{version}"
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    if meta.get("requires_python"):
        lines.append(f"Requires-Python: {meta['requires_python']}")
    lines += [f"Provides-Extra: {e}" for e in meta.get("provides_extra", [])]
    lines += [f"Requires-Dist: {r}" for r in meta.get("requires_dist", [])]
    with zipfile.ZipFile(directory / f"{stem}-py3-none-any.whl", "w") as whl:
        whl.writestr(f"{stem}.dist-info/METADATA", "\n".join(lines) + "\n")
        whl.writestr(f"{stem}.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\n"
                                                "Tag: py3-none-any\n")
        whl.writestr(f"{stem}.dist-info/RECORD", "")


def test_the_documented_extras_install_exactly_one_tensorflow(installed, tmp_path):
    """pip's resolver, run on the wheel's own extras: `pip install 'tfps[cpu,keras]'` (the README's
    line) gives one distribution that writes tensorflow/, where tensorflow-cpu beside tf_keras
    would give two. No index is contacted: each candidate is a wheel holding the real metadata
    PyPI served for that release (tests/fixtures/tf_resolution.json, tensorflow-cpu included)."""
    snapshot = json.loads((REPO / "tests" / "fixtures" / "tf_resolution.json").read_text())
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for meta in snapshot["distributions"]:
        _stub_wheel(wheels, meta)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull   # no site index, find-links or constraints of this machine

    def resolve(*requirements: str) -> list[str]:
        report = tmp_path / "report.json"
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                               "--disable-pip-version-check", "--no-index", "--find-links", str(wheels),
                               "--report", str(report), *requirements], capture_output=True, text=True, env=env,
                              timeout=300)
        assert done.returncode == 0, done.stderr
        return sorted(re.sub(r"[-_.]+", "-", i["metadata"]["name"]).lower()
                      for i in json.loads(report.read_text())["install"])

    names = resolve(f"tfps[cpu,keras] @ {installed[2].as_uri()}")
    assert [n for n in names if n.startswith("tensorflow")] == ["tensorflow"], names   # pip list | grep -c ^tensorflow
    assert "tf-keras" in names and "tfps" in names
    # What the check guards against: the CPU-only distribution next to tf_keras is two.
    two = resolve("tensorflow-cpu==2.21.*", "tf_keras==2.21.*")
    assert [n for n in two if n in TENSORFLOWS] == ["tensorflow", "tensorflow-cpu"], two
