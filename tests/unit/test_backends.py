"""The four launchers pass the same protocol checks (tfps.backends, issue 47 item 2).

Each backend sees what it reads where it reads it: local reads model_dirs on this disk (real
files here), the others read what an outside system answered, given as that answer (docker
ps, squeue, ansible/jobs.yml listed nothing). The real reads run in tests/system (compose,
Ansible, Slurm) and tests/integration/test_stop_during_export.py (local).
"""

from __future__ import annotations

import argparse
import json

import pytest

from tfps import backends, cli
from tfps.backends import ansible, compose, local, slurm
from tfps.backends.protocol import Backend
from tfps.cluster import Launch, Plan, Task
from tfps.errors import ConfigError
from tfps.exitcodes import ExitCode
from tfps.outcome import lock

#: What each outside system answered: no job anywhere.
NOTHING_READ = {
    "compose": ("read_containers", lambda: []),
    "slurm": ("read_slurm", lambda: {}),
    "ansible": ("read_installed", lambda *a, **k: {"h1": {"error": None, "containers": [], "history": {}, "logs": {}},
                                                   "h2": {"error": None, "containers": [], "history": {}, "logs": {}}}),
}
OPTION = {"local": ["--local"], "compose": ["--compose"], "slurm": ["--slurm"], "ansible": ["-i", "{inv}"]}


@pytest.fixture
def world(tmp_path, monkeypatch):
    """This machine with no job: an empty --dir, an inventory of two hosts, nothing in Docker or Slurm."""
    (tmp_path / "hosts.ini").write_text("[ps]\nh1\n[worker]\nh2\n")
    (tmp_path / "runs").mkdir()
    monkeypatch.chdir(tmp_path)
    for name, (reader, answer) in NOTHING_READ.items():
        monkeypatch.setattr({"compose": compose, "slurm": slurm, "ansible": ansible}[name], reader, answer)
    return tmp_path


def _argv(name: str, tmp_path) -> list[str]:
    return [a.replace("{inv}", str(tmp_path / "hosts.ini")) for a in OPTION[name]]


def test_every_registered_backend_implements_the_protocol():
    assert set(backends.REGISTRY) == {"local", "compose", "ansible", "slurm"}
    for name, entry in backends.REGISTRY.items():
        cls = backends.get(name)
        assert cls.name == name and cls.option == entry.option
        for verb in ("from_args", "dry_run", "submit", "jobs", "status", "logs", "stop"):
            assert callable(getattr(cls, verb)), (name, verb)
    assert isinstance(local.LocalBackend(), Backend) and isinstance(compose.ComposeBackend(), Backend)
    with pytest.raises(ConfigError, match="'k8s' is not a backend; use one of ansible, slurm, local, compose"):
        backends.get("k8s")


def _backend(name: str, tmp_path):
    ns = argparse.Namespace(inventory=[str(tmp_path / "hosts.ini")], extra_vars=[], vault_id=[],
                            vault_password_file=[], dir=[str(tmp_path / "runs")])
    return backends.get(name).from_args(ns)


@pytest.mark.parametrize("name", list(backends.REGISTRY))
def test_a_dry_run_of_one_plan_names_the_same_tasks_with_the_same_options(name, world):
    plan = Plan.from_tasks([Task("h1", "10.0.0.1", "ps", 0, 2222), Task("h2", "10.0.0.2", "ps", 1, 2222),
                            Task("h1", "10.0.0.1", "worker", 0, 2223), Task("h2", "10.0.0.2", "worker", 1, 2223)])
    launch = Launch(name="demo", run_args=("--train_steps=7", "--model=mlp"))
    starts = _backend(name, world).dry_run(plan, launch)
    assert [s.task for s in starts] == ["ps0", "ps1", "worker0", "worker1"]
    for s in starts:
        assert "--train_steps=7" in s.command and "--model=mlp" in s.command, (name, s)
        assert s.where and s.line().startswith(s.task)


@pytest.mark.parametrize("verb", ["status", "stop"])
@pytest.mark.parametrize("name", list(backends.REGISTRY))
def test_status_and_stop_of_a_job_that_does_not_exist_is_one_line_and_exit_2(name, verb, world, capsys):
    code = cli.main([verb, *_argv(name, world), "--job", "no-such-job"])
    out, err = capsys.readouterr()
    assert code == ExitCode.BAD_CONFIG == 2, (out, err)
    assert out == "" and len(err.strip().splitlines()) == 1, err
    line = err.strip()
    assert line.startswith("tfps: error: job: no tfps job 'no-such-job' ") and "`tfps jobs " in line, line


@pytest.mark.parametrize("name", list(backends.REGISTRY))
def test_logs_of_an_unknown_job_are_refused_the_same_way(name, world, capsys):
    code = cli.main(["logs", *_argv(name, world), "no-such-job", "worker0"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("tfps: error: job: no ") and "'no-such-job'" in err and "`tfps jobs " in err, err


@pytest.mark.parametrize("name", list(backends.REGISTRY))
def test_jobs_with_no_job_anywhere_lists_none_and_exits_0(name, world, capsys):
    code = cli.main(["jobs", *_argv(name, world)])
    out = capsys.readouterr().out.strip()
    assert code == 0 and out.startswith("no tfps "), out


@pytest.mark.parametrize("argv, line", [
    (["stop", "--local"], "tfps: error: job: give --job NAME, the job to stop (`tfps jobs --local` lists them)"),
    (["status", "--slurm", "--check", "--job", "j"],
     "tfps: error: playbook_options: --check: ansible-playbook's options; drop them with --slurm"),
    (["stop"], "tfps: error: inventory: give -i INVENTORY (the hosts of an Ansible deploy), --slurm (jobs under "
               "Slurm), --local (tfps local's model_dirs) or --compose (compose jobs on this machine's Docker engine)"),
    (["jobs", "--local", "--compose"], "tfps: error: compose: give --local or --compose, not both"),
    (["jobs", "--compose", "--dir", "d"],
     "tfps: error: dir: --dir is where --slurm and --local look for jobs; give it with one of them"),
])
def test_a_backend_is_chosen_by_one_option(argv, line, world, capsys):
    assert cli.main(argv) == 2
    assert capsys.readouterr().err.strip() == line


def _finished_job(runs, name="mlp-1", status="succeeded"):
    model_dir = runs / name
    model_dir.mkdir()
    (model_dir / "tfps_run.json").write_text(json.dumps({"run_name": "mlp"}))
    (model_dir / "results.json").write_text(json.dumps({"job": "mlp", "status": status, "global_step": 40,
                                                        "train_steps": 40, "final_loss": 0.25}))
    return model_dir


def test_a_local_job_is_its_model_dir_and_runs_while_its_lock_is_held(world, capsys):
    model_dir = _finished_job(world / "runs")
    assert cli.main(["jobs", "--local"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["JOB", "STATE", "STEP"]
    assert table[1].split()[:5] == ["mlp", "(mlp-1)", "succeeded", "40/40", "0.2500"]
    assert cli.main(["status", "--local", "--job", "mlp"]) == 0   # its name, or its directory
    assert "succeeded" in capsys.readouterr().out
    assert cli.main(["stop", "--local", "--job", str(model_dir)]) == 0
    assert capsys.readouterr().out.startswith(f"job mlp ({model_dir}) is not running (succeeded); nothing to stop")
    assert cli.main(["logs", "--local", "mlp"]) == 2   # a job of a --script keeps none
    assert "kept no log in " in capsys.readouterr().err
    lock.acquire(str(model_dir), "mlp", "tfps local")   # as the launcher holds it while the job runs
    try:
        assert local.row_of(local.find_job("mlp-1", ["runs"]))["state"] == "running"
    finally:
        lock.release(str(model_dir))


def test_a_compose_job_is_a_project_with_a_worker0_service():
    """What ``docker ps -a --format PS_FORMAT`` printed for two projects, one of them not tfps's."""
    listed = compose.parse_ps(
        "demo\tworker0\tdemo-worker0-1\texited\tExited (143) 2 minutes ago\t2026-12-07 21:30:05 +0000 UTC\n"
        "demo\tps0\tdemo-ps0-1\texited\tExited (0) 2 minutes ago\t2026-12-07 21:30:04 +0000 UTC\n"
        "db\tpostgres\tdb-postgres-1\trunning\tUp 3 hours\t2026-12-07 18:00:00 +0000 UTC\n")
    jobs = compose.job_containers(listed)
    assert list(jobs) == ["demo"] and [c["service"] for c in jobs["demo"]] == ["ps0", "worker0"]
    row = compose.row_of("demo", jobs["demo"], now=compose._created("2026-12-07 21:35:05 +0000 UTC"))
    assert (row["state"], row["started"], row["hosts"]) == ("exited (143)", "5m ago", "this machine (ps0,worker0)")


def test_tfps_logs_local_shows_the_lines_the_launcher_kept_beside_the_model_dir(world, capsys):
    """tfps local copies each task's lines to MODEL_DIR.logs/TASK.log (tfps.launch.tasks); logs
    shows the last ones, prefixed as the launcher prefixes them, without TensorFlow's chatter."""
    model_dir = _finished_job(world / "runs")
    kept = world / "runs" / "mlp-1.logs"
    kept.mkdir()
    (kept / "worker0.log").write_text("21:30:01 I worker0: step 20/40\n21:30:03 I worker0: step 40/40\n"
                                      "WARNING: All log messages before absl::InitializeLog() is called are written "
                                      "to STDERR\n21:30:04 I chief: exported the SavedModel")
    (kept / "ps0.log").write_text("21:30:04 I ps0: every worker is done\n")
    assert cli.main(["logs", "--local", str(model_dir), "worker0", "-n", "2"]) == 0
    assert capsys.readouterr().out.splitlines() == ["[worker0] 21:30:03 I worker0: step 40/40",
                                                    "[worker0] 21:30:04 I chief: exported the SavedModel"]
    assert cli.main(["logs", "--local", "mlp", "worker1"]) == 2
    assert capsys.readouterr().err.strip() == "tfps: error: task: job 'mlp' has no task worker1; it has ps0, worker0"
