"""Section delta: delta checkpoints against full ones (issue 49 item 3), side by side in one run.

Each round runs bench/delta_job.py in a process of its own: a dynamic table of ROWS live
rows on 2 ps (TF servers in that process), about 1 % of its rows trained between two saves;
one full checkpoint, then deltas. Reported: a delta's bytes, save time and training pause
against the full checkpoint's (targets: at most 5 %, 10 %, 10 %), and the restore of the
full checkpoint alone against full + the deltas (tfps.task.output.delta.consolidate, then the
restore). The first delta of a chain also carries the live key sets (8 bytes a row): it is
reported beside the others.
"""

from __future__ import annotations

import json
import os

from procs import PY, ROOT, sh
from results import figures, info

ROWS, QUICK_ROWS = 2_000_000, 200_000
DELTAS = 3


def run_job(rows: int, deadline: float) -> dict:
    p = sh([PY, os.path.join(ROOT, "bench", "delta_job.py"), "--rows", str(rows), "--deltas", str(DELTAS)],
           timeout=1800, deadline=deadline)
    if p.returncode != 0:
        raise RuntimeError(f"bench/delta_job.py --rows {rows} failed ({p.returncode})\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def bench_delta(ctx) -> None:
    from sec_basic import measure
    rows = QUICK_ROWS if ctx.quick else ROWS
    ctx.info({"rows": rows, "deltas": DELTAS})
    for _ in range(ctx.repeat):
        measure(ctx, "delta", "delta/full", lambda: run_job(rows, ctx.deadline), lambda r: (r["bytes_ratio"], r))


def delta_rows(records: list[dict]) -> list[tuple]:
    """Bytes, save time, pause, restore: the delta's median against the full checkpoint's."""
    f = figures(records, "delta").get(("delta", "delta/full"))
    runs = f.data() if f else []
    if not runs:
        return [("delta checkpoints", "not measured", "", "", "")]
    n = info(records, "delta").get("rows", runs[0].get("rows"))

    def med(key):
        values = sorted(r[key] for r in runs)
        return values[len(values) // 2]

    def pair(key_delta, key_full, fmt, target):
        d, full = med(key_delta), med(key_full)
        return (fmt.format(d), fmt.format(full), f"{d / full:.3f}" if full else "n/a", target)

    k = f"{len(runs)} run(s)"
    return [
        (f"delta bytes ({n} live rows, dim {runs[0]['dim']}, {med('delta_rows')} rows in a delta; {k})",
         *pair("delta_bytes", "full_bytes", "{:.0f}", "<= 0.05")),
        ("first delta of a chain (with the live key sets), bytes", *pair("first_delta_bytes", "full_bytes",
                                                                          "{:.0f}", "-")),
        ("save time (s): delta vs full", *pair("delta_save_s", "full_save_s", "{:.2f}", "<= 0.10")),
        ("training pause (s): delta vs full", *pair("delta_pause_s", "full_pause_s", "{:.2f}", "<= 0.10")),
        (f"restore (s): full + {runs[0]['deltas']} deltas vs full only", *pair("restore_deltas_s", "restore_full_s",
                                                                               "{:.1f}", "-")),
    ]
