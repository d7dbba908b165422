"""The role through ansible-playbook itself: tags that select phases, argument specs and
inventory checks that fail before any host is contacted, and the documented commands reading
ansible/ansible.cfg. Each test runs ansible-playbook (or ansible-config) as a subprocess, so they
live here rather than in tests/unit (tests/unit/test_role.py checks the role's files)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _list_tasks(tmp_path, *args) -> str:
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible" / "ansible.cfg"), ANSIBLE_LOCAL_TEMP=str(tmp_path),
               ANSIBLE_NOCOLOR="1")
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(REPO / "inventory" / "example"),
                           str(REPO / "ansible" / "deploy.yml"), "--list-tasks", *args],
                          env=env, text=True, capture_output=True, cwd=REPO / "ansible")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_tags_select_the_phases_of_deploy(tmp_path):
    """--tags picks a phase (check, image, start, wait, collect); the plan always runs."""
    every = _list_tasks(tmp_path)
    for tag in ("check", "image", "start", "wait", "collect", "always"):
        assert re.search(rf"TAGS: \[[^\]]*\b{tag}\b", every), tag
    image = _list_tasks(tmp_path, "--tags", "image")
    assert "Compute the cluster plan from the play's own view of the inventory" in image
    assert "Copy the image archive to the host" in image
    assert "Check that the host answers over SSH" in image          # image needs the checks
    assert "Start the task containers" not in image
    assert "Wait for the chief to train, save, export and report" not in image
    wait = _list_tasks(tmp_path, "--tags", "wait,collect")
    assert "Wait for the chief to train, save, export and report" in wait
    assert "Fetch results.json from the chief's host" in wait or "results.json" in wait
    assert "Start the task containers" not in wait
    assert "Copy the image archive to the host" not in wait


def _deploy(tmp_path, inventory, *args) -> subprocess.CompletedProcess:
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible" / "ansible.cfg"), ANSIBLE_LOCAL_TEMP=str(tmp_path),
               ANSIBLE_NOCOLOR="1", ANSIBLE_HOST_KEY_CHECKING="False")
    return subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inventory), str(REPO / "ansible" / "deploy.yml"),
                           *args], env=env, text=True, capture_output=True, cwd=REPO / "ansible", timeout=300)


def _ini(tmp_path, worker_line: str) -> Path:
    path = tmp_path / "hosts.ini"
    # Addresses nobody answers on: a play that got past planning would fail on SSH instead.
    path.write_text(f"[ps]\na ansible_host=192.0.2.1\n\n[worker]\n{worker_line}\n")
    return path


def test_wrong_type_is_caught_by_argument_specs_before_any_host_is_contacted(tmp_path):
    result = _deploy(tmp_path, _ini(tmp_path, "b ansible_host=192.0.2.2"), "-e", "tfps_train_steps=many")
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert re.search(r"tfps_train_steps.*is of type .*str.* unable to convert to int", out, re.S), out[-3000:]
    assert "fatal: [a]" in out or "fatal: [b]" in out
    assert "Check that the host answers over SSH" not in out and "UNREACHABLE" not in out


def test_unknown_variable_names_host_file_and_line(tmp_path):
    result = _deploy(tmp_path, _ini(tmp_path, "b ansible_host=192.0.2.2 tfps_wrokers=2"))
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert "tfps_wrokers: unknown variable of host 'b'" in out, out[-3000:]
    from ansible.release import __version__
    if tuple(int(p) for p in __version__.split(".")[:2]) >= (2, 19):  # 2.17, 2.18 know no line of an INI value
        assert f"(set in {tmp_path / 'hosts.ini'}:5" in out
    assert "did you mean 'tfps_workers'?" in out
    assert "UNREACHABLE" not in out


def test_bad_inventory_layout_names_host_and_variable(tmp_path):
    result = _deploy(tmp_path, _ini(tmp_path, "b ansible_host=192.0.2.2 tfps_gpus='[0]' tfps_gpu_count=0"))
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert "tfps_gpus: GPU ids on a host without GPUs: host 'b' has tfps_gpu_count: 0" in out, out[-3000:]
    assert "UNREACHABLE" not in out


def _documented_playbook_commands():
    """Every ``ansible-playbook`` line of a sh block in README.md and the docs site's pages
    (docs/ansible.md, docs/tutorials/ansible.md, ...), with whether the block changed into
    ansible/ (or set ANSIBLE_CONFIG) before it."""
    for doc in (REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))):
        for block in re.findall(r"```sh\n(.*?)```", doc.read_text(), re.S):
            in_ansible = False
            for line in block.splitlines():
                line = line.strip()
                if re.match(r"cd ansible\b", line) or "ANSIBLE_CONFIG=ansible/ansible.cfg" in line:
                    in_ansible = True
                if "ansible-playbook " in line:
                    yield doc.name, line, in_ansible


def test_documented_commands_read_ansible_cfg(tmp_path):
    """The documented ansible-playbook commands run the playbooks where Ansible reads
    ansible/ansible.cfg (its pinned collections, pipelining, SSH settings): from the
    repository's root with ANSIBLE_CONFIG=ansible/ansible.cfg, paths relative to the root."""
    commands = list(_documented_playbook_commands())
    assert len(commands) >= 2, commands
    assert [c for c in commands if not c[2]] == []
    for _, line, _ in commands:
        playbook = re.search(r"ansible-playbook .*?(\S+\.yml)", line)
        assert playbook and playbook.group(1).startswith("ansible/") and (REPO / playbook.group(1)).is_file(), line
        inventory = re.search(r"-i (\S+)", line).group(1)
        assert inventory.startswith("inventory/"), f"{line}: the inventory is relative to the repository's root"
    # From there, Ansible does read the file (ansible-config names it as the source).
    env = dict(os.environ, ANSIBLE_CONFIG="ansible/ansible.cfg", ANSIBLE_LOCAL_TEMP=str(tmp_path))
    env.pop("ANSIBLE_COLLECTIONS_PATH", None)
    dump = subprocess.run([str(BIN / "ansible-config"), "dump", "--only-changed", "--format", "display"],
                          cwd=REPO, env=env, text=True, capture_output=True)
    assert dump.returncode == 0, dump.stderr
    assert "DEFAULT_FORKS(" in dump.stdout and ") = 20" in dump.stdout, dump.stdout
    collections = re.search(r"COLLECTIONS_PATHS\(.*?\) = \['(.*?)'\]", dump.stdout).group(1)
    assert Path(collections).resolve() == (REPO / "tfps" / "ansible" / "collections").resolve(), dump.stdout
