"""A job knows its settings: a start on its model_dir with other settings is refused unless --replace.

The chief records what defines the job (model, data, steps, batch, optimizer, layout) in
model_dir when it starts. ``tfps local`` with other settings is refused before any process
starts, each change named with its old and new value, and nothing in model_dir changes; the
chief refuses the same way when it is started by something else (a compose file whose
settings changed). With ``--replace`` the job goes on from its checkpoint with the new
settings: more steps continue its training. The same settings again resume as before.

The model_dir is named with glob characters (``exp[lr=0.01]``, issue 35 #10): TensorFlow globs
checkpoint paths, and such a job once ended with "no checkpoint was written" although
model.ckpt-N existed, and exported nothing. Here it trains, exports, resumes and exports
again, and a user's file in the export directory is kept.
"""

from __future__ import annotations

import json
import os
import re

import pytest
from integration_helpers import assert_nothing_left, checkpoint_step, read_results, run_flags
from test_restarts import start_cluster

pytestmark = pytest.mark.integration

FIRST_STEPS, MORE_STEPS = 40, 80


def snapshot(model_dir) -> dict[str, tuple[int, int]]:
    """Every file of model_dir: its size and modification time. Not the lock file: every start
    takes the model_dir's lock and writes who holds it there, a refused one too (the kernel's
    lock dies with it; the file only names the last holder)."""
    out = {}
    for root, _, files in os.walk(model_dir):
        for name in files:
            if root == str(model_dir) and name == ".tfps.lock":
                continue
            st = os.stat(os.path.join(root, name))
            out[os.path.relpath(os.path.join(root, name), model_dir)] = (st.st_size, st.st_mtime_ns)
    return out


def recorded_steps(model_dir) -> int:
    return json.loads((model_dir / "tfps-settings.json").read_text())["settings"]["train_steps"]


def test_other_settings_are_refused_and_replace_goes_on_from_the_checkpoint(procs, tmp_path):
    model_dir = tmp_path / "exp[lr=0.01]"
    first = procs.tfps("tfps-local-first", "local", *run_flags(model_dir, steps=FIRST_STEPS))
    assert first.wait(300) == 0, first.tail()
    done = checkpoint_step(model_dir)
    assert done >= FIRST_STEPS and recorded_steps(model_dir) == FIRST_STEPS
    res = read_results(model_dir)
    assert res["status"] == "succeeded" and res["export_complete"] is True, res.get("error")
    assert res["checkpoint"] == str(model_dir / f"model.ckpt-{done}")
    (model_dir / "export" / "notes.txt").write_text("kept")   # issue 35 #4, on the way

    # Other steps: refused before any process starts, the change named, model_dir untouched.
    before = snapshot(model_dir)
    refused = procs.tfps("tfps-local-refused", "local", *run_flags(model_dir, steps=MORE_STEPS),
                         separate_stderr=True)
    assert refused.wait(120) == 2, refused.tail()
    err = refused.stderr()
    assert (f"tfps: error: model_dir: {model_dir} holds a job with other settings, so it was left as it is: "
            f"train_steps: {FIRST_STEPS} -> {MORE_STEPS}. Three ways on: give another --model_dir; or delete or "
            f"move {model_dir}") in err, err
    assert "or add --replace" in err, err
    assert not refused.lines(r"tfps local: \d+ ps"), refused.tail()   # no task was started
    assert snapshot(model_dir) == before

    # The chief started by something else (a compose file with other settings) refuses the same way.
    tasks, _, ports = start_cluster(procs, model_dir, steps=MORE_STEPS)
    assert tasks["worker0"].wait(120) == 2, tasks["worker0"].tail()
    assert f"train_steps: {FIRST_STEPS} -> {MORE_STEPS}. Three ways on" in tasks["worker0"].output()
    assert tasks["worker1"].wait(60) == 1, tasks["worker1"].tail()
    assert tasks["ps0"].wait(60) == 0, tasks["ps0"].tail()
    assert_nothing_left(ports, *tasks.values())
    assert snapshot(model_dir) == before

    # --replace: from the checkpoint on to the new step count, the new settings recorded.
    replaced = procs.tfps("tfps-local-replace", "local", "--replace", *run_flags(model_dir, steps=MORE_STEPS))
    assert replaced.wait(300) == 0, replaced.tail()
    assert replaced.lines(rf"--replace: {re.escape(str(model_dir))} recorded other settings; going on from its "
                          rf"checkpoint with train_steps: {FIRST_STEPS} -> {MORE_STEPS}$"), replaced.tail()
    restored = replaced.lines(r"\[worker0\].*restored checkpoint of step (\d+)")
    assert restored and int(restored[0].group(1)) == done > 0, replaced.tail()
    assert f"restored checkpoint of step {done} from {model_dir / f'model.ckpt-{done}'}" in replaced.output()
    res = read_results(model_dir)
    assert res["status"] == "succeeded" and res["global_step"] >= MORE_STEPS, res
    assert res["export_complete"] is True
    assert json.loads((model_dir / "export" / "tfps_export.json").read_text())["global_step"] >= MORE_STEPS
    assert (model_dir / "export" / "notes.txt").read_text() == "kept"
    assert checkpoint_step(model_dir) >= MORE_STEPS and recorded_steps(model_dir) == MORE_STEPS

    # The same settings again: resumed as before, without a word about settings.
    again = procs.tfps("tfps-local-again", "local", *run_flags(model_dir, steps=MORE_STEPS))
    assert again.wait(300) == 0, again.tail()
    assert not again.lines(r"other settings"), again.tail()
    assert read_results(model_dir)["global_step"] >= MORE_STEPS
