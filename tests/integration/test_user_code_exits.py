"""User code cannot decide tfps's outcome (issue: a builder's ``sys.exit(0)`` made ``tfps local``
exit 0 in 4 s with nothing trained, ``sys.exit(3)`` exited 3 with no line).

Each case runs the real launcher: one line naming the code and what it did, exit 2 (bad
input, found before anything starts), no model_dir written."""

from __future__ import annotations

import pytest
from integration_helpers import run_flags

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
