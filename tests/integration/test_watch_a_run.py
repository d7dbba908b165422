"""A run you can watch (issue 39): ``tfps local`` on a terminal shows one live status line
for the job; with stdout to a pipe, every task's prefixed lines and no escape codes. Every
job leaves loss.png and metrics.png in its model_dir, the evaluation as TensorBoard's
``eval`` run, and counts that never read "1001/1000". The piped console is checked on the
shared job of tests/integration/test_async_job.py (``assert_a_piped_console``)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import uuid

import pytest
from integration_helpers import REPO, base_env, poll, read_results, run_flags

pytestmark = pytest.mark.integration

STEPS = 200
#: The status line as tfps.launch.console draws it: step, bar, percentage.
STATUS_LINE = re.compile(r"^step \d+/\d+( \+\d+)? [━╸╺ ]+ +\d+%", re.M)
#: A step of a total, in any line (a progress line, the status line, the summary).
STEP_OF = re.compile(r"\bstep (\d+)/(\d+)")


def _counts_add_up(text: str) -> None:
    over = [m.group(0) for m in STEP_OF.finditer(text) if int(m.group(1)) > int(m.group(2))]
    assert not over, over


def test_on_a_terminal_the_job_is_one_live_status_line(tmp_path):
    model_dir = tmp_path / "model"
    rc_file = tmp_path / "rc"
    env = base_env()
    session = f"tfps-view-{uuid.uuid4().hex[:8]}"
    argv = [sys.executable, "-m", "tfps", "local", *map(str, run_flags(model_dir, steps=STEPS))]
    inner = f"{shlex.join(argv)}; echo $? > {shlex.quote(str(rc_file))}"
    env_args = [x for k, v in env.items() if k in ("TFPS_DEMO_DIR", "PYTHONPATH") for x in ("-e", f"{k}={v}")]
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "200", "-y", "50", "-c", str(REPO),
                    *env_args, "bash", "--norc", "--noprofile", "-i"], check=True, env=env)
    try:
        def pane() -> str:
            return subprocess.run(["tmux", "capture-pane", "-p", "-J", "-t", session, "-S", "-500"],
                                  capture_output=True, text=True).stdout
        subprocess.run(["tmux", "send-keys", "-t", session, f"sh -c {shlex.quote(inner)}", "Enter"], check=True)
        poll(lambda: rc_file.exists() and rc_file.read_text().strip(), 300, "the launcher's exit")
        text = pane()
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    assert rc_file.read_text().strip() == "0", text
    # The live line's last state stays on the screen: the job's whole step, its end, the loss.
    final = [ln for ln in text.splitlines() if STATUS_LINE.match(ln)]
    assert final, text
    assert re.match(rf"^step {STEPS}/{STEPS}( \+\d+)? ━+ +100% succeeded .*loss \d", final[-1]), final[-1]
    # No per-worker progress lines (-v or a pipe shows them); the tasks' other lines and the summary do show.
    assert not re.search(r"^\[worker\d\] .* worker\d: step \d+/", text, re.M), text
    assert "[worker0]" in text and f"job tfps-mlp SUCCEEDED at global step {STEPS}/{STEPS}" in text, text
    assert f"tensorboard --logdir {model_dir}" in text, text
    _counts_add_up(text)
    assert_curves_and_eval_run(model_dir, read_results(model_dir))


def assert_curves_and_eval_run(model_dir, res: dict) -> None:
    """loss.png (and metrics.png from the chief's history, when the chief took a step of a
    short job), without any notification configured, as 640x360 PNGs; the evaluation as
    TensorBoard's "eval" run, under the training scalars' names."""
    from PIL import Image
    for name in ["loss.png"] + (["metrics.png"] if (model_dir / "history.jsonl").exists() else []):
        with Image.open(model_dir / name) as img:
            img.load()
            assert img.size == (640, 360), (name, img.size)

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    train = EventAccumulator(str(model_dir))
    train.Reload()
    evaluation = EventAccumulator(str(model_dir / "eval"))
    evaluation.Reload()
    assert {"loss", "accuracy"} <= set(evaluation.Tags()["scalars"]) & set(train.Tags()["scalars"])
    point = evaluation.Scalars("loss")[-1]
    assert point.step == res["global_step"]
    assert point.value == pytest.approx(res["eval_metrics"]["loss"], rel=1e-5)


def assert_a_piped_console(out: str, steps: int, res: dict) -> None:
    """With stdout to a pipe: no escape codes nor status line, every task's lines prefixed
    (the workers' progress lines included), and counts that add up: exactly --train_steps, or
    the summary says by how much and why. (Checked on the shared job of test_async_job.)"""
    assert "\x1b[" not in out and "━" not in out, out[-2000:]
    assert re.search(r"^\[(worker\d)\] \S+ I \1: step \d+/", out, re.M), out[-2000:]
    _counts_add_up(out)
    if res["global_step"] > steps:
        assert f"{res['global_step'] - steps} step(s) past --train_steps {steps}: asynchronous workers" in out, out
    assert res["global_step"] >= steps
