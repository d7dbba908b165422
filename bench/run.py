"""tfps benchmarks: every figure measured side by side in one run, reported as ratios.

    .venv/bin/python bench/run.py [--quick] [--skip deploy,image,final_save,ctr]

1. start-up: launch -> every worker past its first step, tfps local vs the classic script
2. throughput: examples/s, async and sync, MLP and CNN: tfps vs classic feed_dict loop vs
   one process (the ceiling on one machine)
2b. backup: a sync job of 3 workers with one frozen (SIGSTOP) for 20 s, with and without
   --backup_workers 1: the steps the job still makes in the freeze
3. final save: checkpoint + export of ~100 MB and ~1 GB of variables, under default settings
4. deployment: ansible-playbook wall time on the 3-host test cluster (first and no-change run)
5. image size of the CPU image vs the official CPU TensorFlow image's published size
6. CTR: examples/s of a model with a 256 MiB embedding table, tfps (1 and 2 ps) vs TF2's
   ParameterServerStrategy + ClusterCoordinator (bench/ctr_tf2.py) vs one process's
   model.fit; each ps's peak RSS; a 4x larger table; Adam as compiled
7. dynamic: wide_deep on a stream of churning users (bench/ctr_stream.py: 1 M distinct,
   50 k active at a time; --stream_scale shrinks it), hashed against dynamic tables of the
   same memory budget, 2 ps + 2 workers each reading its share once (--epochs 1): AUC on
   the next part of the stream (and the dynamic side's on the stream with one constant
   user), ps RSS at 25 % and 100 % of the steps,
   examples/s, and a continuation saved on 2 ps resumed on 3
8. dlrm: a Criteo-shaped DLRM (bench/dlrm.py: 13 numeric and 26 categorical columns, dim 16,
   MLPs 512-256-16 and 512-256-1, batch 512, Adagrad): examples/s and examples/s per vCPU of
   tfps (1 ps + 2 workers) with hashed and with dynamic tables, one process's model.fit and
   TF2 PSS (hashed), each run's held-out AUC; against DeepRec modelzoo's published anchors

Results go to stdout (a table), docs/benchmarks.md and docs/benchmarks.png. These machines
are noisy: absolute times are context, ratios measured in the same run are the result.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from ctr_tf2 import peak_rss  # noqa: E402 - bench/, this script's directory: the TF2 side's VmHWM reader

from tfps.cluster import local_plan  # noqa: E402
from tfps.outcome.contract import JobResult  # noqa: E402

PY = sys.executable
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": ROOT, "PYTHONUNBUFFERED": "1"}
FIRST_RE = re.compile(r"\[(worker\d+)\].*first training step done")
#: The official tensorflow/tensorflow:latest (CPU) image size (Docker Hub, 2.x, uncompressed
#: as `docker images` shows it); see tensorflow/tensorflow PR #59682: 2.07 GB -> 1.76 GB.
OFFICIAL_CPU_IMAGE_GB = 1.76


def sh(argv, timeout=900, env=ENV):
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


class Watched:
    """A process whose output lines are read as they come, each ``pattern`` match timed.

    Start-up counts from the launch for tfps and for the classic script alike: the moment
    a worker's first-step line arrives (a process's own "after start" would leave out the
    interpreter's start and, for ``tfps local``, the launcher's)."""

    def __init__(self, argv, pattern: re.Pattern, t0: float, env=None):
        import threading
        self.pattern, self.t0, self.seen, self.lines, self.arrived = pattern, t0, {}, [], []
        self.popen = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env or ENV,
                                      cwd=ROOT, start_new_session=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.popen.stdout:
            self.arrived.append(time.time())
            self.lines.append(line)
            m = self.pattern.search(line)
            if m and m.group(1) not in self.seen:
                self.seen[m.group(1)] = time.time() - self.t0

    def wait(self, timeout: float) -> str:
        self.popen.wait(timeout)
        self.reader.join(10)
        return "".join(self.lines)


# ---------------------------------------------------------------------------- tfps side
def local_results(p: Watched, d: str, timeout: float, what: str) -> tuple[str, JobResult]:
    """Wait for a ``tfps local`` run in model_dir ``d``, refuse a failed one, and read its
    results.json (through the one result type): its output and its results."""
    out = p.wait(timeout)
    if p.popen.returncode != 0:
        raise RuntimeError(f"tfps local ({what}) failed ({p.popen.returncode}):\n{out[-3000:]}")
    return out, JobResult.load(os.path.join(d, "results.json"))


@contextlib.contextmanager
def local_run_ended(p: Watched, d: str):
    """However the bench ends: kill the ``tfps local`` run if it still runs, remove its model_dir."""
    try:
        yield
    finally:
        if p.popen.poll() is None:
            os.killpg(p.popen.pid, signal.SIGKILL)
            p.popen.wait()
        shutil.rmtree(d, ignore_errors=True)


def run_tfps(steps, batch, model="mlp", sync=False, extra=()):
    d = tempfile.mkdtemp(prefix="tfps-bench-")
    t0 = time.time()
    p = Watched([PY, "-m", "tfps", "local", "--ps", "1", "--workers", "2", "--model", model,
                 "--train_steps", str(steps), "--batch_size", str(batch), "--model_dir", d, "--log_steps", "100",
                 *(["--sync_replicas"] if sync else []), *extra], FIRST_RE, t0)
    with local_run_ended(p, d):
        _, res = local_results(p, d, 3600, model)
    wall = time.time() - t0
    factor = 2 if sync else 1
    return {"first": dict(p.seen), "examples_s": res.global_step * batch * factor / res.times.training_s,
            "final_save_s": res.times.final_save_s, "wall": wall, "results": res}


# ------------------------------------------------------------------------- classic side
#: How long the classic sync chief may take to end after worker1 has (see run_classic).
CLASSIC_END_WAIT_SECS = 60


def run_classic(steps, batch, model="mlp", sync=False):
    plan = local_plan(1, 2)
    t0 = time.time()
    procs = {}
    for t in plan.tasks:
        argv = [PY, os.path.join(ROOT, "bench", "classic_replica.py"), *plan.task_ref(t).to_flags(),
                "--train_steps", str(steps), "--batch_size", str(batch), "--model", model,
                *(["--sync_replicas"] if sync else [])]
        procs[t.name] = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                         env=ENV, cwd=ROOT, start_new_session=True)
    import threading
    outs = {}
    hung = False
    # Every task's output is read as it comes (a pipe left unread fills and blocks its writer).
    readers = {name: threading.Thread(target=lambda n=name: outs.__setitem__(n, procs[n].stdout.read()), daemon=True)
               for name in procs}
    for r in readers.values():
        r.start()
    try:
        procs["worker1"].wait(timeout=3600)
        try:
            procs["worker0"].wait(timeout=CLASSIC_END_WAIT_SECS if sync else 3600)
        except subprocess.TimeoutExpired:
            # The classic sync chief can wait forever for a gradient of the last step once worker1
            # has left (SyncReplicasOptimizer has no end of its own; often seen on a loaded machine).
            # Its global steps are worker1's: measured from worker1's lines below.
            hung = True
        for name in ("worker0", "worker1"):
            readers[name].join(60)
    finally:
        for pr in procs.values():        # the classic ps never exits: it has to be killed
            if pr.poll() is None:
                os.killpg(pr.pid, signal.SIGKILL)
                pr.wait()
    first, done = {}, {}
    for name, out in ((n, outs.get(n, "")) for n in (("worker1",) if hung else ("worker0", "worker1"))):
        m = re.search(r"BENCH first_step ([\d.]+) (\d+)", out)
        d = re.search(r"BENCH done (\d+) ([\d.]+) ([\d.]+)", out)
        if not (m and d):
            raise RuntimeError(f"classic {name} failed:\n{out[-3000:]}")
        first[name] = float(m.group(1)) - t0
        done[name] = (int(d.group(1)) - int(m.group(2)), float(d.group(2)), float(d.group(3)))
    # The global steps from the worker's first step to its last; a sync chief that never ended
    # (see above): worker1's, when worker1 trained a good part of the job (it shares the steps).
    step, start, end = done["worker1" if hung else "worker0"]
    if hung and step < steps // 2:
        raise RuntimeError(f"classic sync worker0 did not end within {CLASSIC_END_WAIT_SECS} s of worker1, "
                           f"which trained {step} of {steps} steps:\n{outs['worker1'][-2000:]}")
    factor = 2 if sync else 1
    return {"first": first, "examples_s": step * batch * factor / (end - start)}


def run_single(steps, batch, model="mlp"):
    p = sh([PY, os.path.join(ROOT, "bench", "single.py"), "--train_steps", str(steps),
            "--batch_size", str(batch), "--model", model])
    d = re.search(r"BENCH done (\d+) ([\d.]+) ([\d.]+)", p.stdout)
    if not d:
        raise RuntimeError(p.stdout[-2000:] + p.stderr[-2000:])
    return {"examples_s": int(d.group(1)) * batch / (float(d.group(3)) - float(d.group(2)))}


def _port_open(port: int) -> bool:
    import socket
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def run_ps_first(kind: str, steps: int) -> dict[str, float]:
    """The cluster as an orchestrator or a user starts it: the ps is serving, then both
    workers start at the same moment (tfps: `tfps run` per task, as in the containers).
    Returns each worker's first training step, in seconds after the workers' launch."""
    plan = local_plan(1, 2)
    d = tempfile.mkdtemp(prefix="tfps-bench-")

    def argv(t):
        flags = plan.task_ref(t).to_flags()
        if kind == "tfps":
            return [PY, "-m", "tfps", "run", *flags, "--train_steps", str(steps), "--model_dir", d,
                    "--log_steps", "100"]
        return [PY, os.path.join(ROOT, "bench", "classic_replica.py"), *flags, "--train_steps", str(steps)]

    # Each worker's first-step line, timed as it arrives (the same for both programs).
    first_line = re.compile(r"(first) training step done" if kind == "tfps" else r"BENCH (first)_step")
    ps = [t for t in plan.tasks if t.job == "ps"][0]
    procs = {"ps0": Watched(argv(ps), first_line, time.time())}
    try:
        deadline = time.time() + 120
        while not _port_open(ps.port):
            if time.time() > deadline or procs["ps0"].popen.poll() is not None:
                raise RuntimeError(f"{kind} ps did not start")
            time.sleep(0.1)
        t0 = time.time()
        for t in plan.tasks:
            if t.job == "worker":
                procs[t.name] = Watched(argv(t), first_line, t0)
        outs = {name: procs[name].wait(900) for name in ("worker0", "worker1")}
    finally:
        for pr in procs.values():        # the classic ps never exits
            if pr.popen.poll() is None:
                os.killpg(pr.popen.pid, signal.SIGKILL)
                pr.popen.wait()
        shutil.rmtree(d, ignore_errors=True)
    first = {}
    for name, out in outs.items():
        first[name] = procs[name].seen.get("first")
        if first[name] is None:
            raise RuntimeError(f"{kind} {name} did not train:\n{out[-3000:]}")
    return first


# ------------------------------------------------------------------------------ repeats
def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def spread(xs, fmt="{:.2f}") -> str:
    """The median of the runs, with their range: ``1.23 (1.10-1.40)``."""
    return fmt.format(median(xs)) + (f" ({fmt.format(min(xs))}-{fmt.format(max(xs))})" if len(xs) > 1 else "")


def stats(xs) -> dict:
    return {"median": median(xs), "min": min(xs), "max": max(xs), "runs": list(xs)}


# ------------------------------------------------------------------------------ benches
#: Start-up flips between runs (gRPC reconnect back-off, the classic 30 s readiness poll):
#: its medians always come from at least this many runs of each scenario.
STARTUP_MIN_RUNS = 5


def bench_startup(rows, quick, repeat):
    """Each scenario ``max(repeat, STARTUP_MIN_RUNS)`` times, tfps and classic alternating
    (same load for both)."""
    steps = 300 if quick else 600
    t, c, tp, cp = [], [], [], []
    for _ in range(max(repeat, STARTUP_MIN_RUNS)):
        t.append(max(run_tfps(steps, 64)["first"].values()))
        c.append(max(run_classic(steps, 64)["first"].values()))
        # The non-chief's join, with the ps already serving when the workers start: the classic
        # non-chief then finds the model not yet initialised and sleeps MonitoredTrainingSession's
        # 30 s; started all at once (above), both wait for the ps and the poll may not show.
        tp.append(run_ps_first("tfps", steps))
        cp.append(run_ps_first("classic", steps))
    tj = [r["worker1"] - r["worker0"] for r in tp]
    cj = [r["worker1"] - r["worker0"] for r in cp]
    ratios = [b / a for a, b in zip(t, c)]
    rows.append(("start-up, all at once: launch -> all workers training (s)", spread(t), spread(c),
                 spread(ratios) + "x sooner", ">= 1.0x"))
    rows.append(("start-up, ps serving: non-chief joins after the chief (s)", spread(tj), spread(cj),
                 spread([b / max(a, 0.05) for a, b in zip(tj, cj)], "{:.1f}") + "x sooner", "within 2 s, >= 10x"))
    tpm, cpm = [max(r.values()) for r in tp], [max(r.values()) for r in cp]
    rows.append(("start-up, ps serving: launch -> all workers training (s)", spread(tpm), spread(cpm),
                 spread([b / a for a, b in zip(tpm, cpm)]) + "x sooner", ">= 1.0x"))
    return {"all_at_once": {"tfps": stats(t), "classic": stats(c)},
            "ps_serving": {"tfps": stats(tpm), "classic": stats(cpm)},
            "ps_serving_join": {"tfps": stats(tj), "classic": stats(cj)}}


#: How many times a failed run is tried again (the classic sync script's chief can wait
#: forever for a worker that lost MonitoredTrainingSession's readiness race: seen twice in
#: a row in one bench run).
RUN_RETRIES = 3


def _once_more_if_failed(run, failed: list) -> float:
    """A run's examples/s; a run that fails is reported (``failed_runs``) and run again, up to
    ``RUN_RETRIES`` times."""
    for attempt in range(RUN_RETRIES + 1):
        try:
            return run()["examples_s"]
        except RuntimeError as e:
            # The first line says which side failed and how; the output's tail follows.
            head, _, tail = str(e).partition("\n")
            failed.append(f"{head[:500]}\n{tail[-1000:]}" if tail else head[:1500])
            if attempt == RUN_RETRIES:
                raise
            print(f"a run failed, running it again: {head[:500]}", file=sys.stderr, flush=True)
    raise AssertionError("unreachable")


def bench_throughput(rows, quick, repeat):
    """examples/s of tfps, the classic loop and one process, ``repeat`` times each, interleaved."""
    out = {}
    for model, steps in (("mlp", 1500 if quick else 4000), ("cnn", 300 if quick else 800)):
        for sync in (False, True):
            mode = "sync" if sync else "async"
            runs = {"tfps": [], "classic": [], "single": []}
            failed = []
            for _ in range(repeat):
                runs["single"].append(run_single(steps, 64, model)["examples_s"])
                runs["tfps"].append(_once_more_if_failed(lambda: run_tfps(steps, 64, model, sync), failed))
                runs["classic"].append(_once_more_if_failed(lambda: run_classic(steps, 64, model, sync), failed))
            out[f"{model}-{mode}"] = {who: stats(xs) for who, xs in runs.items()}
            out[f"{model}-{mode}"]["failed_runs"] = failed
            vs_classic = [a / b for a, b in zip(runs["tfps"], runs["classic"])]
            vs_single = [a / b for a, b in zip(runs["tfps"], runs["single"])]
            rows.append((f"throughput {model} {mode} (examples/s)", spread(runs["tfps"], "{:.0f}"),
                         spread(runs["classic"], "{:.0f}"),
                         f"{spread(vs_classic)}x classic, {spread(vs_single)}x one process",
                         ">= 1.3x classic, >= 0.6x one process" if mode == "async" else ""))
        rows.append((f"throughput {model}: sync/async (tfps, medians)",
                     f"{out[f'{model}-sync']['tfps']['median'] / out[f'{model}-async']['tfps']['median']:.2f}",
                     "", "", ""))
    return out


#: The slowed-worker bench: one of 3 sync workers frozen (SIGSTOP) this long.
FREEZE_SECS = 20
#: Every task's step sleeps this long (tests/fixtures/paced_model.py): the job's pace does not
#: depend on how the 2 cores are shared, so a frozen worker does not speed the others up.
PACED_STEP_SECS = 0.02
PACED_MODEL = "tests.fixtures.paced_model:model_fn"
CHIEF_PROGRESS_RE = re.compile(r"^\[worker0\] .*worker0: step (\d+)/\d+ ")


def _step_at(points: list[tuple[float, int]], t: float) -> float:
    """The global step at time ``t``, interpolated between the chief's progress lines."""
    before = [p for p in points if p[0] <= t]
    after = [p for p in points if p[0] >= t]
    if not before or not after:
        raise RuntimeError(f"no progress line around {t:.1f} (lines from {points[0][0]:.1f} to {points[-1][0]:.1f})")
    (t0, s0), (t1, s1) = before[-1], after[0]
    return float(s0) if t1 == t0 else s0 + (s1 - s0) * (t - t0) / (t1 - t0)


def run_frozen_worker(backup: int, steps: int) -> dict:
    """``tfps local --ps 1 --workers 3 --sync_replicas [--backup_workers 1]`` on the paced MLP;
    worker2 is frozen (SIGSTOP) for FREEZE_SECS once the job has trained FREEZE_SECS at full
    pace. Returns the global steps the job made in the freeze and in as long a window just
    before it (from the chief's progress lines, as they arrive), and the job's examples/s."""
    d = tempfile.mkdtemp(prefix="tfps-bench-backup-")
    argv = [PY, "-m", "tfps", "local", "--ps", "1", "--workers", "3", "--model", PACED_MODEL, "--sync_replicas",
            *(["--backup_workers", str(backup)] if backup else []), "--train_steps", str(steps),
            "--batch_size", "64", "--model_dir", d, "--log_steps", "10"]
    p = Watched(argv, FIRST_RE, time.time(), env={**ENV, "TFPS_TEST_STEP_SECS": str(PACED_STEP_SECS)})
    frozen_at = None
    with local_run_ended(p, d):
        deadline = time.time() + 900
        while time.time() < deadline and p.popen.poll() is None:
            points = [(t, int(m.group(1))) for t, line in zip(list(p.arrived), list(p.lines))
                      if (m := CHIEF_PROGRESS_RE.search(line))]
            if points and points[-1][1] > 0 and time.time() - points[0][0] > FREEZE_SECS + 5:
                break
            time.sleep(0.2)
        pid = task_pids(p.popen.pid).get("worker2")
        if pid is None or p.popen.poll() is not None:
            raise RuntimeError(f"the job ended or worker2 was not found before the freeze:\n{''.join(p.lines)[-3000:]}")
        os.kill(pid, signal.SIGSTOP)
        frozen_at = time.time()
        time.sleep(FREEZE_SECS)
        os.kill(pid, signal.SIGCONT)
        _, res = local_results(p, d, 900, f"frozen worker, backup {backup}")
    points = [(t, int(m.group(1))) for t, line in zip(p.arrived, p.lines) if (m := CHIEF_PROGRESS_RE.search(line))]
    before = _step_at(points, frozen_at) - _step_at(points, frozen_at - FREEZE_SECS)
    during = _step_at(points, frozen_at + FREEZE_SECS) - _step_at(points, frozen_at)
    per_step = 3 - backup   # gradients (batches) aggregated per global step
    return {"steps_before": round(before, 1), "steps_frozen": round(during, 1),
            "kept": during / before if before > 0 else float("nan"), "global_step": res.global_step,
            "examples_s": res.global_step * 64 * per_step / res.times.training_s,
            "dropped_gradients": {k: w.extra.get("dropped_gradients") for k, w in res.workers.items()}}


def bench_backup(rows, quick, repeat):
    """One of 3 sync workers frozen for FREEZE_SECS, with and without one backup worker:
    the share of its steps the job still makes in the freeze, alternating, ``repeat`` times."""
    steps = 2500 if quick else 4000
    runs: dict[int, list] = {1: [], 0: []}
    for _ in range(repeat):
        for backup in (1, 0):
            runs[backup].append(run_frozen_worker(backup, steps))
    for backup in (1, 0):
        r = runs[backup]
        kept = [x["kept"] for x in r]
        frozen, before = [x["steps_frozen"] for x in r], [x["steps_before"] for x in r]
        what = "3 workers, 1 backup" if backup else "3 workers, no backup"
        rows.append((f"sync, worker2 frozen {FREEZE_SECS} s, {what}: steps in the freeze / the {FREEZE_SECS} s before",
                     f"{spread(frozen, '{:.0f}')} / {spread(before, '{:.0f}')}",
                     "", f"{spread([1 - k for k in kept])} of the steps lost",
                     "<= 0.10 lost" if backup else ""))
        rows.append((f"sync, worker2 frozen {FREEZE_SECS} s, {what}: whole job (examples/s)",
                     spread([x["examples_s"] for x in r], "{:.0f}"), "", "", ""))
    return {"backup_1": runs[1], "backup_0": runs[0], "freeze_s": FREEZE_SECS, "paced_step_s": PACED_STEP_SECS,
            "steps": steps}


def bench_final_save(rows, quick):
    out = {}
    # an 8 -> H -> H -> 3 MLP holds about H*H float32 variables: 5000 -> 100 MB, 15800 -> 1 GB
    sizes = (("100MB", "5000,5000"), ("1GB", "15800,15800")) if not quick else (("100MB", "5000,5000"),)
    for label, hidden in sizes:
        t = run_tfps(4, 8, "mlp", extra=("--hidden_units", hidden, "--optimizer", "sgd", "--checkpoint_steps", "1000"))
        res = t["results"]
        ok = res.status == "succeeded" and res.export_complete
        out[label] = t["final_save_s"]
        rows.append((f"final save, {label} of variables (s)", f"{t['final_save_s']:.1f}", "",
                     "complete" if ok else "CUT SHORT", "complete within 1800 s default"))
    return out


def bench_image(rows, image):
    p = sh(["docker", "image", "inspect", image, "--format", "{{.Size}}"])
    if p.returncode != 0:
        rows.append(("image size (GB)", f"n/a (no {image})", "", "", ""))
        return None
    gb = int(p.stdout.strip()) / 1e9
    rows.append((f"CPU image size (GB, {image})", f"{gb:.2f}", f"{OFFICIAL_CPU_IMAGE_GB:.2f} (official)",
                 f"{gb / OFFICIAL_CPU_IMAGE_GB:.2f}x", "<= 1.2 GB"))
    return gb


def bench_deploy(rows):
    script = os.path.join(ROOT, "bench", "deploy_bench.py")
    if not os.path.exists(script):
        rows.append(("ansible deploy", "not measured", "", "", ""))
        return None
    p = sh([PY, script], timeout=3600)
    try:
        r = json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        rows.append(("ansible deploy", "failed: " + (p.stderr or p.stdout)[-200:], "", "", ""))
        return None
    rows.append(("ansible deploy, first run (s)", f"{r['first_s']:.0f}", "", "", ""))
    rows.append(("ansible deploy, no-change run (s)", f"{r['second_s']:.1f}", "", f"changed={r['changed']}",
                 "changed=0, < 30 s"))
    return r


# ---------------------------------------------------------------------------------- CTR
CTR_BATCH = 256
CTR_BUCKETS = 2**22                 # x 16 float32: a 256 MiB table
CTR_MODEL = "examples.ctr_model:build_model"
#: The main comparison trains with Adagrad: sparse updates in tfps and in tf_keras alike, so
#: the figures compare the parameter-server machinery. tf_keras's Adam (the example's own
#: compile()) updates the whole table every step; a row of its own shows what that costs.
CTR_OPTIMIZER = "adagrad"
PROGRESS_RE = re.compile(r"^\[worker\d+\] .*worker\d+: step (\d+)/\d+ ")


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system) a process has used, None when it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def task_pids(launcher: int) -> dict[str, int]:
    """The tasks of a `tfps local`: the launcher's children whose command line (the task's
    ``tfps run ... --job_name=ps --task_index=N``, which tfps sets on a forked task) names one."""
    found = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            if ppid != launcher:
                continue
            with open(f"/proc/{d}/cmdline") as fh:
                cmd = fh.read().replace("\0", " ")
        except (OSError, ValueError, IndexError):
            continue
        m = re.search(r"--job_name=(ps|worker)\b.*--task_index=(\d+)", cmd)
        if m:
            found[m.group(1) + m.group(2)] = int(d)
    return found


def cpu_between(samples: list[tuple[float, dict]], t0: float, t1: float) -> dict[str, float]:
    """Each task's CPU seconds from ``t0`` to ``t1``, from the samples nearest to both."""
    def near(t):
        return min(samples, key=lambda s: abs(s[0] - t))[1]
    a, b = near(t0), near(t1)
    return {n: round(b[n] - a[n], 2) for n in sorted(a) if n in b}


def watch_local_steady(argv: list, d: str, tasks: int, steps: int, what: str, result_timeout: float) -> dict:
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
    with local_run_ended(p, d):
        deadline = time.time() + 3600
        while p.popen.poll() is None and time.time() < deadline:
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
        out, res = local_results(p, d, result_timeout, what)
    points = [(t, int(m.group(1))) for t, line in zip(p.arrived, p.lines) if (m := PROGRESS_RE.search(line))]
    window = [(t, step) for t, step in points if step >= 0.2 * steps and t > (ckpt_at or 0)]
    if len(window) < 2 or window[-1][0] <= window[0][0]:
        raise RuntimeError(f"tfps local ({what}) printed too few progress lines:\n{out[-3000:]}")
    (t0, s0), (t1, s1) = window[0], window[-1]
    return {"p": p, "res": res, "ckpt_at": ckpt_at, "peak": peak, "t0": t0, "s0": s0, "t1": t1, "s1": s1,
            "cpu": cpu_between(samples, t0, t1)}


def run_tfps_ctr(train_data: str, ps: int, steps: int, buckets: int = CTR_BUCKETS,
                 optimizer: str = CTR_OPTIMIZER) -> dict:
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
    w = watch_local_steady(argv, d, ps + 2, steps, f"ctr, {ps} ps", 120)
    p, res, ckpt_at, peak, cpu = w["p"], w["res"], w["ckpt_at"], w["peak"], w["cpu"]
    (t0, s0), (t1, s1) = (w["t0"], w["s0"]), (w["t1"], w["s1"])
    return {"examples_s": (s1 - s0) * CTR_BATCH / (t1 - t0), "window_steps": [s0, s1], "window_s": round(t1 - t0, 2),
            "cpu_s_per_1k_examples": round(sum(cpu.values()) * 1000 / ((s1 - s0) * CTR_BATCH), 4),
            "cpu_s": cpu,
            # the chief's first step -> its first checkpoint complete (s)
            "first_checkpoint_s": (round(ckpt_at - p.t0 - p.seen["worker0"], 2)
                                   if ckpt_at and "worker0" in p.seen else None),
            "examples_s_training": res.global_step * CTR_BATCH / res.times.training_s,
            "times": res.to_dict()["times"], "ps_shares_mb": res.ps_shares_mb or None,
            "ps_peak_rss_mib": {n: round(b / 2**20) for n, b in sorted(peak.items())}}


def run_tf2_ctr(mode: str, train_data: str, steps: int, ps: int = 1, buckets: int = CTR_BUCKETS,
                optimizer: str = CTR_OPTIMIZER, epochs: int = 5, steps_per_execution: int = 50) -> dict:
    """bench/ctr_tf2.py: ``single`` (one process, model.fit) or ``pss`` (ParameterServerStrategy)."""
    p = sh([PY, os.path.join(ROOT, "bench", "ctr_tf2.py"), mode, "--train_data", train_data, "--steps", str(steps),
            "--epochs", str(epochs), "--steps_per_execution", str(steps_per_execution), "--batch_size",
            str(CTR_BATCH), "--buckets", str(buckets), "--optimizer", optimizer, "--ps", str(ps), "--workers", "2"],
           timeout=3600, env={**ENV, "TF_USE_LEGACY_KERAS": "1"})
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


def bench_ctr(rows, quick):
    """The CTR model (examples/ctr_model.py, a 256 MiB embedding table) on the demo CTR data:
    tfps async with 1 and 2 ps against TF2's ParameterServerStrategy with the same tasks and
    one process's model.fit; each ps's peak RSS; a 4x larger table; Adam as compiled."""
    from tfps.demo import ensure_demo_data
    steps = 2000 if quick else 4000
    d = tempfile.mkdtemp(prefix="tfps-bench-ctr-data-")
    try:
        train = ensure_demo_data(d)["ctr_train"]
        r = {"steps": steps, "batch_size": CTR_BATCH, "buckets": CTR_BUCKETS, "optimizer": CTR_OPTIMIZER}
        # Alternating, so that each ratio compares runs made under about the same load.
        r["single"] = run_tf2_ctr("single", train, steps)
        r["tfps_1ps"] = run_tfps_ctr(train, 1, steps)
        r["pss_1ps"] = run_tf2_ctr("pss", train, steps, ps=1)
        r["pss_2ps"] = run_tf2_ctr("pss", train, steps, ps=2)
        r["tfps_2ps"] = run_tfps_ctr(train, 2, steps)
        # The chief's first checkpoint of a 1 GiB table (and its Adagrad slot) takes a while:
        # more steps, so that the steady state after it is as long as in the other runs.
        r["tfps_2ps_4x_rows"] = run_tfps_ctr(train, 2, 3 * steps, buckets=4 * CTR_BUCKETS)
        # The example as written: compiled with Adam. tfps's Adam is lazy on the table's sparse
        # gradient; tf_keras's decays both moments of every row each step (few steps suffice).
        r["adam_tfps_2ps"] = run_tfps_ctr(train, 2, steps, optimizer="adam")
        r["adam_single"] = run_tf2_ctr("single", train, 30 if quick else 60, optimizer="adam", epochs=3,
                                       steps_per_execution=10)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    single = r["single"]["examples_s"]
    for ps in (1, 2):
        t, b = r[f"tfps_{ps}ps"]["examples_s"], r[f"pss_{ps}ps"]["examples_s"]
        what = "1 ps" if ps == 1 else "2 ps (table split in 2)"
        rows.append((f"CTR {what} + 2 workers, 256 MiB table (examples/s)", f"{t:.0f}", f"{b:.0f} (TF2 PSS)",
                     f"{t / b:.2f}x TF2 PSS, {t / single:.2f}x one process",
                     f"{verdict(t / b, 1.5)} PSS, {verdict(t / single, 0.5)} one process"))
    rows.append(("CTR one process, model.fit (examples/s)", "", f"{single:.0f}", "", ""))
    cpu = {k: v.get("cpu_s_per_1k_examples") for k, v in r.items() if isinstance(v, dict)}
    if all(cpu.get(k) for k in ("tfps_1ps", "tfps_2ps", "pss_1ps", "pss_2ps", "single")):
        rows.append(("CTR CPU s per 1000 examples, every process (1 ps / 2 ps)",
                     f"{cpu['tfps_1ps']:.3f} / {cpu['tfps_2ps']:.3f}",
                     f"{cpu['pss_1ps']:.3f} / {cpu['pss_2ps']:.3f} (TF2 PSS); {cpu['single']:.3f} (one process)",
                     f"{cpu['pss_1ps'] / cpu['tfps_1ps']:.2f}x / {cpu['pss_2ps'] / cpu['tfps_2ps']:.2f}x less than "
                     "TF2 PSS", ""))
    rss = r["tfps_2ps"]["ps_peak_rss_mib"]
    pss_rss = r["pss_2ps"].get("ps_peak_rss_mib") or {}
    if len(rss) == 2 and min(rss.values()) > 0:
        skew = max(rss.values()) / min(rss.values())
        rows.append(("CTR 2 ps: peak RSS of each ps (MiB)", ", ".join(f"{k} {v}" for k, v in rss.items()),
                     ", ".join(f"{k} {v}" for k, v in pss_rss.items()) + " (TF2 PSS)",
                     f"{skew:.2f}x largest/smallest", verdict(skew, 1.3, at_most=True)))
    else:
        rows.append(("CTR 2 ps: peak RSS of each ps (MiB)", f"not measured ({rss})", "", "", "within 1.3x"))
    big, base = r["tfps_2ps_4x_rows"]["examples_s"], r["tfps_2ps"]["examples_s"]
    rows.append(("CTR 2 ps: 4x rows, 1 GiB table (examples/s)", f"{big:.0f}", f"{base:.0f} (256 MiB, tfps)",
                 f"{big / base:.2f}x", verdict(big / base, 0.8)))
    a_t, a_s = r["adam_tfps_2ps"]["examples_s"], r["adam_single"]["examples_s"]
    rows.append(("CTR 2 ps, Adam as compiled (examples/s)", f"{a_t:.0f}", f"{a_s:.0f} (one process)",
                 f"{a_t / a_s:.1f}x one process", ""))
    return r


# ------------------------------------------------------------------------------ dynamic
#: The "dynamic" bench: wide_deep on bench/ctr_stream.py's churning users, 2 ps + 2 workers.
STREAM_BATCH = 512
#: Two workers, each reading its own files (every other one) once: --epochs 1 (STREAM_EPOCHS).
#: Without it each asynchronous worker repeated its files until the job's global step, at
#: its own pace: the chief (which also runs the hooks) made 134 steps while the other made
#: 319 of its 226, so the chief never read the last 40 % of its files, the other spent its
#: last 93 steps on the stream's first 40 % again, and the model scored as if it knew no user
#: (scale 0.02: dynamic 0.616, one constant user 0.618, hashed 0.573); the bench then ran
#: 1 worker (dynamic 0.659, hashed 0.645, one constant user 0.625). With --epochs 1 each
#: worker makes exactly its pass (227 steps each at scale 0.02, 454 in all) and the chief
#: saves once the other is done: dynamic 0.651, 0.656, 0.653, hashed 0.644, 0.648, one
#: constant user 0.627, 0.630 (docs/benchmarks.md).
STREAM_WORKERS = 2
#: --epochs of every stream run: each worker reads its own files once, then is done (the
#: chief saves once the other is done too); the run's steps are an upper bound.
STREAM_EPOCHS = 1
STREAM_DIM = 16
#: Lazy Adam: its step on a row is about the learning rate whatever the gradient's size, so a
#: user's row moves with the user's few rows of a step (one of 512: a gradient of about 1e-3).
#: Adagrad at 0.1 (the bench's setting until 2026-12) moves such a row by about 3e-4 a row
#: (its accumulator starts at 0.1): an id seen 30 times stays near its initial value (AUC
#: 0.598 hashed, 0.598 dynamic at scale 0.02). Adam at 0.003 learns the users once the
#: stream is trained in order (one worker, or two with --epochs 1, above): the wide weights of users with 30+ rows
#: correlate 0.72 with their hidden propensities (0.39 with two workers), and the next
#: part's rows of users seen in training rank at 0.683, those of unseen users at 0.622. A
#: larger rate does not help. Scale 0.02, one worker: dynamic 0.659 at 0.003, 0.656 at 0.01
#: (one constant user 0.625 and 0.622, hashed 0.645 and 0.641). Two workers repeating their
#: files (before --epochs): dynamic 0.616, 0.612, 0.604 at 0.003, 0.01, 0.03 (one constant
#: user 0.618, 0.616, 0.583: at 0.03 the model loses even without users).
STREAM_OPTIMIZER = "adam"
STREAM_LEARNING_RATE = 0.003
#: --steps_to_live in inter-arrival times of one active user (active users / examples per step):
#: a live user is missed that long with probability e**-4.
STREAM_TTL_ARRIVALS = 4
#: Steps the chief's eviction may run late: it runs off the step path, in a thread of the
#: chief (tfps/task/tables.py), so a row lives steps_to_live plus that, and the table is
#: planned for the ids of that many steps. At scale 0.02 (steps_to_live 10) it ran every 8
#: steps with one worker (the table peaked at 3880 of its 4296 rows) but every 28 with two
#: (the table was full most of the run and had refused 17172 new ids by its first pass,
#: about 70 steps in): the chief's own runs (up to --log_steps steps each) woke the eviction.
#: Since 2026-12-07 it follows the global step (mostly 2-5 steps apart at scale 0.02, two
#: workers); the table still refuses ids in stalls of the chief's process (docs/benchmarks.md).
STREAM_EVICTION_LAG = 40


def rss_now(pid: int) -> int:
    """The process's resident size now in bytes (VmRSS), 0 when it cannot be read."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmRSS:"))
    except (OSError, StopIteration, ValueError):
        return 0


def stream_flags(kind: str, stream: dict) -> tuple[list[str], dict]:
    """The wide_deep flags of one side, and what they plan: the dynamic table's live ids and
    budget per ps, and the hashed table of the same budget (same bytes per ps task)."""
    import math

    from tfps.layers.dynamic_embedding import SHARD_SLACK, SKETCH_DEPTH, SKETCH_WIDTH
    from tfps.task.placement import OPTIMIZER_SLOTS, DynamicBudget
    # A global step is one worker's batch (asynchronous training): STREAM_BATCH examples.
    arrivals = stream["active_users"] / STREAM_BATCH                # steps between two rows of a live user
    ttl = max(10, math.ceil(STREAM_TTL_ARRIVALS * arrivals))
    # users leaving per step over one pass of the stream (the same plan for every run on it)
    slide = (stream["distinct_users"] - stream["active_users"]) / max(stream["train_rows"] // STREAM_BATCH, 1)
    expected = int(1.2 * (stream["active_users"] + slide * (ttl + STREAM_EVICTION_LAG)) + stream["ads"]
                   + stream["sites"])
    width, slots = STREAM_DIM + 1, OPTIMIZER_SLOTS[STREAM_OPTIMIZER]
    budget = DynamicBudget("embeddings", expected, width, slots, 2)
    # The hashed table gets the bytes the dynamic one allocates per row, not only what it plans:
    # the rows of both shards (each with SHARD_SLACK room for an uneven hash), each with its
    # slots, its bookkeeping and, once the table is full, its hash table entry. Not the shards'
    # admission sketches: a fixed MiB each, whatever the rows, unused at --min_count 1 (noted
    # in the plan): given to the hashed side as rows, it would triple them at scale 0.02.
    rows = 2 * math.ceil(expected * SHARD_SLACK / 2)
    buckets = rows * budget.bytes_per_id // (width * 4 * (1 + slots))   # rows of the same bytes, no hash table
    plan = {"expected_ids": expected, "steps_to_live": ttl, "hash_buckets": buckets,
            "budget_mb_per_ps": budget.per_ps_mb,
            "dynamic_rows_mb_per_ps": round(rows * budget.bytes_per_id / 2 / 2**20, 2),
            "sketch_mb_per_ps_not_given_to_hashed": SKETCH_DEPTH * SKETCH_WIDTH * 4 / 2**20}
    flags = ["--model", "wide_deep", "--embedding_dim", str(STREAM_DIM), "--optimizer", STREAM_OPTIMIZER,
             "--learning_rate", str(STREAM_LEARNING_RATE), "--batch_size", str(STREAM_BATCH), "--partition_mb", "1"]
    if kind == "dynamic":
        flags += ["--embedding", "dynamic", "--expected_ids", str(expected), "--steps_to_live", str(ttl)]
    else:
        flags += ["--hash_buckets", str(buckets)]
    return flags, plan


def run_stream(kind: str, stream: dict, steps: int, ps: int, d: str, train_glob: str | None = None,
               replace: bool = False, keep: bool = False) -> dict:
    """``tfps local --ps N --workers STREAM_WORKERS`` of wide_deep (``kind`` hashed or dynamic) on the stream
    in model_dir ``d``: examples/s in the steady state, each ps's RSS when the chief passes 25 %
    of the steps and at the last step, the export's AUC on the next part of the stream."""
    flags, plan = stream_flags(kind, stream)
    argv = [PY, "-m", "tfps", "local", "--ps", str(ps), "--workers", str(STREAM_WORKERS), *flags,
            "--train_data", train_glob or stream["train_glob"], "--eval_data", stream["next_csv"],
            # An upper bound: each worker's pass ends its own files with a smaller batch (the
            # passes make up to a step more per worker than the stream's rows / batch).
            "--epochs", str(STREAM_EPOCHS), "--train_steps", str(steps + 2 * STREAM_WORKERS), "--model_dir", d,
            "--log_steps", str(max(10, steps // 40)),
            "--checkpoint_steps", str(steps * 10), *(["--replace"] if replace else [])]
    p = Watched(argv, FIRST_RE, time.time())
    pids: dict[str, int] = {}
    samples: list[tuple[float, dict]] = []    # (time, each ps's RSS)
    try:
        deadline = time.time() + 4 * 3600
        while p.popen.poll() is None and time.time() < deadline:
            if len(pids) < ps + STREAM_WORKERS:
                pids.update(task_pids(p.popen.pid))
            rss = {n: rss_now(pid) for n, pid in pids.items() if n.startswith("ps")}
            if len(rss) == ps and all(rss.values()):
                samples.append((time.time(), rss))
            time.sleep(0.25)
        out, res = local_results(p, d, 300, f"dynamic bench, {kind}, {ps} ps")
    finally:
        if p.popen.poll() is None:
            os.killpg(p.popen.pid, signal.SIGKILL)
            p.popen.wait()
        if not keep:
            shutil.rmtree(d, ignore_errors=True)
    # The chief's steps in time: its first step, its progress lines, the step it ended at.
    restored = [int(m.group(1)) for line in p.lines if (m := re.search(r"restored checkpoint of step (\d+)", line))]
    start = restored[0] if restored else 0
    points = [(t, int(m.group(1))) for t, line in zip(p.arrived, p.lines) if (m := CHIEF_PROGRESS_RE.search(line))]
    points += [(t, start) for t, line in zip(p.arrived, p.lines) if FIRST_RE.search(line) and "[worker0]" in line][:1]
    ended = [t for t, line in zip(p.arrived, p.lines) if re.search(r"chief: job .* succeeded at step", line)]
    points = sorted(points + [(ended[0], res.global_step)] if ended else points)
    window = [(t, st) for t, st in points if st >= start + 0.2 * (steps - start) and st < res.global_step]
    if len(window) >= 2 and window[-1][0] > window[0][0]:
        speed, how = (window[-1][1] - window[0][1]) * STREAM_BATCH / (window[-1][0] - window[0][0]), "progress lines"
    else:   # too few progress lines (a short run): over the whole training time
        speed, how = (res.global_step - start) * STREAM_BATCH / max(res.times.training_s, 1e-9), "training time"

    def step_at(t: float) -> float:
        before = [x for x in points if x[0] <= t]
        after = [x for x in points if x[0] >= t]
        if not before:
            return float(start)
        if not after:
            return float(before[-1][1])
        (t0, s0), (t1, s1) = before[-1], after[0]
        return float(s0) if t1 == t0 else s0 + (s1 - s0) * (t - t0) / (t1 - t0)

    def rss_at(share: float) -> dict | None:
        """Each ps's RSS when the chief passed ``share`` of the run's steps (1: at its last step)."""
        if share >= 1:
            at = [x for x in samples if not ended or x[0] <= ended[0]][-1:]
        else:
            target = start + share * (steps - start)
            at = [x for x in samples if step_at(x[0]) >= target][:1]
        return {n: round(b / 2**20) for n, b in sorted(at[0][1].items())} if at else None

    live = [line.strip() for line in p.lines if re.search(r"table \S+: live \d+", line)][-1:]
    return {"kind": kind, "ps": ps, "steps": [start, res.global_step], "examples_s": round(speed),
            "examples_s_from": how,
            "examples_s_training": round((res.global_step - start) * STREAM_BATCH / max(res.times.training_s, 1e-9)),
            "auc_next": (res.eval_metrics or {}).get("auc"), "ps_rss_mib_25": rss_at(0.25),
            "ps_rss_mib_100": rss_at(1.0), "ps_shares_mb": res.ps_shares_mb or None, "plan": plan,
            "last_live_rows_line": live[0] if live else None,
            # --epochs: the steps each worker made, and those of its passes over its files.
            "worker_steps": {n: w.steps for n, w in sorted((res.workers or {}).items())},
            "worker_pass_steps": {m.group(1): int(m.group(2)) for line in p.lines if (m := re.search(
                r"(worker\d+): --epochs \d+: reads its \d+ training examples \d+ time\(s\), \d+ step\(s\) a pass, "
                r"(\d+) in all", line))},
            "ended_by": res.ended_by}


def dynamic_available() -> str | None:
    """Why the dynamic side cannot run yet, or None: the layer must be committed, not a draft."""
    tracked = sh(["git", "ls-files", "--error-unmatch", "tfps/layers/dynamic_embedding.py"])
    return None if tracked.returncode == 0 else "tfps/layers/dynamic_embedding.py is not committed yet"


def constant_user_copy(stream: dict, out_dir: str) -> dict:
    """The stream with every user id replaced by one constant, in ``out_dir``: the same rows,
    ads, sites and clicks, no user to learn. Returns its plan (the stream's own figures)."""
    os.makedirs(out_dir, exist_ok=True)
    for src in sorted(glob.glob(stream["train_glob"])) + [stream["next_csv"]]:
        with open(src) as fi, open(os.path.join(out_dir, os.path.basename(src)), "w") as fo:
            header = next(fi)
            assert header.startswith("user,"), header
            fo.write(header)
            fo.writelines("u0," + line.split(",", 1)[1] for line in fi)
    return {**stream, "train_glob": os.path.join(out_dir, "train-*.csv"), "next_csv": os.path.join(out_dir, "next.csv")}


def bench_dynamic(rows, quick, scale: float | None = None):
    """Hashed against dynamic tables on a stream of churning users (bench/ctr_stream.py), 2 ps +
    STREAM_WORKERS, side by side: AUC on the next part of the stream, each ps's RSS at 25 % and
    100 % of the steps, examples/s; the dynamic side again on the stream with one constant user
    (its AUC is what the model scores without learning a user: the dynamic side must beat it);
    then each kind saved at half of the steps on 2 ps and continued on 2 and on 3 (resharded):
    the two continuations' AUC."""
    from ctr_stream import generate
    scale = scale if scale is not None else (0.05 if quick else 1.0)
    d = tempfile.mkdtemp(prefix="tfps-bench-stream-")
    r: dict = {"scale": scale}
    try:
        stream = r["stream"] = generate(os.path.join(d, "data"), scale)
        steps = max(20, stream["train_rows"] // STREAM_BATCH)    # one pass over the stream
        r["steps"] = steps
        why = dynamic_available()
        kinds = ["hashed"] + (["dynamic"] if why is None else [])
        if why:
            r["dynamic_skipped"] = why
        for kind in kinds:
            r[kind] = run_stream(kind, stream, steps, 2, os.path.join(d, kind))
        if "dynamic" in kinds:   # the control: the same side, no user to learn
            one = constant_user_copy(stream, os.path.join(d, "one-user"))
            r["dynamic_one_user"] = run_stream("dynamic", one, steps, 2, os.path.join(d, "dynamic-one-user"))
            shutil.rmtree(os.path.join(d, "one-user"), ignore_errors=True)
        files = sorted(glob.glob(stream["train_glob"]))
        lists = []
        for i, part in enumerate((files[:len(files) // 2], files[len(files) // 2:])):
            lists.append(os.path.join(d, f"half-{i}.txt"))
            with open(lists[-1], "w") as fh:
                fh.write("".join(f + "\n" for f in part))
        for kind in kinds:   # resharding: the first half on 2 ps, the second continued on 2 and on 3
            half = os.path.join(d, f"{kind}-half")
            r[f"{kind}_first_half"] = run_stream(kind, stream, steps // 2, 2, half, train_glob="@" + lists[0],
                                                 keep=True)
            for ps in (2, 3):
                shutil.copytree(half, f"{half}-{ps}")
                r[f"{kind}_continued_{ps}ps"] = run_stream(kind, stream, steps, ps, f"{half}-{ps}",
                                                           train_glob="@" + lists[1], replace=True)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    seen = stream["users_seen"]
    rows.append(("dynamic: users seen by 25 % / 100 % of the stream", f"{seen['25%']} / {seen['100%']}",
                 f"{stream['active_users']} active at a time", f"{seen['100%'] / max(seen['25%'], 1):.2f}x",
                 ">= 3x"))
    for kind in kinds:
        x = r[kind]
        rows.append((f"dynamic bench, {kind}: AUC on the next part, examples/s",
                     f"{x['auc_next']:.4f}, {x['examples_s']} ({x['examples_s_from']})", "", "", ""))
        m25, m100 = sum((x["ps_rss_mib_25"] or {}).values()), sum((x["ps_rss_mib_100"] or {}).values())
        rows.append((f"dynamic bench, {kind}: ps RSS at 25 % / 100 % of the steps (MiB, both ps)",
                     f"{m25} / {m100}", "", f"{m100 / max(m25, 1):.2f}x",
                     verdict(m100 / max(m25, 1), 1.25, at_most=True) if kind == "dynamic" else ""))
        c2, c3 = r[f"{kind}_continued_2ps"]["auc_next"], r[f"{kind}_continued_3ps"]["auc_next"]
        rows.append((f"dynamic bench, {kind}: saved on 2 ps, continued on 3 (AUC)", f"{c3:.4f}",
                     f"{c2:.4f} (continued on 2)", f"{c3 - c2:+.4f}",
                     f"within 0.01: {'PASS' if abs(c3 - c2) <= 0.01 else 'FAIL'}"))
    if "dynamic" in r:
        h, y = r["hashed"], r["dynamic"]
        rows.append(("dynamic vs hashed at the same memory: AUC on the next part", f"{y['auc_next']:.4f}",
                     f"{h['auc_next']:.4f} (hashed)", f"{y['auc_next'] - h['auc_next']:+.4f}",
                     f">= +0.01: {'PASS' if y['auc_next'] - h['auc_next'] >= 0.01 else 'FAIL'}"))
        c = r["dynamic_one_user"]["auc_next"]
        rows.append(("dynamic vs the same with one constant user: AUC on the next part (users learned)",
                     f"{y['auc_next']:.4f}", f"{c:.4f} (one user)", f"{y['auc_next'] - c:+.4f}",
                     f">= +0.01: {'PASS' if y['auc_next'] - c >= 0.01 else 'FAIL'}"))
        # The same measure on both sides: the steady state of the progress lines when both have
        # one, else (short runs) the whole training time.
        key = "examples_s" if y["examples_s_from"] == h["examples_s_from"] == "progress lines" else \
            "examples_s_training"
        ratio = y[key] / h[key]
        rows.append((f"dynamic vs hashed: examples/s ({'steady state' if key == 'examples_s' else 'training time'})",
                     f"{y[key]}", f"{h[key]} (hashed)", f"{ratio:.2f}x", verdict(ratio, 0.7)))
    else:
        rows.append(("dynamic side", "not run", why, "", ""))
    return r


# --------------------------------------------------------------------------------- DLRM
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


def run_tfps_dlrm(kind: str, info: dict, steps: int) -> dict:
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
    w = watch_local_steady(argv, d, 1 + DLRM_WORKERS, steps, f"dlrm, {kind}", 300)
    res, cpu = w["res"], w["cpu"]
    (t0, s0), (t1, s1) = (w["t0"], w["s0"]), (w["t1"], w["s1"])
    examples = (s1 - s0) * BATCH
    return {"examples_s": examples / (t1 - t0), "window_steps": [s0, s1], "window_s": round(t1 - t0, 2),
            "cpu_s": cpu, "examples_per_cpu_s": examples / max(sum(cpu.values()), 1e-9),
            "auc": (res.eval_metrics or {}).get("auc"), "times": res.to_dict()["times"]}


def run_tf2_dlrm(mode: str, info: dict, steps: int, epochs: int, steps_per_execution: int) -> dict:
    """bench/dlrm.py ``single`` (model.fit in one process) or ``pss`` (ParameterServerStrategy,
    1 ps + 2 workers): examples/s over all epochs but the first, CPU seconds of every process
    in them, and the AUC of the held-out rows."""
    p = sh([PY, os.path.join(ROOT, "bench", "dlrm.py"), mode, "--train_data", info["train_glob"], "--eval_data",
            info["eval_csv"], "--steps", str(steps), "--epochs", str(epochs), "--steps_per_execution",
            str(steps_per_execution), "--ps", "1", "--workers", str(DLRM_WORKERS)],
           timeout=3600, env={**ENV, "TF_USE_LEGACY_KERAS": "1"})
    d = re.search(r"BENCH done (\d+) ([\d.]+) ([\d.]+)", p.stdout)
    auc = re.search(r"BENCH auc ([\d.]+)", p.stdout)
    cpu = re.search(r"BENCH cpu (.*)", p.stdout)
    if p.returncode != 0 or not (d and auc and cpu):
        raise RuntimeError(f"dlrm.py {mode} failed ({p.returncode}):\n{p.stdout[-2000:]}{p.stderr[-3000:]}")
    examples, window = int(d.group(1)), float(d.group(3)) - float(d.group(2))
    cpu_s = {k: float(v) for k, v in (kv.split("=") for kv in cpu.group(1).split())}
    return {"examples_s": examples / window, "window_s": round(window, 2), "cpu_s": cpu_s,
            "examples_per_cpu_s": examples / max(sum(cpu_s.values()), 1e-9), "auc": float(auc.group(1))}


def bench_dlrm(rows, quick, repeat):
    """The Criteo-shaped DLRM (bench/dlrm.py): tfps hashed and dynamic, one process's model.fit
    and TF2 PSS (hashed), ``repeat`` rounds of the four in turn (same load for each). Per
    vCPU: examples/s over the cores the run could use; per CPU second: over the CPU time all
    its processes used in the measured window (what a core gives when the run has it alone)."""
    from dlrm import BATCH, generate
    steps = DLRM_STEPS_QUICK if quick else DLRM_STEPS
    epochs, spe = (3, 10) if quick else (5, 20)
    d = tempfile.mkdtemp(prefix="tfps-bench-dlrm-data-")
    arms = ("tfps_hashed", "tfps_dynamic", "single", "pss")
    runs: dict[str, list] = {a: [] for a in arms}
    t_start = time.time()
    try:
        info = generate(d, DLRM_ROWS_QUICK if quick else DLRM_ROWS)
        for _ in range(repeat):
            runs["tfps_hashed"].append(run_tfps_dlrm("hashed", info, steps))
            runs["single"].append(run_tf2_dlrm("single", info, steps, epochs, spe))
            runs["tfps_dynamic"].append(run_tfps_dlrm("dynamic", info, steps))
            runs["pss"].append(run_tf2_dlrm("pss", info, steps, epochs, spe))
    finally:
        shutil.rmtree(d, ignore_errors=True)
    cores = vcpus()
    names = {"tfps_hashed": f"tfps 1 ps + {DLRM_WORKERS} workers, hashed",
             "tfps_dynamic": f"tfps 1 ps + {DLRM_WORKERS} workers, dynamic (DynamicEmbedding)",
             "single": "one process, model.fit, hashed",
             "pss": f"TF2 ParameterServerStrategy 1 ps + {DLRM_WORKERS} workers, hashed"}
    anchors = ", ".join(f"{k} {v / 1000:.1f}k" for k, v in DLRM_ANCHORS.items())
    for a in arms:
        xs = runs[a]
        eps = [x["examples_s"] for x in xs]
        rows.append((f"DLRM {names[a]}: examples/s; per vCPU ({cores} vCPUs)",
                     f"{spread(eps, '{:.0f}')}; {spread([e / cores for e in eps], '{:.0f}')}",
                     f"{anchors} per vCPU (DeepRec modelzoo, 8 vCPUs)",
                     f"{median(eps) / cores / DLRM_ANCHORS['stock TF 1.15']:.2f}x stock TF 1.15", ""))
        rows.append((f"DLRM {names[a]}: examples per CPU second (all processes); held-out AUC",
                     f"{spread([x['examples_per_cpu_s'] for x in xs], '{:.0f}')}; "
                     f"{spread([x['auc'] for x in xs], '{:.4f}')}", "", "",
                     f"AUC > 0.55 (learns): {'PASS' if median([x['auc'] for x in xs]) > 0.55 else 'FAIL'}"))
    cpu_split = {a: {n: round(median([x["cpu_s"].get(n, 0) / max(sum(x["cpu_s"].values()), 1e-9) for x in runs[a]]), 3)
                     for n in runs[a][0]["cpu_s"]} for a in arms}
    rows.append(("DLRM: share of the window's CPU time per process (medians)",
                 "; ".join(f"{a}: " + ", ".join(f"{n} {s:.2f}" for n, s in v.items()) for a, v in cpu_split.items()
                           if a.startswith("tfps")),
                 "; ".join(f"{a}: " + ", ".join(f"{n} {s:.2f}" for n, s in v.items()) for a, v in cpu_split.items()
                           if not a.startswith("tfps")), "", ""))
    return {"data": {k: v for k, v in info.items() if not k.endswith(("_glob", "_csv"))}, "steps": steps,
            "batch_size": BATCH, "tf2_epochs": epochs, "tf2_steps_per_execution": spe, "vcpus": cores,
            "anchors_examples_s_per_vcpu": DLRM_ANCHORS, "cpu_share": cpu_split,
            "bench_s": round(time.time() - t_start, 1), "runs": runs}


def chart(data, path):
    """Bars at the medians, whiskers over the range of the runs."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def bars(ax, groups, who_offsets, width):
        for off, who in who_offsets:
            st = [g[who] for g in groups.values()]
            med = [x["median"] for x in st]
            err = [[m - x["min"] for m, x in zip(med, st)], [x["max"] - m for m, x in zip(med, st)]]
            ax.bar([i + off for i in range(len(st))], med, width=width, yerr=err, capsize=3, label=who)
        ax.set_xticks(list(range(len(groups))), list(groups), fontsize=8)
        ax.legend(fontsize=8)

    tp = data.get("throughput") or {}
    su = data.get("startup") or {}
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    if tp:
        bars(axes[0], tp, ((-0.27, "tfps"), (0, "classic"), (0.27, "single")), 0.27)
        axes[0].set_ylabel("examples/s (median, range)")
        axes[0].set_title("training throughput (1 ps + 2 workers)")
    if su:
        groups = {k.replace("_", " "): v for k, v in su.items() if k in ("all_at_once", "ps_serving")}
        bars(axes[1], groups, ((-0.2, "tfps"), (0.2, "classic")), 0.4)
        axes[1].set_ylabel("s, launch -> all workers training")
        axes[1].set_title("start-up (median, range)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def machine() -> str:
    cpu = "unknown CPU"
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    import tensorflow as tf  # noqa: F401 - version only
    return (f"{platform.node()}: {os.cpu_count()} cores ({cpu}), {mem:.0f} GiB RAM, {platform.platform()}, "
            f"Python {platform.python_version()}, TensorFlow {tf.__version__}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer steps, skip the 1 GB save")
    ap.add_argument("--skip", default="",
                    help="comma-separated: startup,throughput,backup,final_save,image,deploy,ctr,dynamic,dlrm")
    ap.add_argument("--only", default="", help="comma-separated: run only these benches")
    ap.add_argument("--stream_scale", type=float,
                    help="dynamic: users and rows of the stream x this (default 1, with --quick 0.05)")
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs per figure; each figure is their median, with their range (default 3)")
    ap.add_argument("--image", default="tfps:latest", help="the image whose size is reported")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs"))
    a = ap.parse_args()
    if a.repeat < 1:
        ap.error("--repeat must be at least 1")
    skip = set(filter(None, a.skip.split(",")))
    only = set(filter(None, a.only.split(",")))
    rows: list[tuple] = []
    ctr_rows: list[tuple] = []
    dynamic_rows: list[tuple] = []
    dlrm_rows: list[tuple] = []
    data = {}
    loads = [os.getloadavg()]
    ctr_loads: list[tuple] = []
    for name, fn in (("startup", lambda: bench_startup(rows, a.quick, a.repeat)),
                     ("throughput", lambda: bench_throughput(rows, a.quick, a.repeat)),
                     ("backup", lambda: bench_backup(rows, a.quick, a.repeat)),
                     ("final_save", lambda: bench_final_save(rows, a.quick)),
                     ("image", lambda: bench_image(rows, a.image)), ("deploy", lambda: bench_deploy(rows)),
                     ("ctr", lambda: bench_ctr(ctr_rows, a.quick)),
                     ("dynamic", lambda: bench_dynamic(dynamic_rows, a.quick, a.stream_scale)),
                     ("dlrm", lambda: bench_dlrm(dlrm_rows, a.quick, a.repeat))):
        if name in skip or (only and name not in only):
            continue
        print(f"running {name} ...", file=sys.stderr, flush=True)
        before = os.getloadavg()
        data[name] = fn()
        if name in ("dynamic", "dlrm"):
            data[name]["load_average_1_5_15"] = [before, os.getloadavg()]
        if name == "ctr":
            ctr_loads = [before, os.getloadavg()]
        else:
            loads.append(os.getloadavg())
    path = os.path.join(a.out, "benchmarks.md")
    os.makedirs(a.out, exist_ok=True)
    command = f"`bench/run.py {' '.join(sys.argv[1:])}` on {machine()}"
    ctr = data.pop("ctr", None)
    dynamic = data.pop("dynamic", None)
    dlrm = data.pop("dlrm", None)
    if data:      # the general benches: their own part of the page, and the chart
        data["load_average_1_5_15"] = loads
        print(_table(rows))
        chart(data, os.path.join(a.out, "benchmarks.png"))
        load = max(l[0] for l in loads)
        md = [f"Measured {time.strftime('%Y-%m-%d')} with {command}; "
              f"load average (1 min) between the benches up to {load:.1f}. Each figure is the median of "
              f"{a.repeat} run(s) ({max(a.repeat, STARTUP_MIN_RUNS)} for start-up), the range in brackets.", "",
              *_markdown(rows), "", "![benchmarks](benchmarks.png)", "", "Raw figures:", "", "```json",
              json.dumps(data, indent=1, default=str), "```", ""]
        write_section(path, "\n".join(md))
    if ctr is not None:   # the CTR bench: a part of its own, so that each runs without the other
        ctr["load_average_1_5_15"] = ctr_loads
        print(_table(ctr_rows))
        md = [f"Measured {time.strftime('%Y-%m-%d')} with {command}; load average (1 min) before and after "
              f"the bench {ctr_loads[0][0]:.1f} and {ctr_loads[-1][0]:.1f}. One run per figure; "
              f"{ctr['steps']} steps of {ctr['batch_size']} examples, optimizer {ctr['optimizer']} unless "
              "the row says otherwise.", "", *_markdown(ctr_rows), "", "Raw figures:", "", "```json",
              json.dumps(ctr, indent=1, default=str), "```", ""]
        write_section(path, "\n".join(md), CTR_BEGIN, CTR_END)
    if dynamic is not None:   # the dynamic-table bench: a part of its own too
        loads_d = dynamic["load_average_1_5_15"]
        print(_table(dynamic_rows))
        st = dynamic["stream"]
        md = [f"Measured {time.strftime('%Y-%m-%d')} with {command}; load average (1 min) before and after "
              f"the bench {loads_d[0][0]:.1f} and {loads_d[-1][0]:.1f}. One run per figure. The stream (scale "
              f"{dynamic['scale']:g}): {st['train_rows']} training rows from {st['distinct_users']} distinct users, "
              f"{st['active_users']} active at a time, {st['next_rows']} rows of its next part held out; "
              f"{dynamic['steps']} steps of {STREAM_BATCH} examples, 2 ps + {STREAM_WORKERS} worker(s), "
              f"{STREAM_OPTIMIZER} at {STREAM_LEARNING_RATE:g}.", "", *_markdown(dynamic_rows), "", "Raw figures:", "",
              "```json",
              json.dumps(dynamic, indent=1, default=str), "```", ""]
        write_section(path, "\n".join(md), DYNAMIC_BEGIN, DYNAMIC_END)
    if dlrm is not None:   # the DLRM bench: a part of its own
        loads_l = dlrm["load_average_1_5_15"]
        print(_table(dlrm_rows))
        dd = dlrm["data"]
        md = [f"Measured {time.strftime('%Y-%m-%d')} with {command}; load average (1 min) before and after "
              f"the bench {loads_l[0][0]:.1f} and {loads_l[-1][0]:.1f}; the bench took {dlrm['bench_s']:.0f} s. "
              f"Each figure is the median of {a.repeat} run(s), the range in brackets. The data: {dd['rows']} "
              f"training rows ({dd['distinct_ids_train']} distinct ids over 26 columns), {dd['eval_rows']} held "
              f"out; {dlrm['steps']} steps of {dlrm['batch_size']} examples, Adagrad.", "",
              *_markdown(dlrm_rows), "", "Raw figures:", "", "```json", json.dumps(dlrm, indent=1, default=str),
              "```", ""]
        write_section(path, "\n".join(md), DLRM_BEGIN, DLRM_END)
    return 0


HEADER = ("benchmark", "tfps", "baseline", "ratio", "target")


def _table(rows) -> str:
    widths = [max(len(str(r[i])) for r in [HEADER, *rows]) for i in range(5)]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in [HEADER, *rows])


def _markdown(rows) -> list[str]:
    return ["| " + " | ".join(HEADER) + " |", "|" + "---|" * 5, *("| " + " | ".join(str(c) for c in r) + " |"
                                                                for r in rows)]


BEGIN, END = "<!-- bench:begin (written by bench/run.py) -->", "<!-- bench:end -->"
CTR_BEGIN, CTR_END = "<!-- bench:ctr:begin (written by bench/run.py) -->", "<!-- bench:ctr:end -->"
DYNAMIC_BEGIN = "<!-- bench:dynamic:begin (written by bench/run.py) -->"
DYNAMIC_END = "<!-- bench:dynamic:end -->"
DLRM_BEGIN, DLRM_END = "<!-- bench:dlrm:begin (written by bench/run.py) -->", "<!-- bench:dlrm:end -->"


def write_section(path: str, body: str, begin: str = BEGIN, end: str = END) -> None:
    """Replace one generated part of docs/benchmarks.md (``begin`` to ``end``), keep the
    prose and the other parts around it."""
    text = open(path).read() if os.path.exists(path) else "# Benchmarks\n"
    if begin not in text:
        text += "\n" + begin + "\n" + end + "\n"
    head, rest = text.split(begin, 1)
    tail = rest.split(end, 1)[1] if end in rest else ""
    with open(path, "w") as fh:
        fh.write(head + begin + "\n" + body + "\n" + end + tail)


if __name__ == "__main__":
    sys.exit(main())
