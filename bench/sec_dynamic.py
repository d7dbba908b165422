"""Section dynamic: wide_deep on a stream of churning users (bench/ctr_stream.py), hashed
against dynamic tables of the same memory budget. Each run is recorded as it ends;
``dynamic_rows`` makes the table from whichever runs exist.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import tempfile
import time

from procs import PY, OutOfTime, Watched, end, rss_now, sh, task_pids
from sec_basic import FIRST_RE, measure
from sec_ctr import verdict
from sec_other import CHIEF_PROGRESS_RE, local_result

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
#: chief (tfps/task/graph/tables.py), so a row lives steps_to_live plus that, and the table is
#: planned for the ids of that many steps. At scale 0.02 (steps_to_live 10) it ran every 8
#: steps with one worker (the table peaked at 3880 of its 4296 rows) but every 28 with two
#: (the table was full most of the run and had refused 17172 new ids by its first pass,
#: about 70 steps in): the chief's own runs (up to --log_steps steps each) woke the eviction.
#: Since 2026-12-07 it follows the global step (mostly 2-5 steps apart at scale 0.02, two
#: workers); the table still refuses ids in stalls of the chief's process (docs/benchmarks.md).
STREAM_EVICTION_LAG = 40


def stream_flags(kind: str, stream: dict) -> tuple[list[str], dict]:
    """The wide_deep flags of one side, and what they plan: the dynamic table's live ids and
    budget per ps, and the hashed table of the same budget (same bytes per ps task)."""
    import math

    from tfps.cluster.memory import OPTIMIZER_SLOTS, DynamicBudget
    from tfps.layers.dynamic_embedding import SHARD_SLACK, SKETCH_DEPTH, SKETCH_WIDTH
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
               replace: bool = False, keep: bool = False, deadline: float = float("inf")) -> dict:
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
        while p.popen.poll() is None:
            if time.time() > min(deadline, p.t0 + 4 * 3600):
                raise OutOfTime(f"dynamic bench, {kind}: still running when the section's budget ran out")
            if len(pids) < ps + STREAM_WORKERS:
                pids.update(task_pids(p.popen.pid))
            rss = {n: rss_now(pid) for n, pid in pids.items() if n.startswith("ps")}
            if len(rss) == ps and all(rss.values()):
                samples.append((time.time(), rss))
            time.sleep(0.25)
        res = local_result(p, d, 300, f"dynamic bench, {kind}, {ps} ps", deadline)
    finally:
        end(p.popen)
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


def bench_dynamic(ctx) -> None:
    """Hashed against dynamic tables on a stream of churning users (bench/ctr_stream.py), 2 ps +
    STREAM_WORKERS, side by side: AUC on the next part of the stream, each ps's RSS at 25 % and
    100 % of the steps, examples/s; the dynamic side again on the stream with one constant user
    (its AUC is what the model scores without learning a user: the dynamic side must beat it);
    then each kind saved at half of the steps on 2 ps and continued on 2 and on 3 (resharded):
    the two continuations' AUC."""
    from ctr_stream import generate
    scale = ctx.stream_scale if ctx.stream_scale is not None else (0.05 if ctx.quick else 1.0)
    d = tempfile.mkdtemp(prefix="tfps-bench-stream-")
    dl = ctx.deadline

    def arm(name, *args, **kw):
        return measure(ctx, name, args[0], lambda: run_stream(*args, deadline=dl, **kw), lambda x: (x["examples_s"], x))
    try:
        stream = generate(os.path.join(d, "data"), scale)
        steps = max(20, stream["train_rows"] // STREAM_BATCH)    # one pass over the stream
        why = dynamic_available()
        kinds = ["hashed"] + (["dynamic"] if why is None else [])
        ctx.info({"scale": scale, "stream": stream, "steps": steps, "dynamic_skipped": why})
        for kind in kinds:
            arm(kind, kind, stream, steps, 2, os.path.join(d, kind))
        if "dynamic" in kinds:   # the control: the same side, no user to learn
            one = constant_user_copy(stream, os.path.join(d, "one-user"))
            arm("dynamic_one_user", "dynamic", one, steps, 2, os.path.join(d, "dynamic-one-user"))
            shutil.rmtree(os.path.join(d, "one-user"), ignore_errors=True)
        files = sorted(glob.glob(stream["train_glob"]))
        lists = []
        for i, part in enumerate((files[:len(files) // 2], files[len(files) // 2:])):
            lists.append(os.path.join(d, f"half-{i}.txt"))
            with open(lists[-1], "w") as fh:
                fh.write("".join(f + "\n" for f in part))
        for kind in kinds:   # resharding: the first half on 2 ps, the second continued on 2 and on 3
            half = os.path.join(d, f"{kind}-half")
            if not arm(f"{kind}_first_half", kind, stream, steps // 2, 2, half, train_glob="@" + lists[0],
                       keep=True):
                continue
            for ps in (2, 3):
                shutil.copytree(half, f"{half}-{ps}")
                arm(f"{kind}_continued_{ps}ps", kind, stream, steps, ps, f"{half}-{ps}", train_glob="@" + lists[1],
                    replace=True)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def dynamic_rows(r: dict) -> list[tuple]:
    """The dynamic table from ``r``: the section's info (scale, stream, steps) and each run
    measured (name -> its data); a row whose runs are missing says so."""
    rows: list[tuple] = []
    for build in (_rows_stream, _rows_kinds, _rows_versus):
        try:
            build(r, rows)
        except (KeyError, TypeError, ZeroDivisionError) as e:
            rows.append((f"dynamic bench: {build.__name__[6:]}", f"not measured (missing {e})", "", "", ""))
    return rows


def _rows_stream(r: dict, rows: list) -> None:
    stream = r["stream"]
    seen = stream["users_seen"]
    rows.append(("dynamic: users seen by 25 % / 100 % of the stream", f"{seen['25%']} / {seen['100%']}",
                 f"{stream['active_users']} active at a time", f"{seen['100%'] / max(seen['25%'], 1):.2f}x",
                 ">= 3x"))


def _rows_kinds(r: dict, rows: list) -> None:
    for kind in ("hashed", "dynamic"):
        if kind not in r:
            rows.append((f"dynamic bench, {kind}", "not measured", r.get("dynamic_skipped") or "", "", ""))
            continue
        x = r[kind]
        rows.append((f"dynamic bench, {kind}: AUC on the next part, examples/s",
                     f"{x['auc_next']:.4f}, {x['examples_s']} ({x['examples_s_from']})", "", "", ""))
        m25, m100 = sum((x["ps_rss_mib_25"] or {}).values()), sum((x["ps_rss_mib_100"] or {}).values())
        rows.append((f"dynamic bench, {kind}: ps RSS at 25 % / 100 % of the steps (MiB, both ps)",
                     f"{m25} / {m100}", "", f"{m100 / max(m25, 1):.2f}x",
                     verdict(m100 / max(m25, 1), 1.25, at_most=True) if kind == "dynamic" else ""))
        c2 = (r.get(f"{kind}_continued_2ps") or {}).get("auc_next")
        c3 = (r.get(f"{kind}_continued_3ps") or {}).get("auc_next")
        if c2 is None or c3 is None:
            rows.append((f"dynamic bench, {kind}: saved on 2 ps, continued on 3 (AUC)", "not measured", "", "", ""))
            continue
        rows.append((f"dynamic bench, {kind}: saved on 2 ps, continued on 3 (AUC)", f"{c3:.4f}",
                     f"{c2:.4f} (continued on 2)", f"{c3 - c2:+.4f}",
                     f"within 0.01: {'PASS' if abs(c3 - c2) <= 0.01 else 'FAIL'}"))


def _rows_versus(r: dict, rows: list) -> None:
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
    key = "examples_s" if y["examples_s_from"] == h["examples_s_from"] == "progress lines" else "examples_s_training"
    ratio = y[key] / h[key]
    rows.append((f"dynamic vs hashed: examples/s ({'steady state' if key == 'examples_s' else 'training time'})",
                 f"{y[key]}", f"{h[key]} (hashed)", f"{ratio:.2f}x", verdict(ratio, 0.7)))
