"""results.json's one contract: JobResult, its readers (launcher summary, message, the
role's filter plugin) and the role's collect.yml, on files written by real short jobs.

tests/fixtures/results/ holds results.json files of real `tfps local` jobs: succeeded.json
(60 steps, TFPS_IMAGE_ID set), failed-nan.json (tests.fixtures.bad_models:nan_loss) and
legacy-succeeded.json, written by tfps before results.json had a schema.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tfps.config import RunConfig
from tfps.notify.message import format_message
from tfps.outcome.contract import (
    SCHEMA_VERSION,
    ErrorInfo,
    JobResult,
    Restart,
    ResultsError,
    Times,
    epoch,
    summary_lines,
)

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "results"
ROLE = REPO / "ansible" / "roles" / "tfps"
BIN = Path(sys.executable).parent
SUCCEEDED = FIXTURES / "succeeded.json"      # ended_at 2026-12-05T07:24:28+00:00
FAILED = FIXTURES / "failed-nan.json"
LEGACY = FIXTURES / "legacy-succeeded.json"


def filters():
    spec = importlib.util.spec_from_file_location("tfps_results", ROLE / "filter_plugins" / "tfps_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def slurp(path: Path) -> dict:
    """What ansible.builtin.slurp registers for a file."""
    return {"content": base64.b64encode(path.read_bytes()).decode(), "encoding": "base64", "source": str(path),
            "changed": False}


# ------------------------------------------------------------------ the record
@pytest.mark.parametrize("path", [SUCCEEDED, FAILED])
def test_a_real_results_json_round_trips_unchanged(path, tmp_path):
    written = json.loads(path.read_text())
    result = JobResult.load(str(path))
    assert result.to_dict() == written
    assert json.loads(result.to_json()) == written
    again = JobResult.load(result.save(str(tmp_path / "results.json")))
    assert again == result
    assert os.listdir(tmp_path) == ["results.json"]          # the temporary file was renamed, none left


def test_the_record_carries_its_schema_config_and_versions():
    res = JobResult.load(str(SUCCEEDED))
    raw = json.loads(SUCCEEDED.read_text())
    assert raw["schema_version"] == SCHEMA_VERSION == 1
    assert (res.status, res.global_step, res.train_steps, res.export_complete) == ("succeeded", 60, 60, True)
    assert isinstance(res.times, Times) and res.times.training_s > 0
    # The optimizer and learning rate as used (no flag gave them).
    assert (res.config["optimizer"], res.config["learning_rate"]) == ("adam", 0.01)
    assert "tfps default" in res.config["optimizer_note"]
    assert res.versions.tfps and res.versions.python and res.versions.tensorflow
    assert res.versions.image == res.image == "sha256:0123abcd"
    assert res.attempts == 1 and res.restarts == []
    # The keys tests and the README rely on keep their names.
    for key in ("status", "exit_code", "global_step", "train_steps", "final_loss", "metrics", "eval_metrics",
                "times", "started_at", "ended_at", "duration_s", "checkpoint", "export_dir", "export_complete",
                "cluster", "host", "model", "mode", "image", "ps_shares_mb", "lost_tasks", "task_exits",
                "restarts", "attempt_started_at", "workers", "stalls"):
        assert key in raw, key
    assert "error" not in raw


def test_config_holds_every_setting_but_the_notification_urls():
    from tfps.outcome.report import job_config
    url = "mailtos://user:hunter2@mail.example.com"
    config = job_config(RunConfig(notify=[url], run_name="x", learning_rate=0.5))
    assert set(RunConfig.__dataclass_fields__) - {"notify"} <= set(config)
    assert "notify" not in config and "hunter2" not in json.dumps(config)
    assert (config["run_name"], config["learning_rate"], config["export_dir"]) == ("x", 0.5, "tfps-model/export")


def test_a_failed_job_has_its_error():
    res = JobResult.load(str(FAILED))
    assert res.status == "failed" and res.exit_code == 1
    assert isinstance(res.error, ErrorInfo) and res.error.type == "FloatingPointError"
    assert "nan" in res.error.message and res.error.traceback_tail


def test_a_results_json_from_before_the_schema_is_read_and_written_with_it(tmp_path):
    raw = json.loads(LEGACY.read_text())
    assert "schema_version" not in raw and "config" not in raw
    res = JobResult.load(str(LEGACY))
    assert (res.job, res.status, res.global_step, res.image) == ("oldjob", "succeeded", 60, "sha256:abc")
    saved = json.loads(Path(res.save(str(tmp_path / "results.json"))).read_text())
    assert saved["schema_version"] == SCHEMA_VERSION
    assert {k: v for k, v in saved.items() if k in raw} == raw       # nothing it had is lost or changed


def test_keys_of_a_newer_tfps_are_kept():
    data = {**json.loads(SUCCEEDED.read_text()), "future_key": {"a": 1}}
    data["restarts"] = [{"task": "ps0", "time": "t", "cause": "c", "new_detail": 3}]
    res = JobResult.from_dict(data)
    assert res.restarts == [Restart(task="ps0", time="t", cause="c", extra={"new_detail": 3})]
    assert res.to_dict() == data


@pytest.mark.parametrize("text, says", [
    ('{"job": "demo", "status": "succ', "is not JSON"),
    ("[1, 2]", "holds a JSON list, not an object"),
    ('{"job": "demo"}', "it has no 'status'"),
    ('{"job": "demo", "status": "succeeded", "global_step": "60"}', 'global_step is "60", not a whole number'),
    ('{"job": "demo", "status": "succeeded", "times": {"startup_s": "x"}}', 'times.startup_s is "x", not a number'),
    ('{"job": "demo", "status": "succeeded", "schema_version": "1"}', "schema_version is '1'"),
    ('{"job": "demo", "status": "succeeded", "schema_version": 2}', "has schema_version 2, newer than the 1"),
])
def test_a_corrupt_or_newer_file_is_one_clear_error(tmp_path, text, says):
    path = tmp_path / "results.json"
    path.write_text(text)
    with pytest.raises(ResultsError) as e:
        JobResult.load(str(path))
    assert str(e.value).startswith(str(path)) and says in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


def test_a_binary_file_is_one_clear_error(tmp_path):
    path = tmp_path / "results.json"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    with pytest.raises(ResultsError, match="it is not text"):
        JobResult.load(str(path))


def test_a_diverged_loss_is_written_as_valid_json(tmp_path):
    res = JobResult(job="j", status="failed", final_loss=float("nan"), metrics={"acc": float("inf")})
    text = Path(res.save(str(tmp_path / "r.json"))).read_text()
    assert json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in results.json"))["final_loss"] is None
    assert JobResult.load(str(tmp_path / "r.json")).final_loss is None


def test_numpy_numbers_are_written_as_json_numbers(tmp_path):
    import numpy as np
    res = JobResult(job="j", status="succeeded", global_step=np.int64(60), final_loss=np.float32(0.5),
                    ps_shares_mb={"ps0": np.float64(1.25)})
    again = JobResult.load(res.save(str(tmp_path / "r.json")))
    assert (again.global_step, again.final_loss, again.ps_shares_mb) == (60, 0.5, {"ps0": 1.25})


# ------------------------------------------------------------------ whose run wrote it
def test_results_count_for_a_run_only_when_written_after_its_start():
    res = JobResult.load(str(SUCCEEDED))
    ended = epoch(res.ended_at)
    assert ended == epoch("2026-12-05T07:24:28Z")
    # Docker's StartedAt: nanoseconds and Z; the same second counts (the file says whole seconds).
    assert res.written_since("2026-12-05T07:24:28.999999999Z")
    assert res.written_since("2026-12-05T07:23:59.1Z")
    assert not res.written_since("2026-12-05T07:24:29.000000001Z")
    assert res.written_since(ended + 0.9) and not res.written_since(ended + 1.0)   # the launcher's time.time()
    assert res.written_since("2026-12-05T09:24:28+02:00") and not res.written_since("2026-12-05T08:25:00+01:00")
    assert res.written_since(None) and res.written_since("not a time")            # unknown start
    assert not JobResult(job="j", status="failed").written_since(0.0)             # no ended_at


# ------------------------------------------------------------------ summary and message
def test_summary_lines_of_a_real_job():
    res = JobResult.load(str(SUCCEEDED))
    lines = res.summary_lines(results_path="/m/results.json")
    t = res.times
    assert lines == [
        "job demo SUCCEEDED at global step 60/60",
        f"  final loss {res.final_loss:.6g}  metrics accuracy {res.metrics['accuracy']:.6g}  "
        f"eval accuracy {res.eval_metrics['accuracy']:.6g}, loss {res.eval_metrics['loss']:.6g}",
        f"  start-up {t.startup_s} s, training {t.training_s} s, final save {t.final_save_s} s",
        f"  checkpoint {res.checkpoint}",
        f"  export     {res.export_dir} (complete)",
        "  results    /m/results.json",
    ]


def test_summary_lines_of_a_failed_job_with_lost_tasks_and_restarts():
    res = JobResult.load(str(FAILED))
    res.add_lost_tasks({"worker1": "signal SIGKILL"})
    res.restarts = [Restart(task="ps0", time="t", cause="killed by SIGKILL")]
    lines = summary_lines(res, reason="why", host="host2", more=[("logs", "runs/x/logs/")], tail=["a", "b"],
                          tail_title="last lines:")
    assert lines[0] == "job nanjob FAILED at global step 0/200"
    assert lines == [
        "job nanjob FAILED at global step 0/200",
        f"  start-up {res.times.startup_s} s, training {res.times.training_s} s, final save {res.times.final_save_s} s",
        f"  error      FloatingPointError: {res.error.message}",
        "  reason     why",
        "  recovered from 1 failure(s): ps0 (killed by SIGKILL)",
        "  lost tasks worker1 (signal SIGKILL)",
        "  logs       runs/x/logs/",
        "last lines:", "a", "b"]
    assert not any(line.startswith("  export") or line.startswith("  results") for line in lines)
    # Without results of its own, the orchestrator's word is all there is.
    assert summary_lines(None, job="x", status="failed", reason="the chief died") == [
        "job x FAILED", "  reason     the chief died"]


def test_add_lost_tasks_merges_what_the_launcher_saw():
    res = JobResult(job="j", status="succeeded", lost_tasks=["ps0"], task_exits={})
    res.add_lost_tasks({"worker1": "signal SIGKILL"}).add_lost_tasks({"worker1": "signal SIGKILL"})
    assert res.to_dict()["lost_tasks"] == ["ps0", "worker1"]
    assert res.to_dict()["task_exits"] == {"worker1": "signal SIGKILL"}


def test_the_message_reads_the_record_as_the_file_has_it():
    res = JobResult.load(str(SUCCEEDED))
    title, body = format_message("succeeded", res)
    assert (title, body) == format_message("succeeded", res.to_dict())
    assert title == "[tfps] ✔ job demo succeeded at step 60"
    t = res.times   # the phases in the order they happened (the file sorts its keys)
    assert f"(startup {t.startup_s:.1f} s, training {t.training_s:.1f} s, final save {t.final_save_s:.1f} s)" in body
    assert "image        sha256:0123abcd" in body
    title, body = format_message("failed", JobResult.load(str(FAILED)))
    assert title.startswith("[tfps] ✘ job nanjob FAILED at step 0: loss is nan")
    assert "Traceback (last lines):" in body


# ------------------------------------------------------------------ the launcher's reader and writer
def test_the_launchers_summary_adds_the_lost_tasks_and_prints_the_lines(tmp_path, capsys):
    from tfps.launch.summary import summarize
    res = JobResult.load(str(SUCCEEDED))
    res.ended_at = "2030-01-01T00:00:05+00:00"
    res.save(str(tmp_path / "results.json"))
    cfg = RunConfig(model_dir=str(tmp_path))
    summarize(cfg, 0, epoch("2030-01-01T00:00:01Z"), [], {"worker1": "signal SIGKILL"})
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "job demo SUCCEEDED at global step 60/60"
    assert "  lost tasks worker1 (signal SIGKILL)" in out
    assert f"  results    {tmp_path / 'results.json'}" in out
    saved = JobResult.load(str(tmp_path / "results.json"))
    assert saved.lost_tasks == ["worker1"] and saved.task_exits == {"worker1": "signal SIGKILL"}
    assert saved.to_dict() == {**res.to_dict(), "lost_tasks": ["worker1"], "task_exits": {"worker1": "signal SIGKILL"}}


@pytest.mark.parametrize("content", ["stale", "corrupt"])
def test_the_launcher_takes_no_stale_or_corrupt_results_for_its_own(tmp_path, capsys, caplog, content):
    from tfps.launch.summary import summarize
    path = tmp_path / "results.json"
    if content == "stale":
        path.write_text(SUCCEEDED.read_text())          # ended 2026-12-05, before this "launch"
    else:
        path.write_text('{"job": "demo", "status"')
    summarize(RunConfig(model_dir=str(tmp_path)), -9, epoch("2030-01-01T00:00:00Z"), [], {})
    assert capsys.readouterr().out == ""
    assert "the chief exited with signal SIGKILL without writing results" in caplog.text
    if content == "corrupt":
        assert "is not a tfps results.json: it is not JSON" in caplog.text


# ------------------------------------------------------------------ the role's filters
STATE = {"Status": "exited", "ExitCode": 0, "OOMKilled": False, "StartedAt": "2026-12-05T07:24:20.123456789Z"}


def outcome(results, state=STATE, **kw):
    return filters().tfps_job_outcome(results, state, chief="tfps-demo-worker0", chief_host="host2",
                                      results_file="/srv/tfps/demo/results.json", **kw)


def test_filter_takes_the_results_the_chief_of_this_container_run_wrote():
    got = outcome(slurp(SUCCEEDED))
    assert got == {"status": "succeeded", "fresh": True, "results": json.loads(SUCCEEDED.read_text()),
                   "chief_exit": 0, "reason": ""}
    failed = outcome(slurp(FAILED), {**STATE, "ExitCode": 1})
    assert (failed["status"], failed["fresh"], failed["reason"]) == ("failed", True, "")
    assert failed["results"]["error"]["type"] == "FloatingPointError"
    # Text and records are taken as well as slurp results.
    assert outcome(SUCCEEDED.read_text())["fresh"] and outcome(json.loads(SUCCEEDED.read_text()))["fresh"]
    # The chief's container is gone: whatever results there are count.
    assert outcome(slurp(SUCCEEDED), {})["status"] == "succeeded"


def test_filter_refuses_results_left_by_an_earlier_run():
    got = outcome(slurp(SUCCEEDED), {**STATE, "ExitCode": 137, "OOMKilled": True,
                                     "StartedAt": "2026-12-05T08:00:00.5Z"})
    assert (got["status"], got["fresh"], got["results"], got["chief_exit"]) == ("failed", False, {}, 137)
    assert got["reason"] == ("the chief tfps-demo-worker0 on host2 exited with code 137 (killed: out of memory) "
                             "without writing /srv/tfps/demo/results.json (the one there was written at "
                             "2026-12-05T07:24:28+00:00, before this run)")


def test_filter_says_why_when_there_are_no_readable_results():
    missing = outcome({"msg": "file not found", "failed": True}, {**STATE, "ExitCode": 1})
    assert missing["reason"] == ("the chief tfps-demo-worker0 on host2 exited with code 1 without writing "
                                 "/srv/tfps/demo/results.json")
    skipped = outcome({"skipped": True, "changed": False}, {})
    assert skipped["status"] == "failed" and "exited with code ?" in skipped["reason"]
    corrupt = outcome({"content": base64.b64encode(b'{"job": "demo", "sta').decode(), "encoding": "base64"})
    assert corrupt["status"] == "failed" and not corrupt["fresh"]
    assert "without writing /srv/tfps/demo/results.json (/srv/tfps/demo/results.json is not a tfps " \
           "results.json: it is not JSON" in corrupt["reason"]
    newer = {**json.loads(SUCCEEDED.read_text()), "schema_version": SCHEMA_VERSION + 1}
    assert f"has schema_version {SCHEMA_VERSION + 1}, newer" in outcome(newer)["reason"]


def test_filter_judges_a_classic_script_by_its_chiefs_exit_code():
    assert outcome({}, script=True) == {"status": "succeeded", "fresh": False, "results": {}, "chief_exit": 0,
                                        "reason": ""}
    failed = outcome(slurp(SUCCEEDED), {**STATE, "ExitCode": 2}, script=True)
    assert (failed["status"], failed["results"]) == ("failed", {})
    assert failed["reason"] == "the chief tfps-demo-worker0 on host2 exited with code 2"


def test_filter_summary_lines():
    f = filters()
    containers = [{"Name": "/tfps-demo-ps0", "State": {"ExitCode": 0}},
                  {"Name": "/tfps-demo-worker0", "State": {"ExitCode": 0}}]
    judged = {**outcome(slurp(SUCCEEDED)), "tasks": f.tfps_container_exits(containers)}
    lines = f.tfps_summary_lines(judged, "demo", chief_host="host2", results_dir="/runs/demo",
                                 chief_name="worker0", ok_statuses=["succeeded"], chief_log="x\n  y  \n\n")
    res = JobResult.load(str(SUCCEEDED))
    assert lines[0] == "job demo SUCCEEDED at global step 60/60"
    assert lines[3:] == [f"  checkpoint host2:{res.checkpoint}", f"  export     host2:{res.export_dir} (complete)",
                         "  results    /runs/demo/results.json", "  logs       /runs/demo/logs/",
                         "  tasks      tfps-demo-ps0 exit 0, tfps-demo-worker0 exit 0",
                         "last lines of the chief's log:", "x", "y"]
    lost = {**outcome({}, {**STATE, "ExitCode": 137}), "tasks": {}}
    assert f.tfps_summary_lines(lost, "demo", results_dir="/runs/demo", ok_statuses=["succeeded"]) == [
        "job demo FAILED",
        "  reason     the chief tfps-demo-worker0 on host2 exited with code 137 without writing "
        "/srv/tfps/demo/results.json",
        "  chief log  /runs/demo/logs/worker0.full.log (whole)", "  logs       /runs/demo/logs/", "  tasks      "]


# ------------------------------------------------------------------ collect.yml itself, through Ansible
def _collect_tasks(*names: str) -> list[dict]:
    tasks = {t["name"]: t for t in yaml.safe_load((ROLE / "tasks" / "collect.yml").read_text())}
    return [tasks[n] for n in names]


def test_collect_yml_leaves_the_judgement_to_tfps():
    text = (ROLE / "tasks" / "collect.yml").read_text()
    for jinja in ("to_datetime", "total_seconds", "mtime", "from_json", "b64decode"):
        assert jinja not in text, jinja


@pytest.mark.parametrize("case", ["fresh", "stale"])
def test_collect_yml_judges_and_shows_the_job_through_ansible(tmp_path, case):
    """The tasks of collect.yml that judge and show the job, run by ansible-playbook on this
    machine with the facts the play's earlier tasks register (docker_container_info, slurp)."""
    started = "2026-12-05T07:24:20.5Z" if case == "fresh" else "2026-12-05T07:30:00.5Z"
    exit_code = 0 if case == "fresh" else 137

    def info(name, chief, code):
        return {"item": {"name": name, "chief": chief, "container": f"tfps-demo-{name}"}, "exists": True,
                "container": {"Name": f"/tfps-demo-{name}", "Config": {"Env": ["APPRISE_URLS=secret"]},
                              "State": {"Status": "exited", "ExitCode": code, "OOMKilled": False,
                                        "StartedAt": started if chief else "2026-12-05T07:24:19Z"}}}
    facts = {
        "tfps_final_info": {"results": [info("ps0", False, 0), info("worker0", True, exit_code),
                                        info("worker1", False, 0)]},
        "tfps_results_slurp": slurp(SUCCEEDED),
        "tfps_task_logs": {"results": [{"item": {"chief": True}, "stdout": "one\ntwo\n"}]},
    }
    play_vars = {
        "tfps_chief": {"host": "localhost", "name": "worker0"}, "tfps_chief_container": "tfps-demo-worker0",
        "tfps_job_name": "demo", "tfps_script": "", "tfps_results_file": "/srv/tfps/demo/results.json",
        "tfps_results_dir": str(tmp_path / "runs"), "tfps_attempt_dir": str(tmp_path / "runs" / "20261205T120000Z"),
        "tfps_ok_statuses": ["succeeded"],
        "tfps_plan": {"tasks": [{"host": "localhost", "name": n} for n in ("ps0", "worker0", "worker1")]},
    }
    judge, show = _collect_tasks("Work out how the job ended", "Show how the job ended")
    show = {**show, "register": "tfps_shown"}
    out = tmp_path / "out.json"
    playbook = [{"hosts": "localhost", "gather_facts": False, "connection": "local", "vars": play_vars, "tasks": [
        {"name": "Set the facts earlier tasks register", "ansible.builtin.set_fact": facts},
        judge, show,
        {"name": "Keep what they made", "ansible.builtin.copy": {
            "content": "{{ {'outcome': tfps_outcome, 'shown': tfps_shown.msg} | to_json }}", "dest": str(out),
            "mode": "0600"}},
    ]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(playbook, sort_keys=False))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible" / "ansible.cfg"), ANSIBLE_LOCAL_TEMP=str(tmp_path),
               ANSIBLE_FILTER_PLUGINS=str(ROLE / "filter_plugins"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_PYTHON_INTERPRETER=sys.executable, HOME=str(tmp_path))
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", str(tmp_path / "play.yml")],
                          env=env, text=True, capture_output=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "secret" not in proc.stdout
    got = json.loads(out.read_text())
    judged, shown = got["outcome"], got["shown"]
    assert judged["tasks"] == {"tfps-demo-ps0": 0, "tfps-demo-worker0": exit_code, "tfps-demo-worker1": 0}
    if case == "fresh":
        assert (judged["status"], judged["fresh"], judged["reason"]) == ("succeeded", True, "")
        assert judged["results"] == json.loads(SUCCEEDED.read_text())
        assert shown[0] == "job demo SUCCEEDED at global step 60/60"
        assert f"  results    {tmp_path / 'runs' / '20261205T120000Z'}/results.json" in shown
        assert not any("chief log" in line for line in shown)
    else:
        assert (judged["status"], judged["fresh"], judged["results"]) == ("failed", False, {})
        assert judged["reason"].startswith("the chief tfps-demo-worker0 on localhost exited with code 137 without "
                                           "writing /srv/tfps/demo/results.json")
        assert shown[0] == "job demo FAILED"
        assert f"  chief log  {tmp_path / 'runs' / '20261205T120000Z'}/logs/worker0.full.log (whole)" in shown
    assert "  tasks      tfps-demo-ps0 exit 0, tfps-demo-worker0 exit %d, tfps-demo-worker1 exit 0" % exit_code in shown
    assert shown[-3:] == ["last lines of the chief's log:", "one", "two"]


def test_the_message_shows_the_settings_that_differ_from_the_defaults():
    from tfps.config import RunConfig
    from tfps.notify.message import format_message
    from tfps.outcome.report import job_config
    cfg = RunConfig(sync_replicas=True, backup_workers=1, train_steps=500, model_args={"units": 4}).validate()
    config = job_config(cfg)
    assert config["changed"] == {"train_steps": 500, "sync_replicas": True, "backup_workers": 1,
                                 "model_args": {"units": 4}}
    _, body = format_message("succeeded", {"job": "j", "status": "succeeded", "config": config})
    line = next(x for x in body.splitlines() if x.startswith("settings"))
    assert line.split(None, 1)[1] == "train_steps 500, sync_replicas True, backup_workers 1, model_args units 4"


def test_the_role_reads_an_earlier_runs_results_through_jobresult(tmp_path):
    """start.yml's "has the job ended already": the earlier results.json, through JobResult."""
    f = filters()
    record = f.tfps_results(slurp(SUCCEEDED))
    assert record["status"] == "succeeded" and record["schema_version"] == 1 and record["global_step"] > 0
    assert f.tfps_results(slurp(LEGACY))["status"] == "succeeded"
    assert f.tfps_results({"failed": False, "msg": "file not found"}) == {}      # no earlier run
    bad = tmp_path / "results.json"
    bad.write_text('{"job": "x", "status": "succ')                                # cut short
    assert f.tfps_results(slurp(bad)) == {}


def test_the_wait_line_says_where_the_job_stands():
    """deploy.yml's wait prints one such line per look (tfps_wait_chief)."""
    from tfps.outcome.results import progress_line
    newest = {"step": 1200, "loss": 0.41213, "examples_per_sec": 5123.2, "time": 110.0}
    assert progress_line(newest, {"step": 1000, "time": 100.0}, 3000) == \
        "step 1200/3000 (40%) | loss 0.4121 | 5123 examples/s | ETA 90 s"
    assert progress_line(newest, None, 3000) == "step 1200/3000 (40%) | loss 0.4121 | 5123 examples/s"
    assert progress_line(None, None, 3000) == "step 0/3000: starting (no training step recorded yet)"
