"""What the NaN/infinity check costs the input pipeline, measured side by side.

``tfps.data.dataset`` checks every value it reads for NaN and infinity (``_finite``): once per
batch of 1024 lines for CSV, before the cache, so later epochs pay nothing. This reads the
demo CSV through the training pipeline of one worker with the check and without it
(``_finite`` replaced by the identity), alternating runs, and prints examples/s of each
and their ratio. Target: the check costs less than 3 % (ratio >= 0.97).

    python bench/input_check.py [--batches 3000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def examples_per_sec(checked: bool, batches: int, batch_size: int) -> float:
    from tfps.data import dataset as data
    from tfps.models import demo
    original = data._finite
    if not checked:
        data._finite = lambda t, files: t
    try:
        paths = demo.ensure_demo_data()
        schema = data.infer_schema(paths["blobs_train"])
        ds = data.make_dataset(schema, "label", batch_size, train=True)
        it = iter(ds)
        next(it)
        t0 = time.perf_counter()
        for _ in range(batches):
            next(it)
        return batches * batch_size / (time.perf_counter() - t0)
    finally:
        data._finite = original


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=3000)
    ap.add_argument("--batch_size", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    runs = {True: [], False: []}
    for _ in range(a.repeat):
        for checked in (False, True):
            runs[checked].append(examples_per_sec(checked, a.batches, a.batch_size))
    on, off = statistics.median(runs[True]), statistics.median(runs[False])
    print(f"input pipeline, demo CSV, batch {a.batch_size}, {a.batches} batches x {a.repeat} alternating runs")
    print(f"  without the check: {off:,.0f} examples/s (runs {', '.join(f'{r:,.0f}' for r in runs[False])})")
    print(f"  with the check:    {on:,.0f} examples/s (runs {', '.join(f'{r:,.0f}' for r in runs[True])})")
    print(f"  ratio {on / off:.3f} (target >= 0.97)")


if __name__ == "__main__":
    main()
