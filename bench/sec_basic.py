"""Sections start-up and throughput: tfps local against the classic script and one process.

A classic run whose worker trains nothing in a stated window after the other worker's
first step (MonitoredTrainingSession's readiness race: the non-chief found the model not
ready and sleeps 30 s, or the sync chief waits for a gradient nobody will send) is a
measured outcome: recorded as ``hung``, counted beside the figure, never retried, and the
bench moves on. tfps's runs are judged by the same rule.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import tempfile
import time

from procs import PY, ROOT, OutOfTime, Watched, end, sh
from results import CUT, FAILED, HUNG, OK

from tfps.cluster import local_plan
from tfps.outcome.contract import JobResult

FIRST_RE = re.compile(r"\[(worker\d+)\].*first training step done")
CLASSIC_FIRST_RE = re.compile(r"BENCH (first)_step")
#: A worker that has not made its first step this long after the other worker's first step
#: is hung (and so is a classic sync chief that has not ended this long after the other
#: worker ended). Issue 52: each hang had cost 60 s and a retry, 7 times in one bench.
HANG_WINDOW_SECS = 15
#: MonitoredTrainingSession's readiness poll (SessionManager's recovery_wait_secs): in the
#: start-up section the classic non-chief's 30 s wait is the figure measured, so a worker
#: is hung there only HANG_WINDOW_SECS after that.
CLASSIC_POLL_SECS = 30
#: Start-up flips between runs (gRPC reconnect back-off, the classic 30 s readiness poll):
#: its medians come from at least this many rounds when the budget allows.
STARTUP_MIN_RUNS = 5


class Hung(Exception):
    """A run stalled: a worker trained nothing within the window (the message says how)."""


def watch_workers(first_steps, ended, alive, t0: float, workers: int, window: float, deadline: float,
                  end_window: float | None = None, stop_at_first: bool = False) -> None:
    """Wait until every worker has ended (or, ``stop_at_first``, made its first step).
    ``first_steps()``: worker -> its first step, seconds after ``t0``; ``ended()``: worker ->
    when it ended (time.time()); ``alive()``: whether the run still runs. Raises Hung when a
    worker trained nothing ``window`` s after another's first step, or (``end_window``) had
    not ended ``end_window`` s after another ended; OutOfTime past ``deadline``."""
    while True:
        now, firsts, ends = time.time(), first_steps(), ended()
        if len(firsts) == workers and (stop_at_first or len(ends) == workers):
            return
        if not alive():
            return
        if firsts and len(firsts) < workers and now - t0 - min(firsts.values()) > window:
            lead = min(firsts, key=firsts.get)
            raise Hung(f"a worker trained 0 steps in the {window:.0f} s after {lead}'s first step")
        if end_window is not None and ends and len(ends) < workers and now - min(ends.values()) > end_window:
            raise Hung(f"a worker had not ended {end_window:.0f} s after {min(ends, key=ends.get)} ended")
        if now > deadline:
            raise OutOfTime("the section's budget ran out during the run")
        time.sleep(0.2)


# ---------------------------------------------------------------------------- tfps side
def run_tfps(steps, batch, model="mlp", sync=False, extra=(), deadline=float("inf"), window=HANG_WINDOW_SECS,
             stop_at_first=False) -> dict:
    """``tfps local --ps 1 --workers 2``: each worker's first step (s after the launch) and,
    run to its end, examples/s and the final save from results.json."""
    d = tempfile.mkdtemp(prefix="tfps-bench-")
    t0 = time.time()
    p = Watched([PY, "-m", "tfps", "local", "--ps", "1", "--workers", "2", "--model", model,
                 "--train_steps", str(steps), "--batch_size", str(batch), "--model_dir", d, "--log_steps", "100",
                 *(["--sync_replicas"] if sync else []), *extra], FIRST_RE, t0)
    try:
        watch_workers(lambda: dict(p.seen), lambda: {}, lambda: p.popen.poll() is None, t0, 2, window, deadline,
                      stop_at_first=stop_at_first)
        if stop_at_first and len(p.seen) == 2:
            return {"first": dict(p.seen)}
        out = p.wait(3600, deadline)
        if p.popen.returncode != 0:
            raise RuntimeError(f"tfps local ({model}) failed ({p.popen.returncode}):\n{out[-3000:]}")
        res = JobResult.load(os.path.join(d, "results.json"))
    finally:
        end(p.popen)
        shutil.rmtree(d, ignore_errors=True)
    factor = 2 if sync else 1
    return {"first": dict(p.seen), "examples_s": res.global_step * batch * factor / res.times.training_s,
            "final_save_s": res.times.final_save_s, "wall": time.time() - t0, "results": res}


# ------------------------------------------------------------------------- classic side
def classic_argv(t, plan, steps, batch=64, model="mlp", sync=False) -> list[str]:
    return [PY, os.path.join(ROOT, "bench", "classic_replica.py"), *plan.task_ref(t).to_flags(),
            "--train_steps", str(steps), "--batch_size", str(batch), "--model", model,
            *(["--sync_replicas"] if sync else [])]


def run_classic(steps, batch, model="mlp", sync=False, deadline=float("inf"), window=HANG_WINDOW_SECS,
                stop_at_first=False) -> dict:
    """bench/classic_replica.py as 1 ps + 2 worker processes started at once: each worker's
    first step (s after the launch) and examples/s (the chief's global steps from its first
    step to its last). Hung (see watch_workers) when a worker trains nothing in ``window``
    or the sync chief does not end within HANG_WINDOW_SECS of the other worker."""
    plan = local_plan(1, 2)
    t0 = time.time()
    procs = {t.name: Watched(classic_argv(t, plan, steps, batch, model, sync), CLASSIC_FIRST_RE, t0)
             for t in plan.tasks}
    workers = {n: w for n, w in procs.items() if n.startswith("worker")}
    ends: dict[str, float] = {}

    def ended():
        for n, w in workers.items():
            if n not in ends and w.popen.poll() is not None:
                ends[n] = time.time()
        return dict(ends)
    try:
        try:
            watch_workers(lambda: {n: w.seen["first"] for n, w in workers.items() if "first" in w.seen}, ended,
                          lambda: not any(w.popen.poll() for w in workers.values()),   # none failed
                          t0, 2, window, deadline, end_window=None if stop_at_first else HANG_WINDOW_SECS,
                          stop_at_first=stop_at_first)
        except Hung as e:
            raise Hung(f"{e}; {trained(workers, steps)}") from None
        first = {n: w.seen["first"] for n, w in workers.items() if "first" in w.seen}
        if stop_at_first and len(first) == 2:
            return {"first": first}
        for n, w in workers.items():
            if w.popen.poll() != 0:
                raise RuntimeError(f"classic {n} failed ({w.popen.poll()}):\n{w.text()[-3000:]}")
        outs = {n: w.wait(60) for n, w in workers.items()}
    finally:
        for w in procs.values():        # the classic ps never exits: it has to be ended
            end(w.popen)
    for n, out in outs.items():
        if "BENCH done" not in out:
            raise RuntimeError(f"classic {n} printed no BENCH done line:\n{out[-3000:]}")
    return {"first": first, "examples_s": classic_examples_s(outs["worker0"], batch, sync)}


def trained(workers: dict[str, Watched], steps: int) -> str:
    """What each classic worker trained, from its BENCH lines: ``worker0 trained 1498 of 1500
    steps, worker1 0`` (a worker's steps: the global steps from its first step to its last)."""
    parts = []
    for n, w in workers.items():
        out = w.text()
        m = re.search(r"BENCH first_step [\d.]+ (\d+)", out)
        d = re.search(r"BENCH done (\d+) ", out)
        if not m:
            parts.append(f"{n} made no step")
        elif d:
            parts.append(f"{n} ended at global step {d.group(1)} of {steps}, its first at {m.group(1)}")
        else:
            parts.append(f"{n} started at global step {m.group(1)} of {steps}, not ended")
    return ", ".join(parts)


def classic_examples_s(out: str, batch: int, sync: bool) -> float:
    """examples/s from the chief's BENCH lines: the global steps from its first step to its
    last, over that time (a sync step aggregates both workers' batches)."""
    m = re.search(r"BENCH first_step ([\d.]+) (\d+)", out)
    d = re.search(r"BENCH done (\d+) ([\d.]+) ([\d.]+)", out)
    if not (m and d):
        raise RuntimeError(f"the classic chief printed no BENCH lines:\n{out[-3000:]}")
    steps = int(d.group(1)) - int(m.group(2))
    return steps * batch * (2 if sync else 1) / max(float(d.group(3)) - float(d.group(2)), 1e-9)


def run_single(steps, batch, model="mlp", deadline=float("inf")) -> dict:
    p = sh([PY, os.path.join(ROOT, "bench", "single.py"), "--train_steps", str(steps),
            "--batch_size", str(batch), "--model", model], deadline=deadline)
    d = re.search(r"BENCH done (\d+) ([\d.]+) ([\d.]+)", p.stdout)
    if not d:
        raise RuntimeError(p.stdout[-2000:] + p.stderr[-2000:])
    return {"examples_s": int(d.group(1)) * batch / (float(d.group(3)) - float(d.group(2)))}


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def run_ps_first(kind: str, steps: int, deadline=float("inf"), window=CLASSIC_POLL_SECS + HANG_WINDOW_SECS) -> dict:
    """The cluster as an orchestrator or a user starts it: the ps is serving, then both
    workers start at the same moment (tfps: `tfps run` per task, as in the containers).
    Each worker's first training step, in seconds after the workers' launch; the run is
    ended once both have made it."""
    plan = local_plan(1, 2)
    d = tempfile.mkdtemp(prefix="tfps-bench-")

    def argv(t):
        if kind == "tfps":
            return [PY, "-m", "tfps", "run", *plan.task_ref(t).to_flags(), "--train_steps", str(steps),
                    "--model_dir", d, "--log_steps", "100"]
        return classic_argv(t, plan, steps)

    first_line = re.compile(r"(first) training step done" if kind == "tfps" else r"BENCH (first)_step")
    ps = [t for t in plan.tasks if t.job == "ps"][0]
    procs = {"ps0": Watched(argv(ps), first_line, time.time())}
    try:
        while not _port_open(ps.port):
            if time.time() > min(deadline, procs["ps0"].t0 + 120) or procs["ps0"].popen.poll() is not None:
                raise RuntimeError(f"{kind} ps did not start:\n{procs['ps0'].text()[-2000:]}")
            time.sleep(0.1)
        t0 = time.time()
        for t in plan.tasks:
            if t.job == "worker":
                procs[t.name] = Watched(argv(t), first_line, t0)
        ws = {n: procs[n] for n in ("worker0", "worker1")}
        # A worker that ended (the chief may train every step while the other sleeps its
        # readiness poll) is no failure: only one that failed ends the wait early.
        watch_workers(lambda: {n: w.seen["first"] for n, w in ws.items() if "first" in w.seen}, lambda: {},
                      lambda: not any(w.popen.poll() for w in ws.values()), t0, 2, window, deadline,
                      stop_at_first=True)
        first = {n: w.seen.get("first") for n, w in ws.items()}
    finally:
        for pr in procs.values():
            end(pr.popen)
        shutil.rmtree(d, ignore_errors=True)
    for n, f in first.items():
        if f is None:
            raise RuntimeError(f"{kind} {n} did not train:\n{procs[n].text()[-3000:]}")
    return first


def measure(ctx, figure: str, side: str, run, value) -> dict | None:
    """Run ``run()`` once for ``side`` of ``figure`` and record it at once: ok with
    ``value(result)``, hung or failed (the bench moves on); the result, None unless ok.
    OutOfTime (the budget) propagates: the section ends."""
    ctx.check()
    try:
        r = run()
    except OutOfTime as e:
        ctx.out.run(ctx.section, figure, side, CUT, why=str(e))
        raise
    except Hung as e:
        ctx.out.run(ctx.section, figure, side, HUNG, why=str(e))
        return None
    except RuntimeError as e:
        head, _, tail = str(e).partition("\n")    # what failed, then the output's tail
        ctx.out.run(ctx.section, figure, side, FAILED, why=f"{head[:500]}\n{tail[-1400:]}" if tail else head[:1900])
        return None
    v, data = value(r)
    ctx.out.run(ctx.section, figure, side, OK, v, data)
    return r


# ------------------------------------------------------------------------------ benches
def bench_startup(ctx) -> None:
    """Rounds of the four start-ups, tfps and classic alternating (same load for both),
    ``max(repeat, STARTUP_MIN_RUNS)`` of them or as many as the budget allows. Runs end
    once every worker has made its first step."""
    steps = 300 if ctx.quick else 600
    window = CLASSIC_POLL_SECS + HANG_WINDOW_SECS

    def both(r):
        return max(r["first"].values()), {"first": r["first"]}

    def serving(r):
        return max(r.values()), {"first": r, "join_s": r["worker1"] - r["worker0"]}
    for _ in range(max(ctx.repeat, STARTUP_MIN_RUNS)):
        kw = {"deadline": ctx.deadline, "window": window, "stop_at_first": True}
        measure(ctx, "all_at_once", "tfps", lambda: run_tfps(steps, 64, **kw), both)
        measure(ctx, "all_at_once", "classic", lambda: run_classic(steps, 64, **kw), both)
        # The non-chief's join, with the ps already serving when the workers start: the classic
        # non-chief then finds the model not yet initialised and sleeps MonitoredTrainingSession's
        # 30 s; started all at once (above), both wait for the ps and the poll may not show.
        for kind in ("tfps", "classic"):
            r = measure(ctx, "ps_serving", kind, lambda: run_ps_first(kind, steps, ctx.deadline, window), serving)
            if r:
                ctx.out.run(ctx.section, "ps_serving_join", kind, OK, r["worker1"] - r["worker0"], derived=True)


def bench_throughput(ctx) -> None:
    """examples/s of one process, tfps and the classic loop, interleaved; ``repeat``
    rounds over every model and mode, so that a budget that runs out leaves each of them
    measured as often as the others (give or take one)."""
    configs = [(model, steps, sync) for model, steps in (("mlp", 1500 if ctx.quick else 4000),
                                                         ("cnn", 300 if ctx.quick else 800))
               for sync in (False, True)]
    for _ in range(ctx.repeat):
        for model, steps, sync in configs:
            fig = f"{model}-{'sync' if sync else 'async'}"
            if not sync:    # one process has no sync mode: measured once per model and round
                measure(ctx, f"{model}-single", "single", lambda: run_single(steps, 64, model, ctx.deadline),
                        lambda r: (r["examples_s"], None))
            measure(ctx, fig, "tfps", lambda: run_tfps(steps, 64, model, sync, deadline=ctx.deadline),
                    lambda r: (r["examples_s"], {"first": r["first"]}))
            measure(ctx, fig, "classic", lambda: run_classic(steps, 64, model, sync, deadline=ctx.deadline),
                    lambda r: (r["examples_s"], {"first": r["first"]}))
