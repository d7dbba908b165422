"""Sections backup (a frozen sync worker), final_save, image and deploy."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import tempfile
import time

from procs import ENV, PY, ROOT, OutOfTime, Watched, end, sh, task_pids
from sec_basic import FIRST_RE, measure, run_tfps

from tfps.outcome.contract import JobResult

#: The official tensorflow/tensorflow:latest (CPU) image size (Docker Hub, 2.x, uncompressed
#: as `docker images` shows it); see tensorflow/tensorflow PR #59682: 2.07 GB -> 1.76 GB.
OFFICIAL_CPU_IMAGE_GB = 1.76
#: The slowed-worker bench: one of 3 sync workers frozen (SIGSTOP) this long.
FREEZE_SECS = 20
#: Every task's step sleeps this long (tests/fixtures/paced_model.py): the job's pace does not
#: depend on how the 2 cores are shared, so a frozen worker does not speed the others up.
PACED_STEP_SECS = 0.02
PACED_MODEL = "tests.fixtures.paced_model:model_fn"
CHIEF_PROGRESS_RE = re.compile(r"^\[worker0\] .*worker0: step (\d+)/\d+ ")


def step_at(points: list[tuple[float, int]], t: float) -> float:
    """The global step at time ``t``, interpolated between the chief's progress lines."""
    before = [p for p in points if p[0] <= t]
    after = [p for p in points if p[0] >= t]
    if not before or not after:
        raise RuntimeError(f"no progress line around {t:.1f} (lines from {points[0][0]:.1f} to {points[-1][0]:.1f})")
    (t0, s0), (t1, s1) = before[-1], after[0]
    return float(s0) if t1 == t0 else s0 + (s1 - s0) * (t - t0) / (t1 - t0)


def local_result(p: Watched, d: str, timeout: float, what: str, deadline: float) -> JobResult:
    """Wait for a ``tfps local`` run in model_dir ``d``, refuse a failed one, read its results.json."""
    out = p.wait(timeout, deadline)
    if p.popen.returncode != 0:
        raise RuntimeError(f"tfps local ({what}) failed ({p.popen.returncode}):\n{out[-3000:]}")
    return JobResult.load(os.path.join(d, "results.json"))


def run_frozen_worker(backup: int, steps: int, deadline: float) -> dict:
    """``tfps local --ps 1 --workers 3 --sync_replicas [--backup_workers 1]`` on the paced MLP;
    worker2 is frozen (SIGSTOP) for FREEZE_SECS once the job has trained FREEZE_SECS at full
    pace. Returns the global steps the job made in the freeze and in as long a window just
    before it (from the chief's progress lines, as they arrive), and the job's examples/s."""
    d = tempfile.mkdtemp(prefix="tfps-bench-backup-")
    argv = [PY, "-m", "tfps", "local", "--ps", "1", "--workers", "3", "--model", PACED_MODEL, "--sync_replicas",
            *(["--backup_workers", str(backup)] if backup else []), "--train_steps", str(steps),
            "--batch_size", "64", "--model_dir", d, "--log_steps", "10"]
    p = Watched(argv, FIRST_RE, time.time(), env={**ENV, "TFPS_TEST_STEP_SECS": str(PACED_STEP_SECS)})
    try:
        while p.popen.poll() is None:
            if time.time() > deadline:
                raise OutOfTime("the section's budget ran out during the run")
            points = [(t, int(m.group(1))) for t, line in zip(list(p.arrived), list(p.lines))
                      if (m := CHIEF_PROGRESS_RE.search(line))]
            if points and points[-1][1] > 0 and time.time() - points[0][0] > FREEZE_SECS + 5:
                break
            time.sleep(0.2)
        pid = task_pids(p.popen.pid).get("worker2")
        if pid is None or p.popen.poll() is not None:
            raise RuntimeError(f"the job ended or worker2 was not found before the freeze:\n{p.text()[-3000:]}")
        os.kill(pid, signal.SIGSTOP)
        frozen_at = time.time()
        time.sleep(FREEZE_SECS)
        os.kill(pid, signal.SIGCONT)
        res = local_result(p, d, 900, f"frozen worker, backup {backup}", deadline)
    finally:
        end(p.popen)
        shutil.rmtree(d, ignore_errors=True)
    points = [(t, int(m.group(1))) for t, line in zip(p.arrived, p.lines) if (m := CHIEF_PROGRESS_RE.search(line))]
    before = step_at(points, frozen_at) - step_at(points, frozen_at - FREEZE_SECS)
    during = step_at(points, frozen_at + FREEZE_SECS) - step_at(points, frozen_at)
    per_step = 3 - backup   # gradients (batches) aggregated per global step
    return {"steps_before": round(before, 1), "steps_frozen": round(during, 1),
            "kept": during / before if before > 0 else float("nan"), "global_step": res.global_step,
            "examples_s": res.global_step * 64 * per_step / res.times.training_s,
            "dropped_gradients": {k: w.extra.get("dropped_gradients") for k, w in res.workers.items()}}


def bench_backup(ctx) -> None:
    """One of 3 sync workers frozen for FREEZE_SECS, with and without one backup worker:
    the share of its steps the job still makes in the freeze, alternating, ``repeat`` times."""
    steps = 2500 if ctx.quick else 4000
    ctx.info({"freeze_s": FREEZE_SECS, "paced_step_s": PACED_STEP_SECS, "steps": steps})
    for _ in range(ctx.repeat):
        for backup in (1, 0):
            measure(ctx, f"backup_{backup}", "tfps", lambda: run_frozen_worker(backup, steps, ctx.deadline),
                    lambda r: (1 - r["kept"], r))


def bench_final_save(ctx) -> None:
    # an 8 -> H -> H -> 3 MLP holds about H*H float32 variables: 5000 -> 100 MB, 15800 -> 1 GB
    sizes = (("100MB", "5000,5000"), ("1GB", "15800,15800")) if not ctx.quick else (("100MB", "5000,5000"),)
    for label, hidden in sizes:
        def one(r):
            res = r["results"]
            return r["final_save_s"], {"complete": res.status == "succeeded" and bool(res.export_complete)}
        measure(ctx, label, "tfps", lambda: run_tfps(4, 8, "mlp", deadline=ctx.deadline, extra=(
            "--hidden_units", hidden, "--optimizer", "sgd", "--checkpoint_steps", "1000")), one)


def bench_image(ctx) -> None:
    p = sh(["docker", "image", "inspect", ctx.image, "--format", "{{.Size}}"], deadline=ctx.deadline)
    if p.returncode != 0:
        ctx.out.run(ctx.section, "size_gb", ctx.image, "failed", why=f"no image {ctx.image}")
        return
    ctx.out.run(ctx.section, "size_gb", "tfps", "ok", int(p.stdout.strip()) / 1e9, {"image": ctx.image})


def bench_deploy(ctx) -> None:
    script = os.path.join(ROOT, "bench", "deploy_bench.py")
    p = sh([PY, script], timeout=3600, deadline=ctx.deadline)
    try:
        r = json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        ctx.out.run(ctx.section, "first_s", "tfps", "failed", why=(p.stderr or p.stdout)[-500:])
        return
    ctx.out.run(ctx.section, "first_s", "tfps", "ok", r["first_s"])
    ctx.out.run(ctx.section, "second_s", "tfps", "ok", r["second_s"], {"changed": r["changed"]})
