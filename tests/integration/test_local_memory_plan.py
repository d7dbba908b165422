"""Memory you can plan, through the real command line: `tfps local` says what each ps task will
hold before any task starts (what the chief then records: checked on a job of
tests/integration/test_ctr.py), and refuses a table this host cannot hold with one line, exit 2
and nothing started."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from integration_helpers import (
    REPO,
    base_env,
    pids_with_cmdline,
    refusal_lines,
)

pytestmark = pytest.mark.integration

ESTIMATE = re.compile(r"tfps local: variables per ps task \(MB, the optimizer's slots included\): (.*?) "
                      r"\(estimated from the model's shapes\)")


def _shares(text: str) -> dict[str, float]:
    return {name: float(mb) for name, mb in (part.split() for part in text.split(", "))}


def assert_the_estimate_is_what_the_chief_records(launcher, res: dict) -> None:
    """The launcher of ``tfps local --ps 2 --workers 1`` with tests.fixtures.ctr_models and
    ``--partition_mb 1`` said what each ps task will hold before it started any task, and that
    is what the chief recorded (results.json's ps_shares_mb): the table (4 MiB) and Adam's two
    slots, split over both ps. Checked on the resumed job of tests/integration/test_ctr.py."""
    out = launcher.output()
    found = ESTIMATE.search(out)
    assert found, launcher.tail()
    assert found.start() < out.index("tfps local: 2 ps + 1 worker(s)"), "said after the tasks started"
    estimated = _shares(found.group(1))
    recorded = res["ps_shares_mb"]
    assert set(estimated) == set(recorded) == {"ps0", "ps1"}
    for name, mb in recorded.items():
        assert estimated[name] == pytest.approx(mb, rel=0.03), (estimated, recorded)
    assert all(5.5 < mb < 6.5 for mb in recorded.values()), recorded


def test_a_table_no_host_can_hold_is_refused_before_anything_starts(tmp_path, demo_dir):
    with open("/proc/meminfo") as fh:
        mem_total = int(next(line for line in fh if line.startswith("MemTotal:")).split()[1]) * 1024
    # examples/ctr_model.py's table of twice this host's memory (16 float32 per row): shapes
    # only, never allocated (the Keras model is built in a throwaway graph first).
    buckets = (2 * mem_total // 64) // 3 * 3
    model_dir = tmp_path / "model"
    p = subprocess.run([sys.executable, "-m", "tfps", "local", "--ps", "2", "--workers", "1",
                        "--model", "examples.ctr_model:build_model", "--model_arg", f"buckets={buckets}",
                        "--train_data", str(demo_dir / "ctr" / "train-*.csv"), "--model_dir", str(model_dir)],
                       env=base_env(PYTHONPATH=str(REPO), TF_ENABLE_ONEDNN_OPTS="1"), cwd=str(tmp_path), capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = refusal_lines(p.stderr)
    assert len(lines) == 1, p.stderr
    line = lines[0]
    assert line.startswith("tfps: error: memory: the variables need "), line
    assert f"which has {mem_total / 2**30:.1f} GiB (MemTotal" in line
    shares = re.search(r"the ps tasks hold (ps0 \d+, ps1 \d+) MB", line)
    assert shares, line
    table_mb = buckets * 16 * 4 / 2**20
    for mb in _shares(shares.group(1)).values():    # half the table and half of Adam's two slots
        assert mb == pytest.approx(table_mb * 3 / 2, rel=0.01), line
    assert "make the largest variable (table/embeddings, " in line
    assert p.stdout == ""
    assert not model_dir.exists() and not (tmp_path / "runs").exists()
    assert pids_with_cmdline(str(model_dir)) == []
