"""Section dlrm: a Criteo-shaped DLRM (bench/dlrm.py) with hashed and dynamic tables, tfps
against one process's model.fit and TF2 ParameterServerStrategy. Each run is recorded as it
ends; ``dlrm_rows`` makes the table from the runs that completed.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time

from procs import ENV, PY, ROOT, sh
from results import median, spread
from sec_basic import measure
from sec_ctr import watch_local_steady

#: The "dlrm" bench: a Criteo-shaped DLRM (bench/dlrm.py) with hashed and dynamic tables.
#: 1 ps + 2 workers on this machine's 2 cores: one worker would leave a core idle while it
#: waits for its variables and gradients to cross gRPC (a step is pull, compute, push); two
#: overlap one's compute with the other's transfers and the ps's updates. TF2 PSS gets the
#: same tasks.
DLRM_WORKERS = 2
DLRM_MODEL = "bench.dlrm:build_model"
DLRM_ROWS, DLRM_ROWS_QUICK = 200_000, 40_000
DLRM_STEPS, DLRM_STEPS_QUICK = 500, 150
#: DeepRec modelzoo's published DLRM figures (8 vCPUs): examples/s per vCPU.
DLRM_ANCHORS = {"stock TF 1.15": 4300, "DeepRec": 7400}


def vcpus() -> int:
    """The CPU cores a run here may use (this process's affinity)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def run_tfps_dlrm(kind: str, info: dict, steps: int, deadline: float = float("inf")) -> dict:
    """``tfps local --ps 1 --workers 2`` of bench/dlrm.py's model (``kind``: hashed or dynamic):
    examples/s in the steady state (progress lines past 20 % of the steps, after the chief's
    first checkpoint, as run_tfps_ctr), every task's CPU seconds in that window, and the
    chief's evaluation of the held-out rows (AUC)."""
    from dlrm import BATCH
    d = tempfile.mkdtemp(prefix="tfps-bench-dlrm-")
    capacity = int(1.5 * info["distinct_ids_train"])
    argv = [PY, "-m", "tfps", "local", "--ps", "1", "--workers", str(DLRM_WORKERS), "--model", DLRM_MODEL,
            "--model_arg", f"table={kind}", *(["--model_arg", f"capacity={capacity}"] if kind == "dynamic" else []),
            "--train_data", info["train_glob"], "--eval_data", info["eval_csv"], "--train_steps", str(steps),
            "--batch_size", str(BATCH), "--model_dir", d, "--log_steps", str(max(10, steps // 25)),
            "--checkpoint_steps", str(steps * 10)]
    w = watch_local_steady(argv, d, 1 + DLRM_WORKERS, steps, f"dlrm, {kind}", 300, deadline)
    res, cpu = w["res"], w["cpu"]
    (t0, s0), (t1, s1) = (w["t0"], w["s0"]), (w["t1"], w["s1"])
    examples = (s1 - s0) * BATCH
    return {"examples_s": examples / (t1 - t0), "window_steps": [s0, s1], "window_s": round(t1 - t0, 2),
            "cpu_s": cpu, "examples_per_cpu_s": examples / max(sum(cpu.values()), 1e-9),
            "auc": (res.eval_metrics or {}).get("auc"), "times": res.to_dict()["times"]}


def run_tf2_dlrm(mode: str, info: dict, steps: int, epochs: int, steps_per_execution: int,
                 deadline: float = float("inf")) -> dict:
    """bench/dlrm.py ``single`` (model.fit in one process) or ``pss`` (ParameterServerStrategy,
    1 ps + 2 workers): examples/s over all epochs but the first, CPU seconds of every process
    in them, and the AUC of the held-out rows."""
    p = sh([PY, os.path.join(ROOT, "bench", "dlrm.py"), mode, "--train_data", info["train_glob"], "--eval_data",
            info["eval_csv"], "--steps", str(steps), "--epochs", str(epochs), "--steps_per_execution",
            str(steps_per_execution), "--ps", "1", "--workers", str(DLRM_WORKERS)],
           timeout=3600, env={**ENV, "TF_USE_LEGACY_KERAS": "1"}, deadline=deadline)
    d = re.search(r"BENCH done (\d+) ([\d.]+) ([\d.]+)", p.stdout)
    auc = re.search(r"BENCH auc ([\d.]+)", p.stdout)
    cpu = re.search(r"BENCH cpu (.*)", p.stdout)
    if p.returncode != 0 or not (d and auc and cpu):
        raise RuntimeError(f"dlrm.py {mode} failed ({p.returncode}):\n{p.stdout[-2000:]}{p.stderr[-3000:]}")
    examples, window = int(d.group(1)), float(d.group(3)) - float(d.group(2))
    cpu_s = {k: float(v) for k, v in (kv.split("=") for kv in cpu.group(1).split())}
    return {"examples_s": examples / window, "window_s": round(window, 2), "cpu_s": cpu_s,
            "examples_per_cpu_s": examples / max(sum(cpu_s.values()), 1e-9), "auc": float(auc.group(1))}


def bench_dlrm(ctx) -> None:
    """The Criteo-shaped DLRM (bench/dlrm.py): tfps hashed and dynamic, one process's model.fit
    and TF2 PSS (hashed), ``repeat`` rounds of the four in turn (same load for each). Per
    vCPU: examples/s over the cores the run could use; per CPU second: over the CPU time all
    its processes used in the measured window (what a core gives when the run has it alone)."""
    from dlrm import BATCH, generate
    steps = DLRM_STEPS_QUICK if ctx.quick else DLRM_STEPS
    epochs, spe = (3, 10) if ctx.quick else (5, 20)
    d = tempfile.mkdtemp(prefix="tfps-bench-dlrm-data-")
    t_start, dl = time.time(), ctx.deadline
    try:
        info = generate(d, DLRM_ROWS_QUICK if ctx.quick else DLRM_ROWS)
        ctx.info({"data": {k: v for k, v in info.items() if not k.endswith(("_glob", "_csv"))}, "steps": steps,
                  "batch_size": BATCH, "tf2_epochs": epochs, "tf2_steps_per_execution": spe, "vcpus": vcpus(),
                  "anchors_examples_s_per_vcpu": DLRM_ANCHORS})
        arms = (("tfps_hashed", "tfps", lambda: run_tfps_dlrm("hashed", info, steps, dl)),
                ("single", "single", lambda: run_tf2_dlrm("single", info, steps, epochs, spe, dl)),
                ("tfps_dynamic", "tfps", lambda: run_tfps_dlrm("dynamic", info, steps, dl)),
                ("pss", "pss", lambda: run_tf2_dlrm("pss", info, steps, epochs, spe, dl)))
        for _ in range(ctx.repeat):
            for name, side, run in arms:
                measure(ctx, name, side, run, lambda x: (x["examples_s"], x))
    finally:
        shutil.rmtree(d, ignore_errors=True)
        ctx.info({"bench_s": round(time.time() - t_start, 1)})


NAMES = {"tfps_hashed": f"tfps 1 ps + {DLRM_WORKERS} workers, hashed",
         "tfps_dynamic": f"tfps 1 ps + {DLRM_WORKERS} workers, dynamic (DynamicEmbedding)",
         "single": "one process, model.fit, hashed",
         "pss": f"TF2 ParameterServerStrategy 1 ps + {DLRM_WORKERS} workers, hashed"}


def dlrm_rows(info: dict, runs: dict[str, list[dict]]) -> list[tuple]:
    """The DLRM table: ``runs``: arm -> the data of its completed runs."""
    rows = []
    cores = info.get("vcpus") or vcpus()
    anchors = ", ".join(f"{k} {v / 1000:.1f}k" for k, v in DLRM_ANCHORS.items())
    for a, what in NAMES.items():
        xs = runs.get(a) or []
        if not xs:
            rows.append((f"DLRM {what}", "not measured", "", "", ""))
            continue
        eps = [x["examples_s"] for x in xs]
        rows.append((f"DLRM {what}: examples/s; per vCPU ({cores} vCPUs)",
                     f"{spread(eps, '{:.0f}')}; {spread([e / cores for e in eps], '{:.0f}')}",
                     f"{anchors} per vCPU (DeepRec modelzoo, 8 vCPUs)",
                     f"{median(eps) / cores / DLRM_ANCHORS['stock TF 1.15']:.2f}x stock TF 1.15", ""))
        rows.append((f"DLRM {what}: examples per CPU second (all processes); held-out AUC",
                     f"{spread([x['examples_per_cpu_s'] for x in xs], '{:.0f}')}; "
                     f"{spread([x['auc'] for x in xs], '{:.4f}')}", "", "",
                     f"AUC > 0.55 (learns): {'PASS' if median([x['auc'] for x in xs]) > 0.55 else 'FAIL'}"))
    split = {a: {n: round(median([x["cpu_s"].get(n, 0) / max(sum(x["cpu_s"].values()), 1e-9) for x in xs]), 3)
                 for n in xs[0]["cpu_s"]} for a, xs in runs.items() if xs}
    rows.append(("DLRM: share of the window's CPU time per process (medians)",
                 "; ".join(f"{a}: " + ", ".join(f"{n} {s:.2f}" for n, s in v.items()) for a, v in split.items()
                           if a.startswith("tfps")),
                 "; ".join(f"{a}: " + ", ".join(f"{n} {s:.2f}" for n, s in v.items()) for a, v in split.items()
                           if not a.startswith("tfps")), "", ""))
    return rows
