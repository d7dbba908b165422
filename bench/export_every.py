"""The cost of --export_every: the chief's examples/s with versions exported while it trains,
against the same job without, side by side in one run.

    .venv/bin/python bench/export_every.py [--every 3s] [--rounds 2] [--steps 15000] [--model wide_deep ...]

Each round runs the same tfps local job (1 ps + 1 worker: the chief is the only worker, so its
examples/s is the job's) twice, without and with ``--export_every`` (the order alternates
between rounds, so a load that drifts hurts both sides alike), and reads the chief's
examples/s from results.json (``workers.worker0``). It prints each pair, the versions each
job wrote, and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(work: str, name: str, steps: int, extra: list[str]) -> tuple[float, int]:
    """One job: (the chief's examples/s, the versions it left)."""
    model_dir = os.path.join(work, name)
    cmd = [sys.executable, "-m", "tfps", "local", "--ps", "1", "--workers", "1", "--model_dir", model_dir,
           "--train_steps", str(steps), "--tf_threads", "1", "--log_steps", "500", *extra]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=900)
    with open(os.path.join(model_dir, "results.json")) as fh:
        res = json.load(fh)
    export = os.path.join(model_dir, "export")
    versions = len([n for n in os.listdir(export) if n.isdigit()]) if os.path.isdir(export) else 0
    return float(res["workers"]["worker0"]["examples_per_sec"]), versions


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--every", default="3s")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=15000)
    p.add_argument("--model", default="mlp", help="e.g. wide_deep (its id tables: a larger export)")
    a, job_flags = p.parse_known_args()   # any other flag goes to every job (--hash_buckets 262144)
    job_flags = ["--model", a.model, *job_flags]
    without, with_ = [], []
    with tempfile.TemporaryDirectory(prefix="tfps-bench-export-") as work:
        for r in range(a.rounds):
            order = [False, True] if r % 2 == 0 else [True, False]
            for exporting in order:
                extra = job_flags + (["--export_every", a.every] if exporting else [])
                rate, versions = run(work, f"r{r}-{'on' if exporting else 'off'}", a.steps, extra)
                (with_ if exporting else without).append(rate)
                print(f"round {r + 1}: {'--export_every ' + a.every if exporting else 'no versions':<22} "
                      f"{rate:8.0f} examples/s, {versions} version(s)", flush=True)
    ratio = statistics.median(with_) / statistics.median(without)
    print(f"chief examples/s with a version every {a.every} / without: {ratio:.3f} "
          f"(medians {statistics.median(with_):.0f} / {statistics.median(without):.0f}, {a.rounds} round(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
