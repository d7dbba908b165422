"""Versions while the job trains (``--export_every``): TF Serving's layout, each version whole.

One small job (1 ps + 1 worker, the MLP paced at 30 ms a step so that it trains for about
20 s) exports a version every 2 s and keeps the newest 5. A reader thread lists the base
path every few milliseconds, as TF Serving polls it, and checks every integer directory it
sees for the whole set of files (``saved_model.pb``, ``variables/`` index and data, the
metadata ``tfps_export.json``): none may ever be seen without them. Afterwards each version
left loads in TensorFlow alone and scores the evaluation data. Cost: one tfps local job of
about 30-40 s on 2 cores.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from integration_helpers import base_env, launcher_ports, load_and_predict, load_csv, read_results, run_flags

pytestmark = pytest.mark.integration

PACED_MODEL = "tests.fixtures.paced_model:model_fn"
STEPS = 600
KEEP = 5


class Reader(threading.Thread):
    """Polls a base path as TF Serving does; records what it saw, and any half version."""

    def __init__(self, base: Path):
        super().__init__(daemon=True)
        self.base, self.stop = base, threading.Event()
        self.first_seen: dict[int, float] = {}   # version -> time.monotonic() when first listed
        self.half: list[str] = []                # integer directories listed without their files
        self.listings = 0

    def complete(self, path: Path) -> bool:
        variables = path / "variables"
        names = set(os.listdir(variables)) if variables.is_dir() else set()
        return ((path / "saved_model.pb").is_file() and (path / "tfps_export.json").is_file()
                and "variables.index" in names and any(n.startswith("variables.data-") for n in names))

    def run(self):
        while not self.stop.is_set():
            try:
                names = os.listdir(self.base)
            except FileNotFoundError:
                names = []
            self.listings += 1
            for name in names:
                if not name.isdigit():
                    continue
                path = self.base / name
                try:
                    whole = self.complete(path)
                except FileNotFoundError:
                    whole = False
                if not whole and path.exists():   # a version removed (--keep_exports) meanwhile is not half
                    self.half.append(f"{name}: {sorted(os.listdir(path)) if path.is_dir() else 'not a directory'}")
                self.first_seen.setdefault(int(name), time.monotonic())
            time.sleep(0.005)


def test_versions_appear_whole_while_the_job_trains(procs, tmp_path, demo_dir):
    model_dir, base = tmp_path / "model", tmp_path / "serving" / "demo"
    reader = Reader(base)
    reader.start()
    launcher = procs.tfps("tfps-local-versions", "local", "--ps", 1, "--workers", 1,
                          *run_flags(model_dir, "--model", PACED_MODEL, "--export_dir", base,
                                     "--export_every", "2s", "--keep_exports", KEEP, steps=STEPS),
                          env=base_env(TFPS_TEST_STEP_SECS="0.03"))
    launcher_ports(launcher)
    rc = launcher.wait(300)
    ended = time.monotonic()
    reader.stop.set()
    reader.join(5)
    assert rc == 0, launcher.tail()
    assert reader.listings > 100
    assert not reader.half, reader.half[:5]

    # Several versions, numbered by their increasing global steps, came out before the job ended.
    seen = sorted(reader.first_seen)
    assert len(seen) >= 4, (seen, launcher.tail())
    during = [v for v in seen if reader.first_seen[v] < ended - 1.0]
    assert len(during) >= 3, (seen, {v: ended - t for v, t in reader.first_seen.items()})
    left = sorted(int(n) for n in os.listdir(base) if n.isdigit())
    assert left == seen[-KEEP:], (left, seen)   # --keep_exports: the newest K stay
    assert not [n for n in os.listdir(base) if not n.isdigit()]   # no temporary left behind

    # Each version left holds its metadata, and loads and scores in TensorFlow alone.
    from tfps.models import demo
    x, y = load_csv(demo.demo_globs("mlp", str(demo_dir))[1])
    steps, progressive = [], []
    for v in left:
        meta = json.loads((base / str(v) / "tfps_export.json").read_text())
        assert meta["version"] == v and meta["global_step"] <= v, meta
        assert {"position", "progressive_auc", "exported_at", "checkpoint"} <= set(meta), meta
        steps.append(meta["global_step"])
        progressive.append(meta["progressive"])
        out = load_and_predict(base / str(v), x)
        assert out["probabilities"].shape == (len(x), 3)
        assert np.isfinite(out["probabilities"]).all()
    assert steps == sorted(steps) and len(set(steps)) == len(steps), steps
    assert steps[0] < STEPS, steps   # exported while it trained, not only at the end
    # The job's progressive validation at each export (the demo MLP has 3 classes: log loss, no AUC).
    late = progressive[-1]
    assert late and late["examples"] > 0 and 0 < late["log_loss"] < 5 and late.get("auc") is None, progressive

    # The final export is the last version: results.json names it, complete.
    res = read_results(model_dir)
    assert res["status"] == "succeeded" and res["export_complete"] is True, res.get("error")
    assert Path(res["export_dir"]) == base / str(left[-1]), res["export_dir"]
    assert steps[-1] == res["global_step"], (steps, res["global_step"])
    out = load_and_predict(res["export_dir"], x)
    assert (out["classes"] == y).mean() > 0.5
