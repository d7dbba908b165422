"""The job's story: the attempts journal in model_dir, and how messages tell it."""

from __future__ import annotations

import json

import pytest

from tfps.config import RunConfig
from tfps.errors import ConfigError
from tfps.notify.message import format_message
from tfps.outcome import journal, results


def test_a_first_run_has_no_restarts_and_starts_when_it_started(tmp_path):
    story = journal.Story(str(tmp_path)).begin(1000.0)
    assert story.attempt == 0
    assert story.restarts() == []
    assert story.first_start() == 1000.0


def test_a_chief_started_again_is_a_restart_with_its_cause_and_the_steps_redone(tmp_path):
    first = journal.Story(str(tmp_path)).begin(1000.0)
    results.append_history(str(tmp_path), {"step": 450, "time": 1050.0, "loss": 0.1})
    results.append_history(str(tmp_path), {"step": 80, "time": 990.0})   # before this job's first start
    first.restart("ps0", "lost peer: the ps came back without its variables", 1020.0, 300, 40, "restored")

    again = journal.Story(str(tmp_path)).begin(1100.0, "killed by SIGKILL")
    again.resumed(400, "restored")
    assert again.attempt == 1
    assert again.first_start() == 1000.0   # the job's first start, not this process's
    ps, chief = again.restarts()
    assert ps == {"task": "ps0", "time": journal.iso(1020.0), "cause": "lost peer: the ps came back without its "
                  "variables", "resumed_from": 300, "how": "restored", "steps_redone": 40}
    assert chief == {"task": "worker0", "time": journal.iso(1100.0), "cause": "killed by SIGKILL",
                     "resumed_from": 400, "how": "restored", "steps_redone": 50}


def test_a_restart_nobody_saw_die_says_so(tmp_path):
    journal.Story(str(tmp_path)).begin(1000.0)
    again = journal.Story(str(tmp_path)).begin(1100.0)   # a container restarted by its policy
    again.resumed(600, "restored")
    (entry,) = again.restarts()
    assert entry["cause"] == "ended without a report (exit unknown)"
    assert entry["how"] == "restored" and "steps_redone" not in entry   # no history: unknown, not 0


def test_a_chief_that_joined_the_live_ps_redid_nothing_even_without_history(tmp_path):
    # Killed before its first progress record (the other worker did the early steps): it
    # took the live variables up as they were, so no step was lost.
    journal.Story(str(tmp_path)).begin(1000.0)
    again = journal.Story(str(tmp_path)).begin(1100.0)
    again.resumed(600, "joined")
    (entry,) = again.restarts()
    assert (entry["how"], entry["resumed_from"], entry["steps_redone"]) == ("joined", 600, 0)


def _deaths(*times: float) -> list[dict]:
    return [{"time": t, "signal": 9} for t in times]


def test_every_death_the_supervisors_saw_is_one_restart(tmp_path):
    """Issue 51: 13 processes killed, 6 listed. Every death a supervisor passed on is one entry:
    two ps lost at once, a ps killed twice before the chief recovered, a worker killed again
    before its board was read, a chief killed again before it claimed model_dir."""
    chief = journal.Story(str(tmp_path)).begin(1000.0)
    chief.died("ps0", _deaths(1010.0))
    chief.died("ps1", _deaths(1011.0))
    chief.recovered(["ps0", "ps1"], 300, 40, "restored", wall=1030.0)
    chief.died("ps1", _deaths(1011.0, 1040.0, 1045.0))               # its ledger, read again: 2 new
    chief.died("worker1", _deaths(1050.0, 1052.0), step=320)
    chief.recovered(["ps1"], 350, 20, "restored", wall=1060.0)
    chief.died("worker1", _deaths(1050.0, 1052.0, 1070.0), step=360)
    again = journal.Story(str(tmp_path))
    again.died("worker0", _deaths(1080.0, 1090.0))                  # the second one never claimed model_dir
    again.died("ps1", _deaths(1011.0, 1040.0, 1045.0))               # read by the new chief: nothing new
    again.begin(1100.0, "killed by SIGKILL")
    again.resumed(380, "joined", wall=1110.0)
    entries = again.restarts()
    got = [(e["task"], e["time"], e.get("how"), e.get("resumed_from"), e.get("steps_redone")) for e in entries]
    assert got == [("ps0", journal.iso(1010.0), "restored", 300, 40),
                   ("ps1", journal.iso(1011.0), "restored", 300, 0),   # one recovery: its steps counted once
                   ("ps1", journal.iso(1040.0), "restored", 350, 20),
                   ("ps1", journal.iso(1045.0), "restored", 350, 0),
                   ("worker1", journal.iso(1050.0), None, 320, 0),
                   ("worker1", journal.iso(1052.0), None, 320, 0),
                   ("worker1", journal.iso(1070.0), None, 360, 0),
                   ("worker0", journal.iso(1080.0), "joined", 380, 0),
                   ("worker0", journal.iso(1090.0), "joined", 380, 0)]
    assert all(e["cause"] == "killed by SIGKILL" for e in entries), entries
    # ... and the message says so.
    body = format_message("succeeded", {"job": "j", "status": "succeeded", "restarts": entries})[1]
    assert "Recovered from 9 failures:" in body, body


def test_a_chief_that_restored_because_a_ps_had_lost_the_variables_says_so(tmp_path):
    """Issue 51: a chief restart "restored, steps_redone 4357" while the ps was killed too: the
    steps are the ps's loss, and the chief's entry says why it restored."""
    journal.Story(str(tmp_path)).begin(1000.0)
    results.append_history(str(tmp_path), {"step": 500, "time": 1050.0})
    again = journal.Story(str(tmp_path))
    again.died("worker0", _deaths(1056.0))
    again.died("ps1", _deaths(1055.0))
    again.begin(1100.0, "killed by SIGKILL")
    again.resumed(300, "restored", lost=["ps1"])
    ps, chief = again.restarts()
    assert (ps["task"], ps["how"], ps["resumed_from"], ps["steps_redone"]) == ("ps1", "restored", 300, 200)
    assert (chief["task"], chief["how"], chief["steps_redone"]) == ("worker0", "restored", 0)
    assert chief["note"] == "restored because ps1 had lost the variables too"
    body = format_message("succeeded", {"job": "j", "status": "succeeded", "restarts": [ps, chief]})[1]
    assert "(restored because ps1 had lost the variables too)" in body, body


def test_an_ended_job_leaves_a_new_run_a_story_of_its_own(tmp_path):
    old = journal.Story(str(tmp_path)).begin(1000.0)
    journal.Story(str(tmp_path)).begin(1100.0)
    old.end("stopped")
    new = journal.Story(str(tmp_path)).begin(2000.0)
    assert new.attempt == 0 and new.restarts() == [] and new.first_start() == 2000.0


def test_a_line_cut_by_a_kill_is_skipped(tmp_path):
    journal.Story(str(tmp_path)).begin(1000.0)
    with open(tmp_path / journal.JOURNAL, "a") as fh:
        fh.write('{"event": "start", "ta')
    again = journal.Story(str(tmp_path)).begin(1100.0)
    assert [r["task"] for r in again.restarts()] == ["worker0"]
    lines = (tmp_path / journal.JOURNAL).read_text().splitlines()
    assert len(lines) == 3 and json.loads(lines[-1])["attempt"] == 1, lines   # no blank line, nothing lost


# ------------------------------------------------------------------------------ messages
RESTARTS = [
    {"task": "ps0", "time": "2026-12-03T08:58:10+00:00", "cause": "lost peer: the ps came back without its variables",
     "resumed_from": 1000, "how": "restored", "steps_redone": 212},
    {"task": "worker0", "time": "2026-12-03T09:01:44+00:00", "cause": "killed by SIGKILL", "resumed_from": 2310,
     "how": "joined", "steps_redone": 0},
]


def test_the_final_message_lists_the_failures_the_job_recovered_from():
    title, body = format_message("succeeded", {"job": "mnist", "status": "succeeded", "global_step": 10000,
                                               "train_steps": 10000, "restarts": RESTARTS})
    assert title == "[tfps] ✔ job mnist succeeded at step 10000"
    assert "The job recovered from 2 failures." in body
    assert "Recovered from 2 failures:\n  - ps0, lost peer: the ps came back without its variables, at " \
           "2026-12-03 08:58:10 UTC; resumed from step 1000 (a checkpoint), 212 step(s) redone\n" in body
    assert "  - worker0, killed by SIGKILL, at 2026-12-03 09:01:44 UTC; resumed from step 2310 (the live state " \
           "on the ps), 0 step(s) redone" in body


def test_a_clean_run_says_nothing_about_restarts():
    _, body = format_message("succeeded", {"job": "mnist", "status": "succeeded", "restarts": []})
    assert "recovered" not in body.lower() and "restart" not in body.lower()


def test_progress_and_stalled_titles_name_the_event():
    progress = {"job": "mnist", "status": "running", "global_step": 4200, "train_steps": 10000, "loss": 0.1831,
                "metrics": {"accuracy": 0.9453}, "examples_per_sec": 2480.0, "eta_s": 372,
                "workers": {"worker0": {"steps": 2150, "examples_per_sec": 1240.0}}}
    title, body = format_message("progress", progress)
    assert title == "[tfps] job mnist progress: step 4200/10000 (42%)"
    for line in ("global step  4200 of 10000", "loss         0.1831", "examples/s   2480", "ETA          6 min 12 s",
                 "metrics      accuracy 0.9453", "workers      worker0 2150 steps, 1240 examples/s"):
        assert line in body, body
    stalled = {**progress, "stall_timeout": 900,
               "stalled": [{"task": "worker1", "last_step": 3120, "since": "2026-12-03T09:14:02+00:00"}]}
    title, body = format_message("stalled", stalled)
    assert title == "[tfps] ⚠ job mnist stalled: worker1"
    assert "No progress for 15 min 0 s:\n  - worker1: last at global step 3120, since 2026-12-03 09:14:02 UTC" in body
    _, body = format_message("progress", {**progress, "resumed": ["worker1 resumed at step 5210 after 1260 s "
                                                                  "without progress"]})
    assert "Progress resumed:\n  - worker1 resumed at step 5210 after 1260 s without progress" in body


@pytest.mark.parametrize("field", ["notify_every", "stall_timeout"])
def test_negative_intervals_are_refused_by_name(field):
    with pytest.raises(ConfigError) as e:
        RunConfig(**{field: -1}).validate()
    assert e.value.field == field and "0 to turn it off" in str(e.value)
    RunConfig(**{field: 0}).validate()   # 0 is off, not an error


def test_intervals_reach_every_task_on_its_command_line():
    args = RunConfig(notify_every=60, stall_timeout=300).to_args()
    assert "--notify_every=60" in args and "--stall_timeout=300" in args
