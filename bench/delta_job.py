"""One measurement of delta checkpoints (bench section delta, bench/sec_delta.py), in one process.

Two ps (``tf.distribute.Server``s in this process, on loopback) hold one dynamic table
(tfps.layers.DynamicTable, Adagrad) of ROWS live rows, filled by training lookups. Then:
a full checkpoint (the job's Saver, as the chief's CheckpointSaverHook writes it); then
DELTAS rounds of "train ~CHANGE of the rows in STEPS steps, save a delta" (tfps.task.output.delta_hook, as the
chief writes it); then a full checkpoint at the last delta's step, for the comparison.
Each save runs between two training steps of the one training loop, as the hooks do on
the chief: the pause is the gap it makes between two steps, less a step's median time.
Restore: the full checkpoint alone (Saver.restore), against full + DELTAS deltas
(tfps.task.output.delta.consolidate, then Saver.restore of what it wrote).

    python bench/delta_job.py [--rows 2000000] [--dim 16] [--change 0.01] [--deltas 3] [--steps 120]

Prints one JSON line of figures.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bytes(prefix: str) -> int:
    return sum(os.path.getsize(f) for f in glob.glob(prefix + ".*") if not f.endswith(".meta"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--change", type=float, default=0.01)
    ap.add_argument("--deltas", type=int, default=3)
    ap.add_argument("--steps", type=int, default=500,
                    help="training steps between two saves (more than the in-flight margin of 100 global steps)")
    ap.add_argument("--dir", default=None)
    a = ap.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf

    from tfps.layers import dynamic_embedding as de
    from tfps.layers import table_restore
    from tfps.task.output import delta
    from tfps.task.output.delta_hook import DeltaCheckpointHook
    v1 = tf.compat.v1
    v1.disable_eager_execution()
    cluster = tf.train.ClusterSpec({"ps": [f"127.0.0.1:{_port()}", f"127.0.0.1:{_port()}"],
                                    "worker": [f"127.0.0.1:{_port()}"]})
    config = v1.ConfigProto(inter_op_parallelism_threads=2, intra_op_parallelism_threads=2)
    servers = [tf.distribute.Server(cluster, job_name="ps", task_index=i, config=config) for i in range(2)]
    chief = tf.distribute.Server(cluster, job_name="worker", task_index=0, config=config)
    work = a.dir or tempfile.mkdtemp(prefix="tfps-bench-delta-")
    model_dir = os.path.join(work, "model")
    os.makedirs(model_dir, exist_ok=True)
    g = tf.Graph()
    with g.as_default():
        with tf.device("/job:ps/task:0"):
            step = v1.train.get_or_create_global_step()
        ids = v1.placeholder(tf.int64, [None])
        table = de.DynamicTable(a.dim, devices=["/job:ps/task:0", "/job:ps/task:1"], name="emb",
                                capacity=int(a.rows * 1.05))
        with tf.device("/job:worker/task:0"):
            rows = table.lookup(ids, training=True)
            loss = tf.reduce_sum(rows)
        train = v1.train.AdagradOptimizer(0.05).minimize(loss, global_step=step)
        hook = DeltaCheckpointHook(model_dir, secs=0, name="bench")
        hook.begin()
        saver = table_restore.job_saver(g, None)
        init = [v1.global_variables_initializer(), v1.local_variables_initializer()]
    rng = np.random.default_rng(7)
    keys = np.unique(rng.integers(0, 2**62, int(a.rows * 1.01) + 10, dtype=np.int64))
    keys = rng.permutation(keys)[:a.rows]
    out: dict = {"rows": a.rows, "dim": a.dim, "change": a.change, "deltas": a.deltas}
    steps_s: list[float] = []
    with v1.Session(chief.target, graph=g, config=config) as sess:
        sess.run(init)
        t0 = time.monotonic()
        for chunk in np.array_split(keys, max(1, a.rows // 100_000)):
            sess.run(train, {ids: chunk})
        out["fill_s"] = round(time.monotonic() - t0, 1)
        per_step = max(1, int(a.rows * a.change / a.steps))   # ~change of the rows between two saves

        def one_step():
            t = time.monotonic()
            sess.run(train, {ids: keys[rng.integers(0, len(keys), per_step)]})
            steps_s.append(time.monotonic() - t)

        def timed_save(fn):
            """The save between two steps: (its seconds, the gap it made between the steps)."""
            one_step()
            before = time.monotonic()
            t = time.monotonic()
            result = fn()
            took = time.monotonic() - t
            one_step()
            gap = time.monotonic() - before - steps_s[-1]
            return result, took, gap

        for _ in range(a.steps):
            one_step()
        gstep = int(sess.run(step))
        full, out["full_save_s"], full_gap = timed_save(
            lambda: saver.save(sess, os.path.join(model_dir, "model.ckpt"), global_step=gstep + 1))
        hook.full_saved(full, gstep + 1)
        out["full_bytes"] = _bytes(full)
        out["live_rows"] = int(sess.run(table.stats_op())[:, 0].sum())
        deltas = []
        for _ in range(a.deltas):
            for _ in range(a.steps):
                one_step()
            manifest, took, gap = timed_save(lambda: hook.save(sess))
            deltas.append({"bytes": delta.nbytes(manifest), "save_s": took, "gap_s": gap,
                           "rows": sum(t["rows"] for t in manifest["tables"].values()),
                           "first": manifest["sequence"] == 1})
        step_med = statistics.median(steps_s)
        out["step_s"] = round(step_med, 3)
        out["full_pause_s"] = round(full_gap, 3)
        later = [d for d in deltas if not d["first"]] or deltas
        out["delta_bytes"] = int(statistics.median(d["bytes"] for d in later))
        out["first_delta_bytes"] = deltas[0]["bytes"]
        out["delta_rows"] = int(statistics.median(d["rows"] for d in later))
        out["delta_save_s"] = round(statistics.median(d["save_s"] for d in later), 3)
        out["first_delta_save_s"] = round(deltas[0]["save_s"], 3)
        out["delta_pause_s"] = round(statistics.median(d["gap_s"] for d in later), 3)
        t = time.monotonic()
        saver.restore(sess, full)
        out["restore_full_s"] = round(time.monotonic() - t, 2)
        # the chain again (the restore above took the table back to the full checkpoint's state)
    with v1.Session(chief.target, graph=g, config=config) as sess:
        t = time.monotonic()
        path = delta.consolidate(model_dir)
        out["consolidate_s"] = round(time.monotonic() - t, 2)
        saver.restore(sess, path)
        out["restore_deltas_s"] = round(time.monotonic() - t, 2)
    out["bytes_ratio"] = round(out["delta_bytes"] / out["full_bytes"], 4)
    out["save_ratio"] = round(out["delta_save_s"] / out["full_save_s"], 4)
    out["pause_ratio"] = round(out["delta_pause_s"] / max(out["full_pause_s"], 1e-6), 4)
    print(json.dumps(out), flush=True)
    if not a.dir:
        shutil.rmtree(work, ignore_errors=True)
    del servers
    return 0


if __name__ == "__main__":
    sys.exit(main())
