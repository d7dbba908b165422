"""User code cannot decide tfps's outcome (issue: a builder's ``sys.exit(0)`` made ``tfps local``
exit 0 in 4 s with nothing trained, ``sys.exit(3)`` exited 3 with no line).

Each case runs the real launcher: one line naming the code and what it did, exit 2 (bad
input, found before anything starts), no model_dir written."""

from __future__ import annotations

import re

import pytest
from integration_helpers import read_results, run_flags

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("model, said", [
    ("exit_model_fn", "the model function tests.fixtures.exiting_models:exit_model_fn called sys.exit(3)"),
    ("os_exit_builder", "the model builder tests.fixtures.exiting_models:os_exit_builder called os._exit(0)"),
    ("interrupt_builder", "raised KeyboardInterrupt (no Ctrl-C was pressed)"),
])
def test_model_code_that_ends_the_process_is_one_line_and_exit_2(procs, tmp_path, model, said):
    proc = procs.tfps(f"tfps-local-{model}", "local",
                      *run_flags(tmp_path / "model", "--model", f"tests.fixtures.exiting_models:{model}"),
                      separate_stderr=True)
    assert proc.wait(180) == 2, proc.tail()
    err = [line for line in proc.stderr().splitlines() if line.strip() and " I tfps local: building" not in line]
    assert len(err) == 1 and err[0].startswith("tfps: error: model: ") and said in err[0], err
    assert not (tmp_path / "model" / "results.json").exists()


def test_sys_exit_in_eval_mode_fails_the_evaluation_and_keeps_the_complete_export(procs, tmp_path):
    """The pre-check builds the training graph only, so the job trains and exports; then the
    final evaluation's model_fn calls sys.exit. The log, results.json and the summary agree:
    the evaluation failed, the export is complete (issue 51: "final export failed" was logged
    next to a summary that said the export was complete). 1 ps + 1 worker, 20 steps."""
    model_dir = tmp_path / "model"
    proc = procs.tfps("tfps-local-exit-in-eval", "local", "--workers", 1,
                      *run_flags(model_dir, "--model", "tests.fixtures.exiting_models:exit_in_eval_model_fn",
                                 steps=20))
    assert proc.wait(300) == 1, proc.tail()                 # ExitCode.TRAINING_FAILED
    out = proc.output()
    assert "final export failed" not in out, proc.tail()
    res = read_results(model_dir)
    assert res["status"] == "failed" and res["error"]["type"] == "EvaluationFailed", res.get("error")
    message = res["error"]["message"]
    assert message.startswith("the final evaluation of step 20 failed, the SavedModel export is complete: "), message
    assert "exit_in_eval_model_fn called sys.exit(4)" in message, message
    assert res["export_complete"] is True and res["export_dir"], res
    assert re.search(r"^  export +\S+ \(complete\)$", out, re.M), proc.tail()
