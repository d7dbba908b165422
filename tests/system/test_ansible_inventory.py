"""Ansible decides the inventory: an INI inventory, -e, --limit and --check on real hosts.

The three "bare-metal hosts" of hosts.py (sshd + their own Docker engine), reached over
SSH exactly like real machines. The plan comes from what the play itself resolved, so an
INI inventory and ``-e`` work as they do for any Ansible play.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import docblocks
import pytest
import wheelbuild
from plays import IMAGE, assert_ok, no_containers_anywhere, play_vars, recap

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed_tfps(tmp_path_factory) -> Path:
    """The ``tfps`` command of the wheel ``pip wheel .`` builds, installed in a fresh venv
    outside the checkout (TensorFlow and ansible-core reached through a .pth file to this
    venv's site-packages, not downloaded again; tfps itself is the wheel's copy)."""
    base = tmp_path_factory.mktemp("wheel")
    venv = base / "venv"
    wheelbuild.venv(venv)   # the wheel shared with the other wheel tests (tests/wheelbuild.py)
    return venv / "bin" / "tfps"


def wheel_tfps(tfps: Path, workdir: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """The installed ``tfps`` run from an empty directory, away from the checkout. The
    collections are the ones this suite installed (ANSIBLE_COLLECTIONS_PATH, which tfps
    honours), so nothing is downloaded."""
    workdir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ANSIBLE_CONFIG")}
    env.update(ANSIBLE_COLLECTIONS_PATH=str(REPO / "tfps" / "ansible" / "collections"),
               ANSIBLE_HOST_KEY_CHECKING="False", ANSIBLE_NOCOLOR="1", ANSIBLE_RETRY_FILES_ENABLED="0")
    return subprocess.run([str(tfps), *args], cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)


def tutorial_commands(inventory: Path) -> list[list[str]]:
    """The Ansible tutorial's commands (docs/tutorials/ansible.md), on ``inventory``."""
    return docblocks.commands("tutorials/ansible.md", "tests/system/test_ansible_inventory.py",
                              paths={"inventory/mycluster": inventory})


def ini_inventory(bare_metal, path: Path, job: str, archive: Path, steps: int) -> Path:
    """An INI inventory the way most Ansible users write one: groups, [group:vars], inline host vars."""
    ssh_args = ("-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o ConnectTimeout=10 "
                "-o LogLevel=ERROR")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join([
        "[ps]",
        f"host1 ansible_host={bare_metal['host1'].address}",
        "",
        "[worker]",
        f"host2 ansible_host={bare_metal['host2'].address}",
        f"host3 ansible_host={bare_metal['host3'].address} tfps_base_port=2230",
        "",
        "[all:vars]",
        "ansible_user=root",
        f"ansible_ssh_private_key_file={bare_metal.key}",
        f"ansible_ssh_common_args='{ssh_args}'",
        "ansible_python_interpreter=/usr/bin/python3",
        f"tfps_job_name={job}",
        f"tfps_image={IMAGE}",
        f"tfps_image_archive={archive}",
        "tfps_final_save_timeout=60",
        "",
        "[worker:vars]",
        "tfps_workers=1",
        "",
    ]))
    # Job settings beside the inventory, as most sites keep them.
    (path.parent / "group_vars").mkdir(exist_ok=True)
    (path.parent / "group_vars" / "all.yml").write_text(
        f"tfps_train_steps: {steps}\ntfps_batch_size: 32\ntfps_checkpoint_steps: 100\n")
    return path


@pytest.mark.system
def test_ini_inventory_deploys_and_extra_vars_reach_the_tasks(bare_metal, image_archive, installed_tfps,
                                                                tmp_path):
    """``tfps deploy`` of the installed wheel, from an empty directory, with an INI
    inventory: the plan comes from the play (worker1 on host3's own tfps_base_port 2230), and
    -e tfps_train_steps beats group_vars/all. Then the wheel's ``tfps jobs`` sees the finished
    job, and its ``tfps cleanup`` removes its containers and files from every host."""
    job = "ini"
    inventory = ini_inventory(bare_metal, tmp_path / "inventory" / "hosts.ini", job, image_archive, steps=300)
    extra = tmp_path / "extra.json"
    extra.write_text(json.dumps({**play_vars(tmp_path), "tfps_train_steps": 120, "tfps_remove_containers": False}))
    empty = tmp_path / "empty"
    # The Ansible tutorial's commands (docs/tutorials/ansible.md) on this inventory; this test's
    # variables come after the page's -e, and the last -e wins.
    tutorial = tutorial_commands(inventory)
    deploy_args = next(argv[2:] for argv in tutorial if argv[:2] == ["tfps", "deploy"] and "--check" not in argv)
    jobs_args = next(argv[2:] for argv in tutorial if argv[:2] == ["tfps", "jobs"])
    assert deploy_args == ["-i", str(inventory), "-e", "tfps_train_steps=500"], deploy_args
    deploy = wheel_tfps(installed_tfps, empty, "deploy", *deploy_args, "-e", f"@{extra}")
    output = deploy.stdout + deploy.stderr
    assert deploy.returncode == 0, output[-6000:]
    assert re.search(r"worker1\s+host3\s+\S+:2230", output), output[-4000:]
    results = json.loads((tmp_path / "results" / "latest" / "results.json").read_text())
    assert results["status"] == "succeeded"
    # -e reached the tfps: the job ended at 120, not at group_vars/all's 300.
    assert results["train_steps"] == 120
    assert 120 <= results["global_step"] < 300
    assert results["export_complete"] is True
    assert bare_metal["host2"].exists(f"/srv/tfps/{job}/export/saved_model.pb")
    assert bare_metal["host2"].containers(f"tfps.job={job}")   # kept (tfps_remove_containers false)

    jobs = wheel_tfps(installed_tfps, empty, "jobs", *jobs_args, timeout=300)
    assert jobs.returncode == 0, jobs.stdout + jobs.stderr
    row = next((line for line in jobs.stdout.splitlines() if line.split()[:1] == [job]), None)
    assert row is not None and f"/{results['train_steps']}" in row, jobs.stdout

    assert bare_metal["host2"].exists(f"/var/lib/tfps/{job}")   # the job's own files on its hosts
    cleanup = wheel_tfps(installed_tfps, empty, "cleanup", "-i", str(inventory), timeout=600)
    assert cleanup.returncode == 0, (cleanup.stdout + cleanup.stderr)[-4000:]
    no_containers_anywhere(bare_metal, job)
    assert not bare_metal["host2"].exists(f"/var/lib/tfps/{job}")
    assert list(empty.iterdir()) == []   # nothing written where it ran


@pytest.mark.system
def test_limit_that_leaves_out_job_hosts_is_refused_and_status_allows_it(bare_metal, image_archive, run_playbook,
                                                                         tmp_path):
    """--limit on deploy.yml would start part of a job: refused before anything starts,
    naming the hosts left out. status.yml looks at some hosts only, so it allows a limit."""
    job = "limit"
    inventory = ini_inventory(bare_metal, tmp_path / "inventory" / "hosts.ini", job, image_archive, steps=100)
    result = run_playbook("deploy.yml", inventory, play_vars(tmp_path), args=["--limit", "host1,host2"])
    assert result.returncode != 0, result.output[-3000:]
    assert f"--limit leaves out host3 of job {job}" in result.output, result.output[-3000:]
    for phase in ("Check that the host answers over SSH", "Copy the image archive to the host",
                  "Start the task containers"):
        assert phase not in result.output
    no_containers_anywhere(bare_metal, job)
    assert not bare_metal["host2"].exists(f"/srv/tfps/{job}")

    status = run_playbook("status.yml", inventory, play_vars(tmp_path), args=["--limit", "host2"])
    assert_ok(status, "status.yml --limit host2")
    assert f"tfps-{job}-worker0" in status.output and "not created" in status.output
    assert set(recap(status.output)) == {"host2"}


@pytest.mark.system
def test_check_mode_on_a_fresh_cluster_changes_nothing(bare_metal, image_archive, run_playbook, tmp_path):
    """--check --diff reports what deploy.yml would do and does nothing: on a fresh cluster
    it would start every task, and with tfps_data_src it names the files each worker host
    would get and copies none. (On a running job it would change nothing: the firewall test
    in test_security.py.)"""
    job = "checkmode"
    inventory = ini_inventory(bare_metal, tmp_path / "inventory" / "hosts.ini", job, image_archive,
                              steps=10_000_000)
    chief_host = bare_metal["host2"]
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"train-{i}.csv").write_text(f"f0,label\n{i},0\n")
    data_dir = f"/srv/tfps-data/{job}"

    # The Ansible tutorial's check line (docs/tutorials/ansible.md), on this inventory.
    check = next(argv[1:] for argv in tutorial_commands(inventory) if argv[:2] == ["tfps", "deploy"] and "--check" in argv)
    assert check == ["deploy", "-i", str(inventory), "--check", "--diff"], check
    fresh = run_playbook("deploy.yml", inventory, {**play_vars(tmp_path), "tfps_data_dir": data_dir,
                                                   "tfps_data_src": str(src / "train-*.csv")}, command=check)
    assert_ok(fresh, "deploy.yml --check on a fresh cluster")
    for host, task in (("host1", "ps0"), ("host2", "worker0"), ("host3", "worker1")):
        assert f"--check: {host} would start tfps-{job}-{task}" in fresh.output, fresh.output[-4000:]
    assert f"--check: host2 would get train-0.csv, train-2.csv in {data_dir}" in fresh.output, fresh.output[-4000:]
    assert f"--check: host3 would get train-1.csv in {data_dir}" in fresh.output
    for host in bare_metal.hosts:
        assert not host.exists(data_dir), host.name
    no_containers_anywhere(bare_metal, job)
    assert not chief_host.exists(f"/srv/tfps/{job}")
    for host in bare_metal.hosts:
        assert f"tfps {job} " not in host.sh("iptables -S INPUT")[1]
    # Neither waited nor collected.
    assert f"job {job} step" not in fresh.output and "RETRYING" not in fresh.output
    assert not (tmp_path / "results" / "latest" / "results.json").exists()
