"""Big variables split over every ps, the rest placed by bytes; sparse updates touch rows only."""

from __future__ import annotations

import collections
import re

import numpy as np
import pytest

from tfps.cluster.spec import ClusterSpec, TaskRef
from tfps.config import RunConfig
from tfps.task.runtime.signals import StopSignal
from tfps.task.setup import JobSetup
from tfps.task.worker import Worker

tf = pytest.importorskip("tensorflow")
v1 = tf.compat.v1


def _build(cfg: RunConfig, num_ps: int = 2):
    task = TaskRef(ClusterSpec(tuple(f"127.0.0.1:{1000 + i}" for i in range(num_ps)), ("127.0.0.1:2000",)),
                   "worker", 0)
    worker = Worker(task, cfg.validate(), StopSignal())
    graph, _ = worker.build(JobSetup(cfg))
    devices = {v.op.name: v.device for v in graph.get_collection("variables")}
    return worker, devices


def test_a_variable_above_partition_mb_is_split_over_every_ps_and_small_ones_stay_whole(tmp_path):
    # hidden0/kernel is 8 x 256 floats (8 KiB), hidden1/kernel 256 x 8: both above 4 KiB.
    worker, devices = _build(RunConfig(partition_mb=0.004, hidden_units="256,8", model_dir=str(tmp_path)))
    for name in ("hidden0/kernel", "hidden1/kernel"):
        parts = sorted(d for n, d in devices.items() if n.startswith(name + "/part_") and "Adam" not in n)
        assert parts == ["/job:ps/task:0", "/job:ps/task:1"], (name, devices)
    assert "output/kernel" in devices and "hidden0/bias" in devices   # small: whole, no part_0
    # Each shard's optimizer slots live with the shard.
    for n, d in devices.items():
        if "/part_" in n and "/Adam" in n:
            assert d == devices[n.split("/Adam")[0]], n
    loads = worker.balancer.loads
    assert abs(loads[0] - loads[1]) <= max(loads) * 0.1, loads   # even within 10 %


def test_without_big_variables_placement_is_by_bytes_not_round_robin(tmp_path):
    # One 8 x 512 kernel (16 KiB) and small ones: greedy by bytes puts the big one alone.
    worker, devices = _build(RunConfig(partition_mb=64, hidden_units="512,4", model_dir=str(tmp_path)))
    big = devices["hidden0/kernel"]
    rest = [d for n, d in devices.items() if n.endswith(("kernel", "bias")) and n != "hidden0/kernel"
            and "Adam" not in n]
    assert rest.count(big) <= 1, devices    # round-robin would put every other one with it
    shares = worker.balancer.shares_mb()
    assert set(shares) == {"ps0", "ps1"} and sum(shares.values()) > 0


def _train_rows(optimizer_name: str, steps: list[list[int]]):
    from tfps.task.graph import optimizers
    g = tf.Graph()
    with g.as_default():
        table = v1.get_variable("table", initializer=np.ones((6, 2), np.float32))
        ids = v1.placeholder(tf.int64, [None])
        loss = tf.reduce_sum(tf.nn.embedding_lookup(table, ids) ** 2)
        opt = optimizers.make(optimizer_name, 0.1)
        train = opt.minimize(loss)
        slot = opt.get_slot(table, "m") if optimizer_name == "adam" else None
        with v1.Session(graph=g) as sess:
            sess.run(v1.global_variables_initializer())
            for rows in steps:
                sess.run(train, {ids: rows})
            return sess.run(table), (sess.run(slot) if slot is not None else None)


def test_lazy_adam_updates_only_the_touched_rows_and_their_moments():
    table, m = _train_rows("adam", [[1, 3], [3]])
    assert np.all(table[[0, 2, 4, 5]] == 1.0)                # never touched
    assert np.all(table[[1, 3]] < 1.0)                        # trained
    # Row 1 was touched in the first step only: its moment did not decay in the second
    # (TensorFlow's Adam would have multiplied every row's moment by beta1 there).
    first, _ = _train_rows("adam", [[1, 3]])
    _, m_first = _train_rows("adam", [[1, 3]])
    np.testing.assert_allclose(m[1], m_first[1])
    np.testing.assert_allclose(table[1], first[1])
    # The first step of lazy Adam on touched rows is Adam's first step.
    g = tf.Graph()
    with g.as_default():
        ref = v1.get_variable("table", initializer=np.ones((6, 2), np.float32))
        ids = tf.constant([1, 3], tf.int64)
        step = v1.train.AdamOptimizer(0.1).minimize(tf.reduce_sum(tf.nn.embedding_lookup(ref, ids) ** 2))
        with v1.Session(graph=g) as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(step)
            np.testing.assert_allclose(sess.run(ref)[[1, 3]], first[[1, 3]], rtol=1e-6)


@pytest.mark.parametrize("name", ["sgd", "adagrad", "ftrl"])
def test_other_optimizers_leave_untouched_rows_alone(name):
    table, _ = _train_rows(name, [[2], [2, 5]])
    assert np.all(table[[0, 1, 3, 4]] == 1.0) and np.all(table[[2, 5]] < 1.0), table


def test_a_step_on_a_split_table_moves_only_the_touched_rows():
    """On an in-process cluster (2 ps, 1 worker), one traced step of a model with a 4 MiB
    table split over both ps: what every task receives is a few rows, never the table."""
    from tfps.cluster.single_host import free_ports
    from tfps.task.graph import optimizers, partition, placement
    ports = free_ports(3, "127.0.0.1")
    cluster = tf.train.ClusterSpec({"ps": [f"127.0.0.1:{ports[0]}", f"127.0.0.1:{ports[1]}"],
                                    "worker": [f"127.0.0.1:{ports[2]}"]})
    servers = [tf.distribute.Server(cluster, job_name=job, task_index=i)
               for job, i in (("ps", 0), ("ps", 1), ("worker", 0))]
    task = TaskRef(ClusterSpec(tuple(cluster.job_tasks("ps")), tuple(cluster.job_tasks("worker"))), "worker", 0)
    rows, dim, batch = 65536, 16, 32
    g = tf.Graph()
    balancer = placement.ByteBalancer(2)
    with g.as_default(), v1.device(placement.device_setter(task, cluster, balancer)):
        with partition.partitioned(2, partition_mb=1):
            table = v1.get_variable("table", [rows, dim], initializer=v1.zeros_initializer())
        ids = tf.constant(np.arange(batch) * 2039 % rows, tf.int64)   # rows on both shards
        loss = tf.reduce_sum(tf.square(tf.nn.embedding_lookup(table, ids) - 1.0))
        step = optimizers.make("adam", 0.1).minimize(loss)
        parts = list(table)
        assert sorted(p.device for p in parts) == ["/job:ps/task:0", "/job:ps/task:1"]
        with v1.Session(servers[2].target) as s:
            s.run(v1.global_variables_initializer())
            # A remote task's step stats can miss one traced step on a loaded machine (its
            # RecvTensor entries come in the next): trace up to three steps, keep the first
            # whose trace has every task. The same ids each step, so the rows touched are too.
            for _ in range(3):
                meta = v1.RunMetadata()
                s.run(step, options=v1.RunOptions(trace_level=v1.RunOptions.FULL_TRACE), run_metadata=meta)
                received = collections.Counter()   # bytes each task received in the step
                for dev in meta.step_stats.dev_stats:
                    for node in dev.node_stats:
                        m = re.match(r"\[(\d+)B\]", node.timeline_label)
                        if node.node_name == "RecvTensor" and m:
                            received[dev.device.split("/replica")[0]] += int(m.group(1))
                if set(received) == {"/job:worker", "/job:ps"}:
                    break
            after = s.run(parts)
    table_bytes = rows * dim * 4
    # The worker received the looked-up rows and each ps the gradient rows of its shard (the
    # ids reach both): a batch's worth, a thousandth of the table.
    assert set(received) == {"/job:worker", "/job:ps"}, received
    assert received["/job:worker"] >= batch * dim * 4, received
    assert max(received.values()) < table_bytes / 100, received
    # Exactly the touched rows changed, on the shard that holds them.
    whole = np.concatenate(after)
    touched = sorted(set((np.arange(batch) * 2039 % rows).tolist()))
    assert min(touched) < rows // 2 < max(touched)
    assert np.all(whole[touched] != 0) and np.count_nonzero(whole.any(axis=1)) == len(touched)
