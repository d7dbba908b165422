"""The TensorFlow 2 side of the CTR benchmark: the same tf_keras model, trained with ``model.fit``.

    ctr_tf2.py single --train_data 'DIR/ctr/train-*.csv' --buckets 4194304 --steps 3000
    ctr_tf2.py pss --ps 2 --workers 2 --train_data ... --buckets 4194304 --steps 3000

``single``: one process, no cluster (the ceiling on one machine). ``pss``: TensorFlow 2's
own parameter-server training, as its tutorial writes it: ps and worker
``tf.distribute.Server`` tasks (here subprocesses of this one, ``server``), this process
the coordinator, ``tf.distribute.ParameterServerStrategy`` with a
``MinSizePartitioner`` (tables above ``--partition_mb`` split over the ps, as tfps does),
``ClusterCoordinator`` under ``model.fit`` with a ``DatasetCreator`` and
``steps_per_execution``. Both read the data through tfps's own input pipeline
(``tfps.data.dataset.make_dataset``: decoded once, cached, shuffled, repeated), so only the
training differs.

The rate counts every epoch but the first (graph tracing, variable creation, the first
batches): ``BENCH done <examples> <start unix time> <end unix time>``, with the CPU seconds
each process used in those epochs (``BENCH cpu coordinator=<s> ps0=<s> ...``). ``pss`` also
prints each ps server's peak resident size (``BENCH ps_rss ps0=<bytes> ...``, VmHWM).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")   # tf.keras is tf_keras (Keras 3 has no PSS)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


T0 = time.time()


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def serve(cluster: dict, job: str, index: int) -> None:
    # TensorFlow's own thread pools: in one try with 1 intra- and 1 inter-op thread per
    # server (as tfps runs its tasks on 2 cores), the first epoch had not ended after 15 min.
    import tensorflow as tf
    server = tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name=job, task_index=index,
                                  protocol="grpc", start=True)
    print(f"BENCH serving {job}{index}", flush=True)
    server.join()


def peak_rss(pid: int) -> int:
    """The process's peak resident size in bytes (VmHWM), 0 when it cannot be read."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmHWM:"))
    except (OSError, StopIteration, ValueError):
        return 0


def build(a):
    import tf_keras as keras

    from examples.ctr_model import build_model
    from tfps import models
    model = build_model(models.ModelParams((4,), 2), buckets=a.buckets)
    # The model's own compile(), with the same optimizer, and several steps per call.
    opt = {"adam": keras.optimizers.Adam, "adagrad": keras.optimizers.Adagrad,
           "sgd": keras.optimizers.SGD}[a.optimizer](0.01)
    model.compile(optimizer=opt, loss="binary_crossentropy", metrics=["accuracy"],
                  steps_per_execution=a.steps_per_execution)
    return model


def cpu_seconds(pid: int | None = None) -> float:
    """CPU time (user + system) a process has used: ``pid``'s, or this process's."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def fit(a, model, x, servers: dict | None = None):
    """Train ``--steps`` steps in ``--epochs`` epochs; print the rate over all but the first,
    and the CPU seconds each process used in those epochs."""
    import tf_keras as keras
    per_epoch = max(a.steps_per_execution, a.steps // a.epochs // a.steps_per_execution * a.steps_per_execution)
    pids = {name: p.pid for name, p in (servers or {}).items()}
    # With a ClusterCoordinator, fit joins every scheduled step before an epoch ends: each
    # time is when all of that epoch's steps were done.
    ends: list[tuple[float, dict]] = []

    def epoch_end(*_):
        ends.append((time.time(), {"coordinator" if servers else "single": cpu_seconds(),
                                   **{n: cpu_seconds(pid) for n, pid in pids.items()}}))
    t0 = time.time()
    model.fit(x, epochs=a.epochs, steps_per_epoch=per_epoch, verbose=0,
              callbacks=[keras.callbacks.LambdaCallback(on_epoch_end=epoch_end)])
    (first, cpu0), (last, cpu1) = ends[0], ends[-1]
    print(f"BENCH first_epoch {first - t0:.3f}", flush=True)
    print(f"BENCH done {(len(ends) - 1) * per_epoch * a.batch_size} {first:.3f} {last:.3f}", flush=True)
    print("BENCH cpu " + " ".join(f"{n}={cpu1[n] - cpu0[n]:.2f}" for n in cpu0), flush=True)


def dataset_fn(a):
    from tfps.data import dataset as data
    schema = data.infer_schema(a.train_data)

    def make(_input_context=None):
        # PSS gives every worker input pipeline 0 of 1: each worker reads the whole set,
        # shuffled with its own order (the rate does not depend on which rows are read).
        return data.make_dataset(schema, "label", a.batch_size)
    return make


def run_single(a) -> int:
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(a.threads)
    tf.config.threading.set_inter_op_parallelism_threads(a.threads)
    fit(a, build(a), dataset_fn(a)())
    return 0


@contextlib.contextmanager
def pss_cluster(ps: int, workers: int, partition_mb: int):
    """ps and worker servers on this machine as subprocesses (this file's ``server`` mode),
    and this process's ParameterServerStrategy over them with a MinSizePartitioner: yields
    ``(strategy, servers)``; the servers are killed on the way out."""
    ports = free_ports(ps + workers)
    cluster = {"ps": [f"127.0.0.1:{p}" for p in ports[:ps]],
               "worker": [f"127.0.0.1:{p}" for p in ports[ps:]]}
    env = {**os.environ, "PYTHONPATH": ROOT, "PYTHONUNBUFFERED": "1"}
    servers = {}
    for job in ("ps", "worker"):
        for i in range(len(cluster[job])):
            servers[f"{job}{i}"] = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "server", "--cluster", json.dumps(cluster),
                 "--job", job, "--index", str(i)],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        for name, p in servers.items():         # each says it serves once its gRPC server runs
            line = p.stdout.readline()
            if "BENCH serving" not in line:
                raise RuntimeError(f"{name} did not start (exit {p.poll()})")
        import tensorflow as tf
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(tf.train.ClusterSpec(cluster),
                                                                        rpc_layer="grpc")
        partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
            min_shard_bytes=partition_mb << 20, max_shards=ps)
        yield tf.distribute.experimental.ParameterServerStrategy(resolver, variable_partitioner=partitioner), servers
    finally:
        for p in servers.values():
            p.kill()
            p.wait()


def ps_rss_line(servers: dict) -> str:
    return "BENCH ps_rss " + " ".join(f"{n}={peak_rss(p.pid)}" for n, p in servers.items() if n.startswith("ps"))


def run_pss(a) -> int:
    import tf_keras as keras
    with pss_cluster(a.ps, a.workers, a.partition_mb) as (strategy, servers):
        print(f"BENCH phase servers_up {time.time() - T0:.1f}", flush=True)
        with strategy.scope():
            model = build(a)
        print(f"BENCH phase model_built {time.time() - T0:.1f}", flush=True)
        shards = [v.shape[0] for v in model.get_layer("table").weights]
        print(f"BENCH table_shards {shards}", flush=True)
        fit(a, model, keras.utils.experimental.DatasetCreator(dataset_fn(a)), servers)
        print(f"BENCH phase fit_done {time.time() - T0:.1f}", flush=True)
        print(ps_rss_line(servers), flush=True)
    # The coordinator's own threads (gRPC, the closure queue) may hold the interpreter's exit.
    sys.stdout.flush()
    os._exit(0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("single", "pss", "server"))
    ap.add_argument("--train_data")
    ap.add_argument("--buckets", type=int, default=2**22)
    ap.add_argument("--optimizer", default="adam", help="adam (the model's compile()), adagrad, sgd")
    ap.add_argument("--steps", type=int, default=3000, help="training steps, over every worker")
    ap.add_argument("--epochs", type=int, default=5, help="the first is not counted")
    ap.add_argument("--batch_size", type=int, default=256)
    ap.add_argument("--steps_per_execution", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2, help="single: TensorFlow's intra/inter-op threads")
    ap.add_argument("--ps", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--partition_mb", type=int, default=64)
    ap.add_argument("--cluster", help="server: the cluster as JSON")
    ap.add_argument("--job")
    ap.add_argument("--index", type=int, default=0)
    a = ap.parse_args()
    if a.mode == "server":
        serve(json.loads(a.cluster), a.job, a.index)
        return 0
    return run_single(a) if a.mode == "single" else run_pss(a)


if __name__ == "__main__":
    sys.exit(main())
