"""tfps jobs and tfps logs: what ansible/jobs.yml reads from the hosts, turned into a table
or a task's prefixed log lines (the play itself runs in tests/system/test_ansible.py)."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest

from tfps.backends import ansible as jobs
from tfps.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def _filters():
    spec = importlib.util.spec_from_file_location("tfps_jobs", REPO / "ansible" / "filter_plugins" / "tfps_jobs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _container(name, job, task, role, state="running", status="Up 5 minutes", created=1000.0, command=""):
    return {"Id": name * 2, "Names": [f"/{name}"], "State": state, "Status": status, "Created": created,
            "Command": command, "Labels": {"tfps.job": job, "tfps.task": task, "tfps.role": role},
            "Env": ["SECRET=never-shown"]}


def test_the_play_reads_chiefs_histories_and_keeps_no_environment():
    f = _filters()
    chief = _container("tfps-a-worker0", "a", "worker0", "chief",
                       command="tini -- tfps run --model_dir=/srv/tfps/a --train_steps=3000")
    ps = _container("tfps-a-ps0", "a", "ps0", "ps", command="tini -- tfps run --model_dir=/srv/tfps/a")
    assert f.tfps_chief_histories([chief, ps]) == [{"container": "tfps-a-worker0",
                                                   "history": "/srv/tfps/a/history.jsonl"}]
    hostvars = {
        "host1": {"tfps_jobs_info": {"containers": [ps]}},
        "host2": {"tfps_jobs_info": {"containers": [chief]}, "tfps_jobs_history": {"results": [
            {"item": {"container": "tfps-a-worker0"}, "stdout": '{"step": 100, "time": 10.0}\n{"step": 3'}]}},
        "host3": {"tfps_jobs_info": {"unreachable": True, "msg": "Failed to connect to the host via ssh"}},
    }
    view = f.tfps_jobs_view(hostvars, ["host1", "host2", "host3"])["hosts"]
    assert "never-shown" not in str(view)
    assert view["host2"]["containers"][0]["train_steps"] == "3000"
    assert view["host2"]["history"] == {"tfps-a-worker0": [{"step": 100, "time": 10.0}]}   # a line being written
    assert view["host3"]["error"] == "Failed to connect to the host via ssh"


def test_the_table_shows_each_job_with_its_progress_and_eta():
    hosts = {
        "host1": {"containers": [{"name": "tfps-a-ps0", "job": "a", "task": "ps0", "role": "ps", "state": "running"}]},
        "host2": {"containers": [
            {"name": "tfps-a-worker0", "job": "a", "task": "worker0", "role": "chief", "state": "running",
             "status": "Up", "created": 1000.0, "train_steps": "3000"},
            {"name": "tfps-b-worker0", "job": "b", "task": "worker0", "role": "chief", "state": "exited",
             "status": "Exited (0) 2 minutes ago", "created": 500.0, "train_steps": None}],
            "history": {"tfps-a-worker0": [{"step": 1000, "time": 100.0, "loss": 0.5},
                                           {"step": 1200, "time": 110.0, "loss": 0.41213, "examples_per_sec": 5123.4}]}},
    }
    rows = jobs.job_rows(hosts, now=1300.0)
    assert rows[0] == {"job": "a", "state": "running", "step": "1200/3000", "loss": "0.4121", "examples/s": "5123",
                       "started": "5m ago", "ETA": "90 s", "hosts": "host1,host2"}
    assert rows[1]["state"] == "Exited (0) 2 minutes ago" and rows[1]["ETA"] == "-" and rows[1]["loss"] == "-"
    table = jobs.render(rows, {"host3": "Failed to connect"}).splitlines()
    assert table[0].split() == ["JOB", "STATE", "STEP", "LOSS", "EXAMPLES/S", "STARTED", "ETA", "HOSTS"]
    assert table[1].split() == ["a", "running", "1200/3000", "0.4121", "5123", "5m", "ago", "90", "s", "host1,host2"]
    assert table[-1] == "host3: not read: Failed to connect"
    assert jobs.render([], {}) == "no tfps job on these hosts"


def test_log_lines_are_prefixed_like_tfps_local_and_remember_the_newest_time():
    banner = ("2026-12-05T10:00:00.100000000Z WARNING: All log messages before absl::InitializeLog() is called "
              "are written to STDERR\n2026-12-05T10:00:00.200000000Z I0000 00:00:1796519428.142621    3792 "
              "port.cc:153] oneDNN custom operations are on.\n")   # TensorFlow's import banner: left out
    hosts = {"host2": {"logs": {"tfps-a-worker0": banner + "2026-12-05T10:00:01.000000001Z 10:00:01 I chief: one\n"
                                                  "2026-12-05T10:00:02.500000000Z 10:00:02 I chief: two\n"}}}
    hosts["host2-again"] = hosts["host2"]   # one engine under two inventory names (inventory/local)
    lines, last = jobs.log_lines(hosts, "worker0")
    assert lines == ["[worker0] 10:00:01 I chief: one", "[worker0] 10:00:02 I chief: two"]
    assert last == "2026-12-05T10:00:02.500000000Z"


def test_an_unreachable_host_is_named_with_what_to_check():
    """jobs.yml lists containers with no_log (their records hold environments), which hides
    Ansible's reason: the line says what to check and how to see the reason."""
    censored = {"unreachable": True, "msg": "Task failed: Failed to connect to the host via ssh: "
                                            "<error censored due to no log>"}
    view = _filters().tfps_jobs_view({"h1": {"tfps_jobs_info": censored}}, ["h1"])
    assert view["hosts"]["h1"]["error"] == (
        "cannot be reached over SSH; check its address, ansible_user and SSH access "
        "(`ansible -i INVENTORY h1 -m ping` shows Ansible's reason)")
    plain = {"failed": True, "msg": "Error connecting: Error while fetching server API version"}
    assert _filters().tfps_jobs_view({"h2": {"tfps_jobs_info": plain}}, ["h2"])["hosts"]["h2"]["error"] == plain["msg"]


UNREACHABLE = ("cannot be reached over SSH; check its address, ansible_user and SSH access "
               "(`ansible -i INVENTORY {} -m ping` shows Ansible's reason)")


def test_logs_of_a_task_on_unreachable_hosts_say_which_hosts_were_not_read():
    """Issue 51: with every host unreachable, tfps logs said "no host has task worker0"."""
    from tfps.backends.ansible import not_found
    empty = {"error": None, "containers": [], "history": {}, "logs": {}}
    hosts = {h: {**empty, "error": UNREACHABLE.format(h)} for h in ("h1", "h2")}
    line = not_found(hosts, "j", "worker0")
    assert "\n" not in line
    assert line == ("task worker0 of job 'j' could not be looked for, no host was read: h1, h2 could not be read: "
                    + UNREACHABLE.format("HOST"))
    line = not_found({**hosts, "h3": empty}, "j", "worker0")
    assert line.startswith("task worker0 of job 'j' is on none of the hosts that were read (h3); h1, h2 could not "
                           "be read: cannot be reached over SSH")
    assert not_found({"h3": empty}, "j", "worker0") is None    # every host read: the task is on none of them


def test_the_ansible_backend_shows_one_jobs_row_and_says_when_a_host_was_not_read(capsys):
    """tfps status -i INV --job NAME (tfps.backends.ansible) over what ansible/jobs.yml read."""
    hosts = {"host1": {"error": None, "containers": [
        {"name": "tfps-a-worker0", "job": "a", "task": "worker0", "role": "chief", "state": "exited",
         "status": "Exited (0) 2 minutes ago", "created": 500.0, "train_steps": "40"}], "history": {}}}
    ns = argparse.Namespace(inventory=["hosts.ini"], extra_vars=[], vault_id=[], vault_password_file=[])
    backend = jobs.AnsibleBackend(ns, read=lambda *a, **k: hosts)
    assert backend.status("a") == 0
    assert capsys.readouterr().out.splitlines()[1].split()[:4] == ["a", "Exited", "(0)", "2"]
    with pytest.raises(ConfigError, match="no tfps job 'b' on the inventory's hosts"):
        backend.status("b")
    hosts["host2"] = {"error": "Failed to connect to the host via ssh"}
    assert backend.status("b") == 1   # it may be on host2: as tfps logs -i, exit 1
    assert capsys.readouterr().err.strip() == ("tfps: error: job 'b' is on none of the hosts that were read; host2 "
                                               "could not be read (`tfps jobs -i ...` says why)")
