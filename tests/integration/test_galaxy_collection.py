"""The role as the Ansible collection tfps.tfps: galaxy/build.py builds it from tfps/ansible,
``ansible-galaxy collection install`` installs it, and its playbooks run from there.

One build and one install; then a syntax check of its four playbooks and a real run of
``tfps.tfps.status`` against this machine (two inventory entries, ansible_connection=local):
the collection's tfps_plan action computes the plan, its tfps_ports module reads the
ports, its filters draw the table. Nothing is started (status.yml changes nothing).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
#: Where a task may name a module without this collection's prefix.
OTHER_COLLECTIONS = ("ansible.builtin.", "community.docker.", "ansible.posix.")
#: The keys of a task that are not its module.
TASK_KEYS = {"name", "when", "register", "vars", "tags", "loop", "loop_control", "run_once", "check_mode",
             "changed_when", "failed_when", "ignore_errors", "ignore_unreachable", "delegate_to", "become",
             "become_user", "no_log", "any_errors_fatal", "until", "retries", "delay", "environment",
             "notify", "throttle", "block", "rescue", "always", "async", "poll", "args", "diff",
             "delegate_facts", "listen", "timeout", "module_defaults", "connection", "with_items", "with_dict",
             "with_fileglob", "with_sequence", "with_together", "with_nested", "with_subelements"}


def _actions(tasks):
    for task in tasks or []:
        for part in ("block", "rescue", "always"):
            yield from _actions(task.get(part))
        if "block" not in task:
            yield [k for k in task if k not in TASK_KEYS]


def test_the_collection_builds_installs_and_runs_its_role(tmp_path):
    built = subprocess.run([sys.executable, str(REPO / "galaxy" / "build.py"), str(tmp_path / "dist")],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    tarball = Path(built.stdout.strip())
    import tfps
    assert tarball.name == f"tfps-tfps-{tfps.__version__}.tar.gz" and tarball.is_file()
    names = tarfile.open(tarball).getnames()
    for path in ("MANIFEST.json", "meta/runtime.yml", "roles/tfps/meta/argument_specs.yml",
                 "roles/tfps/tasks/main.yml", "plugins/action/tfps_plan.py", "plugins/modules/tfps_ports.py",
                 "plugins/filter/tfps_filters.py", "plugins/lookup/tfps_image_archive.py", "playbooks/deploy.yml",
                 "plugins/module_utils/tfps_docker.py"):
        assert path in names, path
    assert not [n for n in names if n.startswith("roles/tfps/") and n.endswith(".py")]   # plugins live in plugins/

    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_") and k != "PYTHONPATH"}
    env.update(HOME=str(tmp_path / "home"), ANSIBLE_NOCOLOR="1", PYTHONWARNINGS="ignore",
               ANSIBLE_CONFIG=str(tmp_path / "no-ansible.cfg"), ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"),
               ANSIBLE_COLLECTIONS_PATH=os.pathsep.join([str(tmp_path / "collections"),
                                                        str(REPO / "tfps" / "ansible" / "collections")]))
    install = subprocess.run([str(BIN / "ansible-galaxy"), "collection", "install", "--no-deps", "-p",
                              str(tmp_path / "collections"), str(tarball)], capture_output=True, text=True, env=env,
                             cwd=tmp_path, timeout=300)
    assert install.returncode == 0, install.stderr
    root = tmp_path / "collections" / "ansible_collections" / "tfps" / "tfps"

    # The role names its own plugins and itself by their full names.
    for path in [*(root / "roles/tfps/tasks").glob("*.yml"), *(root / "playbooks").glob("*.yml")]:
        data = yaml.safe_load(path.read_text())
        plays = data if path.parent.name == "playbooks" else [{"tasks": data}]
        for play in plays:
            for keys in _actions(play.get("tasks")):
                assert len(keys) == 1 and keys[0].startswith(("tfps.tfps.", *OTHER_COLLECTIONS)), (path.name, keys)
            for role in play.get("roles", []):
                assert role["role"] == "tfps.tfps.tfps"
    # The modules import the collection's module_utils (a collection has no ansible.module_utils.tfps_*).
    for module in ("tfps_ports", "tfps_containers"):
        source = (root / "plugins" / "modules" / f"{module}.py").read_text()
        assert "from ansible_collections.tfps.tfps.plugins.module_utils.tfps_docker import engine_request" in source
        assert "ansible.module_utils.tfps_" not in source
    text = "\n".join(p.read_text() for p in (root / "roles/tfps").rglob("*.yml"))
    assert "| tfps.tfps.tfps_plan_row" not in text and "map('tfps.tfps.tfps_plan_row')" in text
    assert "lookup('tfps.tfps.tfps_image_archive'" in text

    work = tmp_path / "work"
    work.mkdir()
    (work / "hosts.ini").write_text(
        "[ps]\nps0 ansible_connection=local tfps_base_port=23700\n"
        "[worker]\nw0 ansible_connection=local tfps_base_port=23710\n"
        f"[all:vars]\nansible_python_interpreter={sys.executable}\ntfps_job_name=galaxy-check\n")
    playbooks = ["tfps.tfps.deploy", "tfps.tfps.stop", "tfps.tfps.status", "tfps.tfps.cleanup"]
    syntax = subprocess.run([str(BIN / "ansible-playbook"), "-i", "hosts.ini", *playbooks, "--syntax-check"],
                            capture_output=True, text=True, env=env, cwd=work, timeout=300)
    assert syntax.returncode == 0, syntax.stdout + syntax.stderr
    assert f"playbook: {root}/playbooks/deploy.yml" in syntax.stdout

    status = subprocess.run([str(BIN / "ansible-playbook"), "-i", "hosts.ini", "tfps.tfps.status"],
                            capture_output=True, text=True, env=env, cwd=work, timeout=600)
    assert status.returncode == 0, status.stdout[-3000:] + status.stderr
    assert "TASK [tfps.tfps.tfps : Compute the cluster plan" in status.stdout
    assert '"job galaxy-check:"' in status.stdout, status.stdout[-3000:]
    for task in ("ps0", "worker0"):
        assert f'"  tfps-galaxy-check-{task}' in status.stdout and "not created" in status.stdout
