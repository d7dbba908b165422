"""docs/errors.md lists every refusal in the code (docs/gen_errors.py writes it)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location("gen_errors", REPO / "docs" / "gen_errors.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_errors_table_is_current():
    gen = _generator()
    assert (REPO / "docs" / "errors.md").read_text() == gen.render(), \
        "docs/errors.md is out of date: run python docs/gen_errors.py"


def test_the_table_holds_the_new_refusals():
    rows = _generator().refusals()
    fields = {f for _, f, _ in rows}
    assert len(rows) > 150
    assert {"export_dir", "model_dir", "replicas_to_aggregate", "label_column", "gpus"} <= fields
    messages = " ".join(m for _, _, m in rows)
    for words in ("holds files that tfps did not write", "non-finite value", "is not a class number",
                  "cannot listen on port", "is too large"):
        assert words in messages, words
