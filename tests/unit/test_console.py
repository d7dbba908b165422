"""``tfps local``'s console: what it says about a classic script's directory, and the job's
live status line (tfps.launch.console) rendered from the chief's status.json."""

from __future__ import annotations

import os

from tfps.launch.processes import _script_dir


def test_the_start_line_names_only_a_directory_the_script_is_given():
    assert _script_dir([]) == ""
    assert _script_dir(["--train_steps", "10"]) == ""
    assert _script_dir(["--train_dir", "/tmp/x", "--steps", "3"]) == "the script's --train_dir /tmp/x"
    assert _script_dir(["--log-dir=rel"]) == f"the script's --log-dir {os.path.abspath('rel')}"


def test_the_status_line_shows_the_job_and_never_a_step_past_its_total():
    from tfps.launch.console import PROGRESS_LINE, status_text
    from tfps.outcome.contract import step_of
    now = 1000.0
    status = {"time": now - 1, "phase": "training", "step": 640, "train_steps": 1000, "loss": 0.41234,
              "metrics": {"accuracy": 0.8125}, "examples_per_sec": 3912.0, "eta_s": 13.0,
              "workers": {"worker0": {"examples_per_sec": 2100.0, "idle_s": 0.5},
                          "worker1": {"examples_per_sec": 1812.0, "idle_s": 1.0}}}
    text = status_text(status, now, now - 75)
    assert text == "loss 0.4123  accuracy 0.8125  3.9k ex/s  ETA 0:12  slowest worker1 -7%  1:15", text
    status["workers"]["worker1"]["idle_s"] = 12.0
    assert "worker1 no step for 13 s" in status_text(status, now, now - 75)
    assert status_text(None, now, now - 3, "1 ps + 2 worker(s)") == "starting 1 ps + 2 worker(s) (0:03)"
    assert "final save" in status_text({**status, "phase": "final save"}, now, now)
    assert step_of(640, 1000) == "640/1000" and step_of(1001, 1000) == "1000/1000 +1"
    assert PROGRESS_LINE.match("[worker1] 18:01:02 I worker1: step 400/1500 loss 0.4521 | 900 examples/s")
    assert not PROGRESS_LINE.match("[worker0] 18:01:02 W chief: no progress for 900 s")


def test_a_followed_job_has_no_eta_no_percentage_and_no_bar():
    """A followed job (--follow) runs to a stop, --until or --follow_idle: its train_steps is
    MAX_FOLLOW_STEPS, which once showed as ``ETA 951897163306:03:25`` and a bar stuck at 0 %."""
    from rich.console import Console

    from tfps.config.schema import MAX_FOLLOW_STEPS
    from tfps.launch.console import JobConsole, status_text
    from tfps.outcome.results import progress_line
    now = 1000.0
    status = {"time": now - 1, "phase": "training", "step": 640, "train_steps": MAX_FOLLOW_STEPS,
              "examples_per_sec": 3912.0, "eta_s": 2.3e12, "workers": {}}
    assert "ETA" not in status_text(status, now, now - 75)
    earlier = {"time": now - 11, "step": 100}
    assert progress_line({**status, "time": now}, earlier, MAX_FOLLOW_STEPS).startswith("step 640 | ")
    assert "ETA" not in progress_line({**status, "time": now}, earlier, MAX_FOLLOW_STEPS)
    con = JobConsole.__new__(JobConsole)
    con.status, con._live, con.launched, con.tasks = status, None, now - 75, ""
    out = Console(width=120, file=open(os.devnull, "w"))
    with out.capture() as cap:
        out.print(con)
    shown = cap.get()
    assert shown.startswith("step 640 ") and "%" not in shown and "ETA" not in shown, shown


def test_the_summary_says_how_far_an_async_job_went_past_its_steps_and_why():
    from tfps.outcome.contract import JobResult, summary_lines
    res = JobResult(job="j", status="succeeded", model="mlp", mode="async", task="worker0", host="h",
                    cluster={}, train_steps=1000, batch_size=8, global_step=1001)
    lines = summary_lines(res)
    assert lines[0] == "job j SUCCEEDED at global step 1000/1000 +1", lines
    assert lines[1].startswith("  1 step(s) past --train_steps 1000: asynchronous workers"), lines
    assert not any("1001/1000" in line for line in lines)


def test_the_console_drops_only_progress_lines_and_leaves_the_last_state(tmp_path):
    import io
    import time

    from tfps.launch.console import JobConsole
    from tfps.outcome import results
    for reported in (True, False):
        buf = io.StringIO()
        view = JobConsole(str(tmp_path), buf, live=True, launched=time.time(), tasks="1 ps + 2 worker(s)")
        view.start()
        view.out.write("[worker1] 18:01:02 I worker1: step 4/10 loss 1.0000 | 90 examples/s\n")
        view.out.write("[worker0] 18:01:02 W chief: a warning, printed in full\n")
        if reported:
            results.write_status(str(tmp_path), {"time": time.time(), "phase": "succeeded", "step": 11,
                                                 "train_steps": 10, "loss": 0.5, "metrics": {}})
        else:
            (tmp_path / results.STATUS).unlink()
        view.stop()
        view.out.write("[ps0] 18:01:03 I ps0: every worker is done; exiting\n")
        out = buf.getvalue()
        assert "a warning, printed in full" in out and "every worker is done" in out, out
        assert "step 4/10" not in out and "11/10" not in out, out
        assert ("step 10/10 +1" in out and "succeeded" in out) if reported else "starting" not in out, out


def test_the_chief_evaluates_a_saved_checkpoint_at_most_once_a_minute(tmp_path, monkeypatch):
    import types

    from tfps.task.output import evaluations, export
    seen = []
    monkeypatch.setattr(export, "evaluate", lambda fn, params, path, dataset: {"loss": 0.5, "accuracy": 0.75})
    monkeypatch.setattr(export, "write_eval_summaries", lambda d, step, m: seen.append((step, m)))
    cfg = types.SimpleNamespace(model_dir=str(tmp_path), label_column="label")
    setup = types.SimpleNamespace(model_fn=None, params=None, eval_schema=None)
    for step in (100, 200):
        (tmp_path / f"model.ckpt-{step}.index").write_text("")
    ev = evaluations.Evaluations(setup, cfg, every=0.0)
    ev.after_save(None, 100)
    ev.finish()
    ev.every = 3600.0
    ev.after_save(None, 200)      # within the interval: not evaluated
    ev.after_save(None, 300)      # no such checkpoint: not evaluated
    assert ev.finish() == [{"step": 100, "eval_loss": 0.5, "eval_accuracy": 0.75}]
    assert seen == [(100, {"loss": 0.5, "accuracy": 0.75})]
