"""Section export: the cost of --export_every (issue 49), the chief's examples/s with versions
exported while it trains against the same job without, side by side in one run.

Each round runs the same ``tfps local`` job (1 ps + 1 worker: the chief is the only worker,
so its examples/s is the job's) twice, without and with ``--export_every``; the order
alternates between rounds, so a load that drifts hurts both sides alike. The chief's
examples/s comes from results.json (``workers.worker0``); each run records the versions it
left. The report gives each side's median and the ratio (target: at least 0.9x).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

from procs import PY, sh
from results import figures, info, ratio
from sec_basic import measure

#: (figure, model flags, steps, --export_every); --quick runs the first one, shorter.
JOBS = (("mlp-every-3s", ("--model", "mlp"), 15000, "3s"),
        ("wide_deep-every-5s", ("--model", "wide_deep"), 6000, "5s"),
        ("wide_deep-every-60s", ("--model", "wide_deep"), 6000, "60s"))
QUICK_STEPS = 6000
#: The sides of a figure: with versions, and the same job without.
WITH, WITHOUT = "versions", "none"


def run_job(model: tuple, steps: int, every: str | None, deadline: float) -> dict:
    """One ``tfps local`` job: the chief's examples/s and the versions it left."""
    d = tempfile.mkdtemp(prefix="tfps-bench-export-")
    try:
        argv = [PY, "-m", "tfps", "local", "--ps", "1", "--workers", "1", "--model_dir", d, "--train_steps",
                str(steps), "--tf_threads", "1", "--log_steps", "500", *model,
                *(["--export_every", every] if every else [])]
        p = sh(argv, timeout=1800, deadline=deadline)
        if p.returncode != 0:
            raise RuntimeError(f"tfps local ({' '.join(model)}, --export_every {every}) failed ({p.returncode})\n"
                               f"{p.stderr[-3000:]}")
        with open(os.path.join(d, "results.json")) as fh:
            res = json.load(fh)
        export = os.path.join(d, "export")
        versions = len([n for n in os.listdir(export) if n.isdigit()]) if os.path.isdir(export) else 0
        return {"examples_s": float(res["workers"]["worker0"]["examples_per_sec"]), "versions": versions,
                "global_step": res["global_step"]}
    finally:
        shutil.rmtree(d, ignore_errors=True)


def bench_export(ctx) -> None:
    """``repeat`` rounds of each job, without and with versions, the order alternating."""
    jobs = [(JOBS[0][0], JOBS[0][1], QUICK_STEPS, JOBS[0][3])] if ctx.quick else list(JOBS)
    ctx.info({"jobs": {name: {"model": " ".join(model), "steps": steps, "every": every}
                       for name, model, steps, every in jobs}})
    for name, model, steps, every in jobs:
        for r in range(ctx.repeat):
            for exporting in ((False, True) if r % 2 == 0 else (True, False)):
                measure(ctx, name, WITH if exporting else WITHOUT,
                        lambda e=exporting: run_job(model, steps, every if e else None, ctx.deadline),
                        lambda res: (res["examples_s"], res))


def export_rows(records: list[dict]) -> list[tuple]:
    """One row per job: the chief's examples/s with versions, without, their ratio."""
    jobs = info(records, "export").get("jobs", {})
    fs = figures(records, "export")
    rows = []
    for name in dict.fromkeys(fig for fig, _ in fs):
        on, off = fs.get((name, WITH)), fs.get((name, WITHOUT))
        job = jobs.get(name, {})
        counts = sorted({d.get("versions") for d in on.data()} - {None}) if on else []
        what = (f"chief examples/s, {job.get('model', name)}, {job.get('steps', '?')} steps, a version every "
                f"{job.get('every', '?')} ({'-'.join(map(str, counts[::max(len(counts) - 1, 1)])) or '?'} per job)")
        rows.append((what, _cell(on), _cell(off), ratio(on, off, names=("with", "without")), ">= 0.9x"))
    return rows


def _cell(f) -> str:
    from report import _cell as cell
    return cell(f, "{:.0f}")
