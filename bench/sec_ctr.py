"""Section ctr: the CTR model (examples/ctr_model.py, a 256 MiB embedding table) on the demo
CTR data: tfps async with 1 and 2 ps against TF2's ParameterServerStrategy with the same
tasks and one process's model.fit; each ps's peak RSS; a 4x larger table; Adam as compiled.
Each arm is recorded as it ends; ``ctr_rows`` makes the table from whichever arms exist.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time

from ctr_tf2 import peak_rss  # bench/: the TF2 side's VmHWM reader
from procs import ENV, PY, ROOT, OutOfTime, Watched, cpu_seconds, end, sh, task_pids
from sec_basic import FIRST_RE, measure
from sec_other import local_result

CTR_BATCH = 256
CTR_BUCKETS = 2**22                 # x 16 float32: a 256 MiB table
CTR_MODEL = "examples.ctr_model:build_model"
#: The main comparison trains with Adagrad: sparse updates in tfps and in tf_keras alike, so
#: the figures compare the parameter-server machinery. tf_keras's Adam (the example's own
#: compile()) updates the whole table every step; a row of its own shows what that costs.
CTR_OPTIMIZER = "adagrad"
#: The chief's first checkpoint of the 4x table (1 GiB, 2 GiB with Adagrad's slot) took 4-5x
#: the 256 MiB table's (2026-12-07, 2 ps, load 10-25: 40 and 54 s against 10 and 28 s).
CKPT_GROWTH = 6
#: A CTR run's steady window must hold at least this share of the 256 MiB run's steps.
CTR_MIN_WINDOW_SHARE = 0.25
PROGRESS_RE = re.compile(r"^\[worker\d+\] .*worker\d+: step (\d+)/\d+ ")


def cpu_between(samples: list[tuple[float, dict]], t0: float, t1: float) -> dict[str, float]:
    """Each task's CPU seconds from ``t0`` to ``t1``, from the samples nearest to both."""
    def near(t):
        return min(samples, key=lambda s: abs(s[0] - t))[1]
    a, b = near(t0), near(t1)
    return {n: round(b[n] - a[n], 2) for n in sorted(a) if n in b}


def steady_window(points: list[tuple[float, int]], ckpt_at: float | None, steps: int,
                  min_steps: int = 0) -> tuple[tuple[float, int], tuple[float, int]]:
    """The steady state of a run's progress lines ``(time, global step)``: from the first at
    or past 20 % of the steps, after the chief's first checkpoint was complete
    (``ckpt_at``), to the last. ValueError when it holds fewer than ``min_steps`` steps: the
    few lines after a long first checkpoint are the chief's restart at the job's end, not a
    steady state (issue 52: a 1 GiB table's checkpoint ended at step 5881 of 6000)."""
    window = [(t, step) for t, step in points if step >= 0.2 * steps and t > (ckpt_at or 0)]
    if len(window) < 2 or window[-1][0] <= window[0][0] or window[-1][1] - window[0][1] < min_steps:
        held = window[-1][1] - window[0][1] if len(window) > 1 else 0
        at = max((s for t, s in points if ckpt_at and t <= ckpt_at), default=None)
        raise ValueError(f"its steady window held {held} steps (at least {min_steps} needed): the chief's first "
                         f"checkpoint was complete at global step {at} of {steps}")
    return window[0], window[-1]


def steps_for_4x(steps: int, base: dict | None) -> int:
    """--train_steps of the 4x-rows run, so that its steady window is as long as the 256 MiB
    run's (``base``): ``steps`` plus the steps the job makes at ``base``'s pace while the chief
    writes its first checkpoint, which takes up to CKPT_GROWTH x ``base``'s; at least 3x,
    at most 10x ``steps``. Until 2026-12-07 it was 3x: on a quiet machine the 1 GiB table's
    first checkpoint (40-54 s under load) lasted nearly the whole job, and the window held
    its last lines only (0.66x, then 0.97x, of the 256 MiB run's examples/s)."""
    if not base or not base.get("first_checkpoint_s") or not base.get("examples_s"):
        return 3 * steps
    during = base["examples_s"] * CKPT_GROWTH * base["first_checkpoint_s"] / CTR_BATCH
    return int(min(10 * steps, max(3 * steps, steps + during)))


def watch_local_steady(argv: list, d: str, tasks: int, steps: int, what: str, result_timeout: float,
                       deadline: float = float("inf"), min_steps: int = 0) -> dict:
    """Run ``tfps local`` (``argv``, model_dir ``d``, ``tasks`` ps and workers) to its end,
    sampling every task's CPU seconds and each ps task's peak RSS, and find its steady state:
    the global step of the progress lines (timed as they arrive) from the first at or past
    20 % of the steps, after the chief's first checkpoint is complete, to the last. Returns
    the run (``p``, its JobResult), the window and the CPU of every task in it."""
    p = Watched(argv, FIRST_RE, time.time())
    pids: dict[str, int] = {}
    peak: dict[str, int] = {}
    samples: list[tuple[float, dict]] = []     # (time, each task's CPU seconds so far)
    ckpt_at = None                             # when the chief's first checkpoint was complete
    try:
        while p.popen.poll() is None:
            if time.time() > min(deadline, p.t0 + 3600):
                raise OutOfTime(f"{what}: still running when the section's budget ran out")
            if ckpt_at is None and os.path.exists(os.path.join(d, "checkpoint")):
                ckpt_at = time.time()
            if len(pids) < tasks:
                pids.update(task_pids(p.popen.pid))
            for name, pid in pids.items():
                if name.startswith("ps"):
                    peak[name] = max(peak.get(name, 0), peak_rss(pid))
            cpu = {name: cpu_seconds(pid) for name, pid in {"launcher": p.popen.pid, **pids}.items()}
            samples.append((time.time(), {n: c for n, c in cpu.items() if c is not None}))
            time.sleep(0.25)
        res = local_result(p, d, result_timeout, what, deadline)
        out = p.text()
    finally:
        end(p.popen)
        shutil.rmtree(d, ignore_errors=True)
    points = [(t, int(m.group(1))) for t, line in zip(p.arrived, p.lines) if (m := PROGRESS_RE.search(line))]
    try:
        (t0, s0), (t1, s1) = steady_window(points, ckpt_at, steps, min_steps)
    except ValueError as e:
        raise RuntimeError(f"tfps local ({what}): {e}\n{out[-3000:]}") from None
    return {"p": p, "res": res, "ckpt_at": ckpt_at, "peak": peak, "t0": t0, "s0": s0, "t1": t1, "s1": s1,
            "cpu": cpu_between(samples, t0, t1)}


def run_tfps_ctr(train_data: str, ps: int, steps: int, buckets: int = CTR_BUCKETS,
                 optimizer: str = CTR_OPTIMIZER, deadline: float = float("inf"), min_steps: int = 0) -> dict:
    """``tfps local --ps N --workers 2`` on the CTR model, its ps tasks' peak RSS sampled.

    examples/s is the steady state: the global step of the progress lines (timed as they
    arrive) from the first at or past 20 % of the steps to the last, as the TF2 side leaves
    out its first epoch. Start-up stays out of it, and so does the chief's first checkpoint
    (the whole table, written right after the first step: a cost per job, not per step): the
    window starts after its ``checkpoint`` file appears. Periodic checkpoints are off (the TF2
    runs write none); the final checkpoint and export follow the last step."""
    d = tempfile.mkdtemp(prefix="tfps-bench-ctr-")
    argv = [PY, "-m", "tfps", "local", "--ps", str(ps), "--workers", "2", "--model", CTR_MODEL,
            "--model_arg", f"buckets={buckets}", "--optimizer", optimizer, "--train_data", train_data,
            "--train_steps", str(steps), "--batch_size", str(CTR_BATCH), "--model_dir", d, "--log_steps", "100",
            "--checkpoint_steps", str(steps * 10)]
    w = watch_local_steady(argv, d, ps + 2, steps, f"ctr, {ps} ps", 120, deadline, min_steps)
    p, res, ckpt_at, peak, cpu = w["p"], w["res"], w["ckpt_at"], w["peak"], w["cpu"]
    (t0, s0), (t1, s1) = (w["t0"], w["s0"]), (w["t1"], w["s1"])
    return {"examples_s": (s1 - s0) * CTR_BATCH / (t1 - t0), "steps": steps, "window_steps": [s0, s1],
            "window_s": round(t1 - t0, 2),
            "cpu_s_per_1k_examples": round(sum(cpu.values()) * 1000 / ((s1 - s0) * CTR_BATCH), 4),
            "cpu_s": cpu,
            # the chief's first step -> its first checkpoint complete (s)
            "first_checkpoint_s": (round(ckpt_at - p.t0 - p.seen["worker0"], 2)
                                   if ckpt_at and "worker0" in p.seen else None),
            "examples_s_training": res.global_step * CTR_BATCH / res.times.training_s,
            "times": res.to_dict()["times"], "ps_shares_mb": res.ps_shares_mb or None,
            "ps_peak_rss_mib": {n: round(b / 2**20) for n, b in sorted(peak.items())}}


def run_tf2_ctr(mode: str, train_data: str, steps: int, ps: int = 1, buckets: int = CTR_BUCKETS,
                optimizer: str = CTR_OPTIMIZER, epochs: int = 5, steps_per_execution: int = 50,
                deadline: float = float("inf")) -> dict:
    """bench/ctr_tf2.py: ``single`` (one process, model.fit) or ``pss`` (ParameterServerStrategy)."""
    p = sh([PY, os.path.join(ROOT, "bench", "ctr_tf2.py"), mode, "--train_data", train_data, "--steps", str(steps),
            "--epochs", str(epochs), "--steps_per_execution", str(steps_per_execution), "--batch_size",
            str(CTR_BATCH), "--buckets", str(buckets), "--optimizer", optimizer, "--ps", str(ps), "--workers", "2"],
           timeout=3600, env={**ENV, "TF_USE_LEGACY_KERAS": "1"}, deadline=deadline)
    d = re.search(r"BENCH done (\d+) ([\d.]+) ([\d.]+)", p.stdout)
    if p.returncode != 0 or not d:
        raise RuntimeError(f"ctr_tf2.py {mode} failed ({p.returncode}):\n{p.stdout[-2000:]}{p.stderr[-3000:]}")
    out = {"examples_s": int(d.group(1)) / (float(d.group(3)) - float(d.group(2))),
           "window_s": round(float(d.group(3)) - float(d.group(2)), 2)}
    cpu = re.search(r"BENCH cpu (.*)", p.stdout)
    if cpu:
        out["cpu_s"] = {k: float(v) for k, v in (kv.split("=") for kv in cpu.group(1).split())}
        out["cpu_s_per_1k_examples"] = round(sum(out["cpu_s"].values()) * 1000 / int(d.group(1)), 4)
    first = re.search(r"BENCH first_epoch ([\d.]+)", p.stdout)
    out["first_epoch_s"] = float(first.group(1)) if first else None
    rss = re.search(r"BENCH ps_rss (.*)", p.stdout)
    if rss:
        out["ps_peak_rss_mib"] = {k: round(int(v) / 2**20) for k, v in (kv.split("=") for kv in rss.group(1).split())}
    return out


def verdict(ratio: float, target: float, at_most: bool = False) -> str:
    ok = ratio <= target if at_most else ratio >= target
    return f"{'<=' if at_most else '>='} {target}x: {'PASS' if ok else 'FAIL'}"




def bench_ctr(ctx) -> None:
    """Every arm once, alternating, so that each ratio compares runs made under about the
    same load; each recorded as it ends (a failed arm is recorded and the others still run)."""
    from tfps.models.demo import ensure_demo_data
    steps = 2000 if ctx.quick else 4000
    ctx.info({"steps": steps, "batch_size": CTR_BATCH, "buckets": CTR_BUCKETS, "optimizer": CTR_OPTIMIZER})
    d = tempfile.mkdtemp(prefix="tfps-bench-ctr-data-")
    dl = ctx.deadline
    try:
        train = ensure_demo_data(d)["ctr_train"]
        done: dict = {}
        least = int(CTR_MIN_WINDOW_SHARE * steps)
        arms = [("single", "single", lambda: run_tf2_ctr("single", train, steps, deadline=dl)),
                ("tfps_1ps", "tfps", lambda: run_tfps_ctr(train, 1, steps, deadline=dl, min_steps=least)),
                ("pss_1ps", "pss", lambda: run_tf2_ctr("pss", train, steps, ps=1, deadline=dl)),
                ("pss_2ps", "pss", lambda: run_tf2_ctr("pss", train, steps, ps=2, deadline=dl)),
                ("tfps_2ps", "tfps", lambda: run_tfps_ctr(train, 2, steps, deadline=dl, min_steps=least)),
                # The chief's first checkpoint of a 1 GiB table (and its Adagrad slot) takes a while:
                # more steps, so that the steady state after it is as long as in the other runs.
                ("tfps_2ps_4x_rows", "tfps", lambda: run_tfps_ctr(
                    train, 2, steps_for_4x(steps, done.get("tfps_2ps")), buckets=4 * CTR_BUCKETS, deadline=dl,
                    min_steps=least)),
                # The example as written: compiled with Adam. tfps's Adam is lazy on the table's sparse
                # gradient; tf_keras's decays both moments of every row each step (few steps suffice).
                ("adam_tfps_2ps", "tfps", lambda: run_tfps_ctr(train, 2, steps, optimizer="adam", deadline=dl)),
                ("adam_single", "single", lambda: run_tf2_ctr("single", train, 30 if ctx.quick else 60,
                                                              optimizer="adam", epochs=3, steps_per_execution=10,
                                                              deadline=dl))]
        for name, side, run in arms:
            done[name] = measure(ctx, name, side, run, lambda r: (r["examples_s"], r))
    finally:
        shutil.rmtree(d, ignore_errors=True)


def ctr_rows(r: dict) -> list[tuple]:
    """The CTR table from the arms measured (``r``: arm -> its data); a row whose arms are
    missing says so."""
    rows = []
    single = (r.get("single") or {}).get("examples_s")
    for ps in (1, 2):
        t, b = (r.get(f"tfps_{ps}ps") or {}).get("examples_s"), (r.get(f"pss_{ps}ps") or {}).get("examples_s")
        what = "1 ps" if ps == 1 else "2 ps (table split in 2)"
        vs = ", ".join(x for x in (f"{t / b:.2f}x TF2 PSS" if t and b else "",
                                   f"{t / single:.2f}x one process" if t and single else "") if x)
        tg = ", ".join(x for x in (f"{verdict(t / b, 1.5)} PSS" if t and b else "",
                                   f"{verdict(t / single, 0.5)} one process" if t and single else "") if x)
        rows.append((f"CTR {what} + 2 workers, 256 MiB table (examples/s)", _n(t), f"{_n(b)} (TF2 PSS)", vs, tg))
    rows.append(("CTR one process, model.fit (examples/s)", "", _n(single), "", ""))
    cpu = {k: v.get("cpu_s_per_1k_examples") for k, v in r.items() if isinstance(v, dict)}
    if all(cpu.get(k) for k in ("tfps_1ps", "tfps_2ps", "pss_1ps", "pss_2ps", "single")):
        rows.append(("CTR CPU s per 1000 examples, every process (1 ps / 2 ps)",
                     f"{cpu['tfps_1ps']:.3f} / {cpu['tfps_2ps']:.3f}",
                     f"{cpu['pss_1ps']:.3f} / {cpu['pss_2ps']:.3f} (TF2 PSS); {cpu['single']:.3f} (one process)",
                     f"{cpu['pss_1ps'] / cpu['tfps_1ps']:.2f}x / {cpu['pss_2ps'] / cpu['tfps_2ps']:.2f}x less than "
                     "TF2 PSS", ""))
    rss = (r.get("tfps_2ps") or {}).get("ps_peak_rss_mib") or {}
    pss_rss = (r.get("pss_2ps") or {}).get("ps_peak_rss_mib") or {}
    if len(rss) == 2 and min(rss.values()) > 0:
        skew = max(rss.values()) / min(rss.values())
        rows.append(("CTR 2 ps: peak RSS of each ps (MiB)", ", ".join(f"{k} {v}" for k, v in rss.items()),
                     ", ".join(f"{k} {v}" for k, v in pss_rss.items()) + " (TF2 PSS)",
                     f"{skew:.2f}x largest/smallest", verdict(skew, 1.3, at_most=True)))
    else:
        rows.append(("CTR 2 ps: peak RSS of each ps (MiB)", f"not measured ({rss})", "", "", "within 1.3x"))
    big, base = (r.get("tfps_2ps_4x_rows") or {}).get("examples_s"), (r.get("tfps_2ps") or {}).get("examples_s")
    rows.append(("CTR 2 ps: 4x rows, 1 GiB table (examples/s)", _n(big), f"{_n(base)} (256 MiB, tfps)",
                 f"{big / base:.2f}x" if big and base else "", verdict(big / base, 0.8) if big and base else ""))
    a_t, a_s = (r.get("adam_tfps_2ps") or {}).get("examples_s"), (r.get("adam_single") or {}).get("examples_s")
    rows.append(("CTR 2 ps, Adam as compiled (examples/s)", _n(a_t), f"{_n(a_s)} (one process)",
                 f"{a_t / a_s:.1f}x one process" if a_t and a_s else "", ""))
    return rows


def _n(x) -> str:
    return f"{x:.0f}" if isinstance(x, (int, float)) else "not measured"
