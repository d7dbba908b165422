"""tfps jobs --slurm and tfps logs --slurm: squeue's and scontrol's output, and a job's files,
turned into the Ansible side's table and prefixed log lines.

The fixtures (tests/fixtures/slurm_output) are real output of Debian 12's slurm-wlm 22.05 on
the test cluster (tests/system/slurmcluster.py): squeue -h -t all -u lab -o '%i|%T|%j|%N' and
scontrol show job [-o] of two jobs (cap-a, 1 ps + 2 workers, 400 steps; cap-b, 1 ps + 1
worker, scancel'ed), and cap-a's files as it left them. The commands themselves run in
tests/system/test_slurm.py.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tfps import cli
from tfps.backends import slurm as slurm_jobs
from tfps.backends.protocol import render
from tfps.errors import ConfigError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm_output"
NODES = ["tfpsl139213c5-1", "tfpsl139213c5-2", "tfpsl139213c5-3"]


def _text(name: str, jobs_dir: Path | None = None) -> str:
    text = (FIXTURES / name).read_text()
    return text.replace("/shared/jobs", str(jobs_dir)) if jobs_dir else text


def _slurm(stage: str, jobs_dir: Path) -> dict:
    """read_slurm's answer from the captured output of one moment."""
    details = slurm_jobs.parse_scontrol(_text(f"scontrol_{stage}.txt", jobs_dir))
    return {j["id"]: {**details[j["id"]], "squeue": j}
            for j in slurm_jobs.parse_squeue(_text(f"squeue_{stage}.txt"))}


@pytest.fixture
def jobs_dir(tmp_path):
    """cap-a's model_dir and Slurm files, as the finished job left them on the shared filesystem."""
    shutil.copytree(FIXTURES / "jobs", tmp_path / "jobs")
    return tmp_path / "jobs"


def test_squeue_output_gives_each_job_its_state_name_and_nodes():
    assert slurm_jobs.parse_squeue(_text("squeue_pending.txt")) == [
        {"id": "1", "state": "PENDING", "name": "cap-a", "nodes": ""}]
    assert slurm_jobs.parse_squeue(_text("squeue_running.txt")) == [
        {"id": "1", "state": "RUNNING", "name": "cap-a", "nodes": "tfpsl139213c5-[1-3]"},
        {"id": "2", "state": "RUNNING", "name": "cap-b", "nodes": "tfpsl139213c5-[1-2]"}]
    assert [(j["id"], j["state"]) for j in slurm_jobs.parse_squeue(_text("squeue_stopping.txt"))] == [
        ("1", "COMPLETED"), ("2", "COMPLETING")]
    assert [(j["id"], j["state"]) for j in slurm_jobs.parse_squeue(_text("squeue_cancelled.txt"))] == [
        ("2", "CANCELLED"), ("1", "COMPLETED")]
    assert slurm_jobs.parse_squeue("") == []


def test_scontrol_output_one_line_or_blocks_gives_the_same_fields():
    one_line = slurm_jobs.parse_scontrol(_text("scontrol_running.txt"))
    blocks = slurm_jobs.parse_scontrol(_text("scontrol_multiline_running.txt"))
    assert sorted(one_line) == ["1", "2"] and sorted(blocks) == ["1"]
    for key in ("JobName", "JobState", "StartTime", "NodeList", "StdOut", "Command", "ExitCode", "WorkDir"):
        assert blocks["1"][key] == one_line["1"][key], key
    job = one_line["2"]
    assert (job["JobName"], job["JobState"], job["ExitCode"]) == ("cap-b", "RUNNING", "0:0")
    assert job["StdOut"] == "/shared/jobs/cap-b.slurm/slurm-2.out"
    assert job["AllocNode:Sid"] == "tfpsl139213c5-1:125" and job["Power"] == ""
    pending = slurm_jobs.parse_scontrol(_text("scontrol_pending.txt"))["1"]
    assert (pending["JobState"], pending["StartTime"], pending["NodeList"]) == ("PENDING", "Unknown", "")
    cancelled = slurm_jobs.parse_scontrol(_text("scontrol_cancelled.txt"))
    assert (cancelled["2"]["JobState"], cancelled["2"]["ExitCode"]) == ("CANCELLED", "143:0")


def test_a_finished_job_slurm_still_knows_shows_its_results_and_slurms_record(jobs_dir):
    found = slurm_jobs.find_jobs([], _slurm("completed", jobs_dir))
    assert [j["id"] for j in found] == ["1", "2"]
    row, other = slurm_jobs.row_of(found[0]), slurm_jobs.row_of(found[1])
    # cap-b still runs; its files are not in this copy: Slurm's view only.
    assert (other["job"], other["state"], other["step"], other["hosts"]) == (
        "cap-b (2)", "running", "0/?", ",".join(NODES[:2]))
    assert row["job"] == "cap-a (1)" and row["state"] == "succeeded (COMPLETED 0:0)"
    assert (row["step"], row["loss"], row["examples/s"], row["ETA"]) == ("400/400", "0.3880", "10152", "-")
    assert row["hosts"] == ",".join(NODES)
    table = render([row], {}).splitlines()
    assert table[0].split() == ["JOB", "STATE", "STEP", "LOSS", "EXAMPLES/S", "STARTED", "ETA", "HOSTS"]


def test_a_job_slurm_has_forgotten_is_found_on_disk_with_its_results_state(jobs_dir):
    found = slurm_jobs.find_jobs([str(jobs_dir)], {})
    assert [(j["id"], j["model_dir"]) for j in found] == [("1", str(jobs_dir / "cap-a"))]
    row = slurm_jobs.row_of(found[0], now=slurm_jobs._when("2026-12-06T21:31:29+00:00"))
    assert row == {"job": "cap-a (1)", "state": "succeeded", "step": "400/400", "loss": "0.3880",
                   "examples/s": "10152", "started": "10m ago", "ETA": "-", "hosts": ",".join(NODES)}
    assert slurm_jobs.find_job("cap-a", [str(jobs_dir)], {})["id"] == "1"
    assert slurm_jobs.find_job("1", [str(jobs_dir)], {})["id"] == "1"
    assert slurm_jobs.find_job("cap-b", [str(jobs_dir)], {}) is None


def test_a_pending_job_has_no_progress_and_no_hosts_yet(jobs_dir):
    for name in ("results.json", "status.json", "history.jsonl"):
        (jobs_dir / "cap-a" / name).unlink()
    (jobs_dir / "cap-a.slurm" / "slurm-1.out").unlink()
    found = slurm_jobs.find_jobs([], _slurm("pending", jobs_dir))
    row = slurm_jobs.row_of(found[0])
    assert (row["state"], row["step"], row["loss"], row["started"], row["hosts"]) == (
        "pending", "0/400", "-", "-", "-")   # the total from the script's --train_steps


def test_a_running_job_shows_its_status_and_an_eta(jobs_dir):
    found = slurm_jobs.find_jobs([], _slurm("running", jobs_dir))
    (jobs_dir / "cap-a" / "results.json").unlink()   # not written yet while it runs
    status = (jobs_dir / "cap-a" / "status.json")
    status.write_text(status.read_text().replace('"phase": "succeeded"', '"phase": "training"')
                      .replace('"step": 400', '"step": 100').replace('"eta_s": 0.0', '"eta_s": 31.5'))
    row = slurm_jobs.row_of(found[0])
    assert (row["state"], row["step"], row["ETA"]) == ("running", "100/400", "32 s")


def test_a_tasks_log_lines_are_its_ranks_prefixed_like_the_ansible_side(jobs_dir):
    out = (jobs_dir / "cap-a.slurm" / "slurm-1.out").read_text()
    script = str(jobs_dir / "cap-a.slurm" / "job.sbatch")
    assert [slurm_jobs.rank_of(t, out, script) for t in ("ps0", "worker0", "worker1")] == [0, 1, 2]
    assert [slurm_jobs.rank_of(t, "", script) for t in ("ps0", "worker0", "worker1")] == [0, 1, 2]   # the script's
    with pytest.raises(ConfigError, match="no worker2; give ps0..ps0 or worker0..worker1"):
        slurm_jobs.rank_of("worker2", "", script)
    ps = slurm_jobs.task_lines(out, 0, "ps0")
    assert ps[0].startswith("[ps0] 21:21:29 I Slurm job 1 step 0: rank 0 is ps0 on tfpsl139213c5-1:")
    assert "[ps0] 21:22:24 I ps0: every worker is done; exiting" in ps
    assert ps[-1] == "[slurm] tfps: Slurm job 1: the chief exited with 0"
    chief = slurm_jobs.task_lines(out, 1, "worker0")
    assert any("job cap-a succeeded at step 400" in line for line in chief)
    assert not any("rank 0 is ps0" in line or "worker1:" in line for line in chief)


def test_without_squeue_or_a_source_the_commands_say_so_in_one_line(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))   # a login node without Slurm's commands
    for argv, text in ((["jobs"], "inventory: give -i INVENTORY (the hosts of an Ansible deploy), --slurm (jobs under Slurm), "),
                       (["jobs", "--slurm", "-i", "hosts"], "slurm: give -i INVENTORY or --slurm, not both"),
                       (["jobs", "--slurm"], "slurm: squeue is not on the PATH: run tfps jobs/logs --slurm on a "
                                             "Slurm login node"),
                       (["logs", "--slurm", "cap-a"], "squeue is not on the PATH")):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and text in err[0], err
    assert os.environ["PATH"] == str(tmp_path)


@pytest.mark.parametrize("name, content", [
    ("status.json", '{"phase": "training", "train_steps": "many", "step": 3}'),
    ("status.json", '{"phase": "training", "train_steps": 10, "step": "three"}'),
    ("history.jsonl", '[1, 2]\n'),
    ("status.json", '["not", "a", "record"]'),
])
def test_a_job_whose_files_hold_wrong_types_is_one_line_and_the_others_are_listed(jobs_dir, capsys, name, content):
    """Issue 51: a wrong-typed value in one job's files gave a traceback instead of the table."""
    shutil.copytree(jobs_dir / "cap-a", jobs_dir / "cap-x")
    (jobs_dir / "cap-x.slurm").mkdir()
    (jobs_dir / "cap-x.slurm" / "slurm-5.out").write_text("")
    (jobs_dir / "cap-x" / "results.json").unlink()
    (jobs_dir / "cap-x" / name).write_text(content)
    table, complete = slurm_jobs.list_jobs([str(jobs_dir)], slurm={})
    lines = table.splitlines()
    if name == "status.json" and content.startswith("["):   # not a record: read as no status, the job is listed
        assert complete and len(lines) == 3, table
        return
    assert not complete
    assert lines[0].split()[0] == "JOB" and lines[1].startswith("cap-a (1) ") and len(lines) == 3, table
    assert lines[2].startswith(f"job 5 ({jobs_dir / 'cap-x'}): not read: a value in its files has the wrong type ")
    assert "status.json, history.jsonl and results.json" in lines[2]


def test_a_job_name_with_blanks_is_read_back_from_the_script(tmp_path):
    from tfps.launch import slurm
    script = tmp_path / "job.sbatch"
    script.write_text(slurm.sbatch_script(name="my run", num_ps=1, num_workers=2, model_dir="/s/m",
                                          slurm_dir="/s/m.slurm", workdir="/s", python="/p", grace=60,
                                          run_options=["--train_steps", "40"]))
    assert slurm_jobs._script_settings(str(script)) == {"name": "my run", "ps": 1, "workers": 2, "train_steps": 40}


def test_the_slurm_backend_shows_a_jobs_row_and_stops_no_job_that_has_ended(jobs_dir, capsys):
    """tfps status/stop --slurm (tfps.backends.slurm) over what squeue and scontrol said once cap-a had
    completed: its row; a stop of it changes nothing and says so (scancel runs on tests/system's cluster)."""
    backend = slurm_jobs.SlurmBackend([str(jobs_dir)], read=lambda: _slurm("completed", jobs_dir))
    assert backend.status("cap-a") == 0
    row = capsys.readouterr().out.splitlines()[1]
    assert row.split()[:5] == ["cap-a", "(1)", "succeeded", "(COMPLETED", "0:0)"], row
    assert backend.stop("1") == 0
    assert capsys.readouterr().out.startswith("job 1 (Slurm job 1) has ended (succeeded (COMPLETED 0:0)); nothing")
    with pytest.raises(ConfigError, match=r"no tfps job 'cap-z' in squeue or under .*`tfps jobs --slurm` lists"):
        backend.status("cap-z")
