"""Section stream (issue 48 item 6): training that follows the data, on a drifting stream.

The stream is the dynamic bench's churning users (bench/ctr_stream.py) with ads that drift
(``DRIFT``: popularity ranks rotate, biases turn), cut into files that are partitions.
Side by side, each run once a round, 2 ps + 2 workers unless said:

- **follow** (a): ``tfps local --follow`` with a dynamic table (the dynamic bench's plan)
  on a directory into which a writer thread renames the partitions while the job runs:
  ``BACKLOG`` of them before it starts, the rest one by one at ``ARRIVAL`` x the fixed-list
  job's examples/s once it reaches the backlog's end; it ends by ``--until`` the last one;
- **fixed**: the same job reading the same files as a fixed list (``--input_split queue
  --epochs 1``): the examples/s to compare with, and the feeding order "after";
- **static**: the same files, each worker its own half (``--input_split static --epochs
  1``): the feeding order "before", as issue 48 measured it;
- **stale** (b): the same job trained on the first quarter of the stream, exported and
  never updated: its export scores the rest (bench/stream_score.py);
- **ceiling** (c): one worker (1 ps + 1 worker) in stream order, a dynamic table that holds
  every id of the stream and evicts none (collision-free).

Read from each: progressive validation (tfps.task.progressive; every batch scored before
it trains) over the last ``WINDOW_SHARE`` of the stream, at the end and over time (the
TensorBoard run ``progressive``), the AUC on the next part of the stream, the lag behind
the newest partition (the chief's "stream at partition" lines against the writer's
landing times), and examples/s over the same stretch of steps (``SPEED_WINDOW``, while the
followed job trains its backlog). A plot (PNG, or CSV without matplotlib) of the AUC over
the stream goes beside the results file.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
import shutil
import tempfile
import threading
import time

from procs import PY, OutOfTime, Watched, end, sh
from sec_basic import FIRST_RE, measure
from sec_dynamic import STREAM_BATCH, stream_flags
from sec_other import local_result

#: Users and rows of bench/ctr_stream.py's stream x this (--stream_scale overrides).
SCALE, QUICK_SCALE = 0.02, 0.01
#: bench/ctr_stream.py's drift: by the stream's end the ads' biases are unrelated to its start's.
DRIFT = 1.0
#: The share of the partitions that has landed before the followed job starts: its backlog,
#: over which its examples/s is measured. The rest lands at ARRIVAL x the fixed-list job's
#: examples/s from the moment the job reaches the backlog's last partition, one at a time:
#: the live stream, over which the lag is measured. (Landing from the job's first step
#: instead, with a backlog of 10 %, the job caught up at once when the load fell between the
#: fixed-list run and it, and its examples/s was the arrival rate's.)
BACKLOG = 0.45
ARRIVAL = 0.8
#: The progressive window, as a share of the stream's training rows.
WINDOW_SHARE = 0.1
#: The held-out next part of the stream (next.csv), as a share of the stream: every side's
#: model at its end is scored on it the same way (--eval_data), 23 k rows at scale 0.02.
NEXT_SHARE = 0.1
#: The steps (shares of the run's last step) over which examples/s is compared: the followed
#: job is then still training its backlog.
SPEED_WINDOW = (0.1, 0.4)
#: Keeping up: the last partition is reached (its first slice taken) within this many seconds
#: of landing: the lister's polls (a file must keep its size for one), the feeder's tick and a
#: slice or two in flight; a job that falls behind a stream gathers a lag that grows with it.
#: (The chief's own "N partition(s) behind" counts the partitions it has listed: 0 while its
#: lister fell 100 s behind the stream, before the lister's fix of 2026-12-08.)
KEEP_UP_S = 10.0
#: --sync_timeout of every side (default 300 s): see common().
SLICE_LOST_S = 60
SIDES = ("fixed", "follow", "static", "stale", "ceiling")
STEP_RE = re.compile(r"^\[worker\d+\] .*worker\d+: step (\d+)")
AT_RE = re.compile(r"chief: stream at partition (\S+) \(slice (\d+)\); newest complete (\S+), (\d+) partition")
FINISHED_RE = re.compile(r"chief: job .* (succeeded|stopped|failed)")


class Lander(threading.Thread):
    """Renames staged partitions into the followed directory, one every ``interval`` s once started."""

    def __init__(self, staged: list[tuple[str, str]], interval: float, trigger: str = ""):
        """``trigger``: the partition (its name) whose "stream at partition" line starts the landing."""
        super().__init__(name="stream-lander", daemon=True)
        self.staged, self.interval, self.trigger = staged, interval, trigger
        self.go, self.stop = threading.Event(), threading.Event()
        self.landed: dict[str, float] = {}
        self.started_at = float("inf")   # set once the backlog has landed

    def land(self, src: str, dst: str) -> None:
        os.rename(src, dst)   # atomic: the job never sees half a partition
        self.landed[os.path.basename(dst)] = time.time()

    def run(self) -> None:
        while not self.go.wait(0.1):
            if self.stop.is_set():
                return
        for src, dst in self.staged:
            if self.stop.is_set():
                return
            self.land(src, dst)
            self.stop.wait(self.interval)


def run_job(name: str, argv: list[str], d: str, deadline: float, lander: Lander | None = None) -> dict:
    """One ``tfps local`` job in model_dir ``d``: its results, progress points, stream lines."""
    p = Watched(argv, FIRST_RE, time.time())
    try:
        while p.popen.poll() is None:
            if time.time() > deadline:
                raise OutOfTime(f"stream bench, {name}: still running when the section's budget ran out")
            if lander is not None and not lander.go.is_set() and any(
                    (m := AT_RE.search(line)) and os.path.basename(m.group(1)) == lander.trigger
                    for line in p.lines[-50:]):
                lander.go.set()
            time.sleep(0.2)
        res = local_result(p, d, 300, f"stream bench, {name}", deadline)
    finally:
        end(p.popen)
        if lander is not None:
            lander.stop.set()
    lines = list(zip(p.arrived, p.lines))
    points = [(t, int(m.group(1))) for t, line in lines if (m := STEP_RE.search(line))]
    last = res.global_step or (points[-1][1] if points else 0)
    lo, hi = (int(s * last) for s in SPEED_WINDOW)
    window = [(t, s) for t, s in points if lo <= s <= hi]
    speed = ((window[-1][1] - window[0][1]) * STREAM_BATCH / (window[-1][0] - window[0][0])
             if len(window) >= 2 and window[-1][0] > window[0][0] else None)
    prog = res.progressive
    if prog is not None and not isinstance(prog, dict):
        prog = dataclasses.asdict(prog)
    out = {"side": name, "global_step": res.global_step, "examples_s": round(speed) if speed else None,
           "examples_s_training": round(res.global_step * STREAM_BATCH / max(res.times.training_s or 0, 1e-9)),
           "training_s": res.times.training_s, "auc_next": (res.eval_metrics or {}).get("auc"),
           "auc_last_window": (prog or {}).get("auc"), "progressive": prog, "ended_by": res.ended_by,
           "stream": res.stream, "export_dir": res.export_dir}
    ev = sh([PY, os.path.join(os.path.dirname(__file__), "stream_score.py"), "--events",
             os.path.join(d, "progressive")], timeout=300)
    out["auc_points"] = json.loads(ev.stdout)["points"] if ev.returncode == 0 else []
    if lander is not None:
        out["lag"] = lag(lines, lander)
    return out


def lag(lines: list[tuple[float, str]], lander: Lander) -> dict:
    """How far the followed job ran behind the stream: for each partition that landed while it
    ran, the seconds from its landing to the job reaching it (the chief's "stream at
    partition" line: listed, counted, queued, taken), and the partitions behind then."""
    live = {n: t for n, t in lander.landed.items() if t > lander.started_at}
    reached = []
    for t, line in lines:
        m = AT_RE.search(line)
        if m and os.path.basename(m.group(1)) in live:
            reached.append((os.path.basename(m.group(1)), t - live[os.path.basename(m.group(1))], int(m.group(4))))
    names = sorted(live)
    finish = next((t for t, line in lines if FINISHED_RE.search(line)), None)
    last_lag = next((s for n, s, _ in reached if n == names[-1]), None) if names else None
    caught = next((i for i, (_, _, b) in enumerate(reached) if b == 0), len(reached))
    after = reached[caught:]
    typical = sorted(s for _, s, _ in after)[len(after) // 2] if after else None
    return {"partitions_live": len(names), "interval_s": round(lander.interval, 2),
            "seconds": [round(s, 2) for _, s, _ in reached], "behind": [b for _, _, b in reached],
            "caught_up_at": reached[caught][0] if after else None,
            "max_behind_after_caught_up": max((b for _, _, b in after), default=None),
            "median_lag_after_caught_up_s": round(typical, 2) if typical is not None else None,
            "last_partition_lag_s": round(last_lag, 2) if last_lag is not None else None,
            "last_landed_to_job_end_s": round(finish - live[names[-1]], 1) if finish and names else None}


def common(stream: dict, d: str, window: int, steps: int) -> list[str]:
    return ["--model_dir", d, "--eval_data", stream["next_csv"], "--progressive_window", str(window),
            "--log_steps", str(max(5, steps // 60)), "--summary_steps", str(max(5, steps // 60)),
            "--checkpoint_steps", str(steps * 10),
            # A slice its worker lost (taken, never trained: seen under load 50, issue 48's
            # report) goes to another worker once that worker made no step for this long.
            "--sync_timeout", str(SLICE_LOST_S)]


def one_round(ctx, stream: dict, files: list[str], root: str, r: int) -> None:
    """Every side once; the followed job's arrival rate from this round's fixed-list job."""
    flags, plan = stream_flags("dynamic", stream)
    steps = stream["train_rows"] // STREAM_BATCH
    window = max(STREAM_BATCH, int(WINDOW_SHARE * stream["train_rows"]))
    rows_per_file = stream["train_rows"] / len(files)
    local = [PY, "-m", "tfps", "local", "--ps", "2", "--workers", "2", *flags]
    fin = ["--epochs", "1", "--train_steps", str(steps * 2)]
    quarter = os.path.join(root, f"quarter-{r}")   # the slice queue reads a glob, not a list (@FILE)
    os.makedirs(quarter)
    for f in files[:len(files) // 4]:
        os.link(f, os.path.join(quarter, os.path.basename(f)))

    def job(name, argv, lander=None):
        d = os.path.join(root, f"{name}-{r}")
        try:
            return run_job(name, [*argv, *common(stream, d, window, steps)], d, ctx.deadline, lander)
        finally:
            if name != "stale":
                shutil.rmtree(d, ignore_errors=True)

    def value(x):
        return x["auc_last_window"], x
    fixed = measure(ctx, "stream", "fixed", lambda: job("fixed", [*local, "--train_data", stream["train_glob"],
                                                                   "--input_split", "queue", *fin]), value)
    speed = (fixed or {}).get("examples_s") or (fixed or {}).get("examples_s_training")
    if speed:
        follow_dir, staging = os.path.join(root, f"stream-{r}"), os.path.join(root, f"staging-{r}")
        os.makedirs(follow_dir)
        os.makedirs(staging)
        staged = []
        for f in files:   # hard links: the fixed-list jobs keep their files
            os.link(f, os.path.join(staging, os.path.basename(f)))
            staged.append((os.path.join(staging, os.path.basename(f)),
                           os.path.join(follow_dir, "part-" + os.path.basename(f)[len("train-"):])))
        k0 = max(1, int(BACKLOG * len(files)))
        lander = Lander(staged[k0:], rows_per_file / (ARRIVAL * speed), os.path.basename(staged[k0 - 1][1]))
        for src, dst in staged[:k0]:
            lander.land(src, dst)
        lander.started_at = time.time()
        lander.start()
        measure(ctx, "stream", "follow", lambda: job("follow", [
            *local, "--train_data", os.path.join(follow_dir, "part-*.csv"), "--follow",
            "--until", staged[-1][1], "--stall_timeout", "0"], lander),
            lambda x: (x["auc_last_window"], {**x, "arrival_examples_s": round(ARRIVAL * speed)}))
    measure(ctx, "stream", "static", lambda: job("static", [*local, "--train_data", stream["train_glob"],
                                                             "--input_split", "static", *fin]), value)
    stale = measure(ctx, "stream", "stale", lambda: job("stale", [
        *local, "--train_data", os.path.join(quarter, "train-*.csv"), "--input_split", "queue", *fin]), value)
    if stale:
        first = files[:len(files) // 4]
        start = sum(count_rows(f) for f in first)
        sc = sh([PY, os.path.join(os.path.dirname(__file__), "stream_score.py"),
                 stale["export_dir"], str(window), str(start), *files[len(first):]],
                timeout=900, deadline=ctx.deadline)
        shutil.rmtree(os.path.join(root, f"stale-{r}"), ignore_errors=True)
        if sc.returncode == 0:
            scored = json.loads(sc.stdout.strip().splitlines()[-1])
            ctx.out.run(ctx.section, "stream", "stale_scored", "ok", scored["last"],
                        {"points": scored["points"], "trained_rows": start})
        else:
            ctx.out.run(ctx.section, "stream", "stale_scored", "failed", why=sc.stderr[-1500:])
    everything = list(flags)
    i = everything.index("--expected_ids")
    everything[i + 1] = str(int(1.1 * (stream["distinct_users"] + stream["ads"] + stream["sites"])))
    j = everything.index("--steps_to_live")
    everything[j + 1] = "0"
    measure(ctx, "stream", "ceiling", lambda: job("ceiling", [
        PY, "-m", "tfps", "local", "--ps", "1", "--workers", "1", *everything, "--train_data", stream["train_glob"],
        "--input_split", "queue", *fin]), value)
    ctx.info({"round": r, "plan": plan, "window": window, "steps": steps})


def count_rows(path: str) -> int:
    with open(path, "rb") as fh:
        return sum(1 for _ in fh) - 1


def bench_stream(ctx) -> None:
    """Rounds of every side (module doc) while the budget allows another round."""
    from ctr_stream import generate
    scale = ctx.stream_scale if ctx.stream_scale is not None else (QUICK_SCALE if ctx.quick else SCALE)
    root = tempfile.mkdtemp(prefix="tfps-bench-follow-")
    try:
        stream = generate(os.path.join(root, "data"), scale, drift=DRIFT, next_share=NEXT_SHARE)
        files = sorted(glob.glob(stream["train_glob"]))
        ctx.info({"scale": scale, "drift": DRIFT, "stream": stream, "backlog": BACKLOG, "arrival": ARRIVAL,
                  "window_share": WINDOW_SHARE, "speed_window": SPEED_WINDOW, "files": len(files)})
        for r in range(ctx.repeat):
            t0 = time.time()
            one_round(ctx, stream, files, root, r)
            if time.time() + 1.1 * (time.time() - t0) > ctx.deadline:
                break
        plot(ctx)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def plot(ctx) -> None:
    """The AUC over the stream of every side of the first round, beside the results file."""
    from results import load
    records = [x for x in load(ctx.out.path) if x.get("type") == "run" and x.get("section") == ctx.section
               and x.get("outcome") == "ok"]
    series = curves(records)
    base = os.path.splitext(ctx.out.path)[0] + "-stream"
    with open(base + ".csv", "w") as fh:
        fh.write("side,stream_rows,auc\n")
        for side, pts in series.items():
            fh.writelines(f"{side},{x},{y}\n" for x, y in pts)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for side, pts in series.items():
        ax.plot([x for x, _ in pts], [y for _, y in pts], label=side, marker=".", markersize=3)
    ax.set_xlabel("stream position (training rows)")
    ax.set_ylabel("progressive AUC, last window")
    ax.set_title("following a drifting stream")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(base + ".png", dpi=90)


LABELS = {"follow": "(a) tfps --follow, dynamic", "stale_scored": "(b) first quarter, never updated",
          "ceiling": "(c) one worker, collision-free", "static": "static halves", "fixed": "fixed list (queue)"}


def curves(records: list[dict]) -> dict[str, list[tuple[float, float]]]:
    """The first ok run of each side: [(stream rows, AUC)]; a job's steps scaled to the stream's rows."""
    out = {}
    for rec in records:
        side, data = rec["side"], rec.get("data") or {}
        if LABELS.get(side) in out or side not in LABELS:
            continue
        if side == "stale_scored":
            pts = [(x, y) for x, y in data.get("points", []) if y is not None]
        else:
            pts, last = data.get("auc_points") or [], data.get("global_step") or 1
            rows = (data.get("stream") or {}).get("examples") or last * STREAM_BATCH
            pts = [(round(s / last * rows), y) for s, y in pts]
        out[LABELS[side]] = pts
    return out


def stream_rows(records: list[dict]) -> list[tuple]:
    """The stream table: medians over the rounds of each side (bench/results.py's figures)."""
    from report import _cell
    from results import figures, median
    fs = {side: f for (fig, side), f in figures(records, "stream").items() if fig == "stream"}

    def med(side, key):
        f = fs.get(side)
        vals = [x[key] for x in (f.data() if f else []) if isinstance(x.get(key), (int, float))]
        return median(vals) if vals else None

    def fmt(v, f="{:.4f}"):
        return "not measured" if v is None else f.format(v)
    a, b, c = fs.get("follow"), fs.get("stale_scored"), fs.get("ceiling")
    rows = []
    am, bm, cm = (f.med() if f else None for f in (a, b, c))
    an, bn, cn = med("follow", "auc_next"), med("stale", "auc_next"), med("ceiling", "auc_next")
    rows.append(("(a) follow vs (c) one worker, collision-free: progressive AUC, last window", _cell(a, "{:.4f}"),
                 _cell(c, "{:.4f}") + " (c)", fmt(am - cm if None not in (am, cm) else None, "{:+.4f}"),
                 _verdict(am is not None and cm is not None and am >= cm - 0.01, "within 0.01")))
    rows.append(("(a) follow vs (c): AUC on the next part of the stream (held out)", fmt(an), fmt(cn) + " (c)",
                 fmt(an - cn if None not in (an, cn) else None, "{:+.4f}"),
                 _verdict(an is not None and cn is not None and an >= cn - 0.01, "within 0.01")))
    rows.append(("(a) follow vs (b) first quarter, never updated: AUC, last window ((b): its export)",
                 _cell(a, "{:.4f}"), _cell(b, "{:.4f}") + " (b)", fmt(am - bm if None not in (am, bm) else None,
                                                                     "{:+.4f}"),
                 _verdict(am is not None and bm is not None and am - bm >= 0.02, ">= +0.02")))
    rows.append(("(a) follow vs (b): AUC on the next part of the stream (held out)", fmt(an), fmt(bn) + " (b)",
                 fmt(an - bn if None not in (an, bn) else None, "{:+.4f}"),
                 _verdict(an is not None and bn is not None and an - bn >= 0.02, ">= +0.02")))
    lags = [x.get("lag") or {} for x in (a.data() if a else [])]
    last = [x["last_partition_lag_s"] for x in lags if x.get("last_partition_lag_s") is not None]
    every = [x["interval_s"] for x in lags if x.get("interval_s")]
    behind = [max(x["behind"]) for x in lags if x.get("behind")]
    typical = [median(x["seconds"]) for x in lags if x.get("seconds")]
    ok = bool(last) and max(last) <= KEEP_UP_S
    rows.append((f"(a) lag behind the stream arriving at {ARRIVAL}x the fixed list's examples/s: last partition "
                 "landed -> reached (s)", fmt(median(last) if last else None, "{:.1f}"),
                 f"median {fmt(median(typical) if typical else None, '{:.1f}')} s; a partition every "
                 f"{fmt(median(every) if every else None, '{:.2f}')} s", f"at most "
                 f"{max(behind) if behind else '?'} partitions behind", _verdict(ok, f"<= {KEEP_UP_S:g} s")))
    fa, ff = med("follow", "examples_s"), med("fixed", "examples_s")
    rows.append((f"(a) follow vs fixed list: examples/s, steps {SPEED_WINDOW[0]:.0%}-{SPEED_WINDOW[1]:.0%} "
                 "(backlog)", fmt(fa, "{:.0f}"), fmt(ff, "{:.0f}") + " (fixed)",
                 fmt(fa / ff if fa and ff else None, "{:.2f}x"), _verdict(bool(fa and ff) and fa >= 0.9 * ff,
                                                                          ">= 0.9x")))
    for key, what in (("auc_last_window", "progressive AUC, last window"), ("auc_next", "AUC on the next part")):
        q, s = med("fixed", key), med("static", key)
        rows.append((f"feeding order: queue (after) vs static halves (before): {what}", fmt(q), fmt(s) + " (static)",
                     fmt(q - s if None not in (q, s) else None, "{:+.4f}"), ""))
    return rows


def _verdict(ok: bool, target: str) -> str:
    return f"{target}: {'PASS' if ok else 'FAIL'}"
