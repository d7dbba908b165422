"""The baseline: a classic ps/worker script in the style of TensorFlow's mnist_replica.py.

What users run today before tfps: classic flags, ``replica_device_setter``, device
filters, ``MonitoredTrainingSession`` (non-chief workers poll the chief every 30 s),
batches fed through ``feed_dict`` from NumPy, and a ps that blocks in ``server.join()``
forever. It trains the same model (``tfps.models``) on the same data as tfps so that the
benchmark compares the machinery, not the model. Prints machine-readable lines:

    BENCH first_step <unix time> <global step after it>
    BENCH done <global step> <first step unix time> <end unix time>
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import tensorflow as tf

from tfps import models
from tfps.data import dataset as data
from tfps.models import demo

v1 = tf.compat.v1
v1.disable_eager_execution()


def load(model: str):
    train_glob, _ = demo.demo_globs(model)
    schema = data.infer_schema(train_glob)
    if schema.fmt == "csv":
        arr = np.concatenate([np.loadtxt(f, delimiter=",", skiprows=1, dtype=np.float32) for f in schema.files])
        return schema, arr[:, :-1], arr[:, -1].astype(np.int64)
    xs, ys = zip(*(data._load_npz(f, "label", "train_data") for f in schema.files))
    return schema, np.concatenate(xs), np.concatenate(ys).astype(np.int64)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--ps_hosts", required=True)
    p.add_argument("--worker_hosts", required=True)
    p.add_argument("--job_name", required=True)
    p.add_argument("--task_index", type=int, default=0)
    p.add_argument("--train_steps", type=int, default=1000)
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--learning_rate", type=float, default=0.01)
    p.add_argument("--sync_replicas", action="store_true")
    p.add_argument("--model", default="mlp")
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    cluster = tf.train.ClusterSpec({"ps": a.ps_hosts.split(","), "worker": a.worker_hosts.split(",")})
    config = v1.ConfigProto(intra_op_parallelism_threads=a.threads, inter_op_parallelism_threads=a.threads,
                            device_filters=["/job:ps", f"/job:worker/task:{a.task_index}"])
    server = tf.distribute.Server(cluster, job_name=a.job_name, task_index=a.task_index, config=config)
    if a.job_name == "ps":
        server.join()
        return 0
    n_workers = len(a.worker_hosts.split(","))
    schema, x_all, y_all = load(a.model)
    x_all, y_all = x_all[a.task_index::n_workers], y_all[a.task_index::n_workers]
    params = models.ModelParams(schema.feature_shape, schema.num_classes)
    with v1.device(v1.train.replica_device_setter(worker_device=f"/job:worker/task:{a.task_index}",
                                                 cluster=cluster)):
        gs = v1.train.get_or_create_global_step()
        x = v1.placeholder(tf.float32, [None, *schema.feature_shape])
        y = v1.placeholder(tf.int64, [None])
        spec = models.BUILTIN[a.model](x, y, "train", params)
        opt = v1.train.AdamOptimizer(a.learning_rate)
        if a.sync_replicas:
            opt = v1.train.SyncReplicasOptimizer(opt, replicas_to_aggregate=n_workers, total_num_replicas=n_workers)
        train_op = opt.minimize(spec.loss, global_step=gs)
    hooks = [v1.train.StopAtStepHook(last_step=a.train_steps)]
    if a.sync_replicas:
        hooks.append(opt.make_session_run_hook(a.task_index == 0))
    rng = np.random.default_rng(a.task_index)
    first = None
    step = 0
    with v1.train.MonitoredTrainingSession(master=server.target, is_chief=a.task_index == 0, hooks=hooks,
                                           config=config, save_checkpoint_secs=None,
                                           save_summaries_steps=None) as sess:
        while not sess.should_stop():
            idx = rng.integers(0, len(x_all), size=a.batch_size)
            _, step = sess.run([train_op, gs], feed_dict={x: x_all[idx], y: y_all[idx]})
            if first is None:
                first = time.time()
                print(f"BENCH first_step {first:.3f} {int(step)}", flush=True)
        end = time.time()   # the last step's end, as tfps's training_s (the session close is not training)
    print(f"BENCH done {int(step)} {first:.3f} {end:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
