"""What the data pre-check holds in memory while it scans many CSV rows, side by side.

Every task of a job (and ``tfps local`` before it starts any) scans its training files
before it trains (``tfps.data.dataset.infer_schema``): up to ``CSV_SCAN_ROWS`` rows a file, each
file's labels and the line of each kept for the messages that name a bad label. This
writes the dynamic bench's stream of churning users (bench/ctr_stream.py, 200 files) and
runs the scan in a fresh process twice, alternating: once timed, once under tracemalloc
(which sees Python's and NumPy's allocations), and prints the scan's peak memory per
scanned row. Target: at most 48 bytes a row (a float64 label and an int64 line are 16,
the labels' concatenation at the end 8 more). Until 2026-12-07 each label's place was a
tuple of strings: 185 bytes a row measured here at scale 0.2 (411 MiB for 2.3 M rows),
about 2 GB at the stream's full scale (11.6 M rows), in every worker and in ``tfps local``
before it; now 35 bytes (77 MiB).

    python bench/data_scan.py [--scale 0.2] [--repeat 3]
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
sys.path.insert(0, ROOT)
TARGET_BYTES_PER_ROW = 48

SCAN = """
import json, sys, time, tracemalloc
from tfps.data import dataset as data
traced = sys.argv[2] == "traced"
if traced:
    tracemalloc.start()
t = time.perf_counter()
s = data.infer_schema(sys.argv[1], "label")
print(json.dumps({"peak": tracemalloc.get_traced_memory()[1] if traced else None,
                  "seconds": time.perf_counter() - t, "rows": s.num_examples}))
"""


def run(pattern: str, traced: bool) -> dict:
    p = subprocess.run([sys.executable, "-c", SCAN, pattern, "traced" if traced else "timed"], capture_output=True,
                       text=True, timeout=3600, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
    if p.returncode != 0:
        raise SystemExit(f"the scan failed ({p.returncode}): {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=0.2, help="the stream's size (1: 11.6 M rows)")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from ctr_stream import generate
    with tempfile.TemporaryDirectory(prefix="tfps-bench-scan-") as d:
        stream = generate(d, a.scale)
        timed, traced = [], []
        for _ in range(a.repeat):
            timed.append(run(stream["train_glob"], False))
            traced.append(run(stream["train_glob"], True))
    rows = timed[0]["rows"]
    peak = statistics.median(t["peak"] for t in traced)
    seconds = statistics.median(t["seconds"] for t in timed)
    per_row = peak / max(rows, 1)
    print(f"data pre-check, the dynamic bench's stream at scale {a.scale:g}: {rows:,} rows in "
          f"{stream['files']} files, {a.repeat} run(s) of each kind")
    print(f"  scan: {seconds:.1f} s ({1e6 * seconds / max(rows, 1):.2f} s a million rows); "
          f"peak memory it allocated: {peak / 2**20:,.0f} MiB")
    print(f"  {per_row:.1f} bytes a scanned row (target <= {TARGET_BYTES_PER_ROW}): "
          f"{'PASS' if per_row <= TARGET_BYTES_PER_ROW else 'FAIL'}")


if __name__ == "__main__":
    main()
