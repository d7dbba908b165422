"""How an async worker's steps run (tfps.task.graph.steps) and how many threads a task gets
(tfps.task.runtime.session.auto_threads), without a cluster: the loop of K steps stops at
the last step, packed gradients update the variables exactly as ``minimize`` does.
"""

from __future__ import annotations

import re
import time

import numpy as np
import pytest

from tfps.cluster.spec import ClusterSpec, TaskRef
from tfps.task.runtime.session import auto_threads

tf = pytest.importorskip("tensorflow")
v1 = tf.compat.v1


def _task(ps: list[str], workers: list[str], job: str, index: int) -> TaskRef:
    return TaskRef(ClusterSpec(tuple(ps), tuple(workers)), job, index)


def test_tasks_on_one_host_share_its_cpus():
    local = (["127.0.0.1:2000"], ["127.0.0.1:2001", "127.0.0.1:2002"])
    assert auto_threads(_task(*local, "worker", 1), cpus=2) == 1
    assert auto_threads(_task(*local, "ps", 0), cpus=2) == 1
    assert auto_threads(_task(*local, "worker", 0), cpus=8) == 4
    assert auto_threads(_task(*local, "ps", 0), cpus=8) == 2
    # One task per host (an Ansible cluster of one worker per host): each gets the whole host.
    spread = (["10.0.0.1:2222"], ["10.0.0.2:2222", "10.0.0.3:2222"])
    assert auto_threads(_task(*spread, "worker", 1), cpus=8) == 8
    assert auto_threads(_task(*spread, "ps", 0), cpus=8) == 8
    # Two GPU workers on host 2 share it; the ps on host 1 has it to itself.
    gpus = (["10.0.0.1:2222"], ["10.0.0.2:2222", "10.0.0.2:2223"])
    assert auto_threads(_task(*gpus, "worker", 0), cpus=8) == 4
    assert auto_threads(_task(*gpus, "ps", 0), cpus=8) == 8


def _model(seed: int = 3):
    """A small classifier with a dense path, an embedding (sparse gradient) and an unused variable."""
    rng = np.random.default_rng(seed)
    x = tf.constant(rng.normal(size=(32, 5)).astype(np.float32))
    ids = tf.constant(rng.integers(0, 10, size=(32,)))
    y = tf.constant(rng.integers(0, 3, size=(32,)))
    w1 = v1.get_variable("w1", initializer=rng.normal(size=(5, 8)).astype(np.float32))
    b1 = v1.get_variable("b1", initializer=np.zeros(8, np.float32))
    w2 = v1.get_variable("w2", initializer=rng.normal(size=(8, 3)).astype(np.float32))
    emb = v1.get_variable("emb", initializer=rng.normal(size=(10, 3)).astype(np.float32))
    v1.get_variable("unused", initializer=np.ones(4, np.float32))
    logits = tf.matmul(tf.nn.relu(tf.matmul(x, w1) + b1), w2) + tf.nn.embedding_lookup(emb, ids)
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))


def _train(packed: bool, steps: int = 4) -> dict:
    from tfps.task.graph.steps import apply_packed
    g = tf.Graph()
    with g.as_default():
        gs = v1.train.get_or_create_global_step()
        loss = _model()
        opt = v1.train.AdamOptimizer(0.05)
        train = apply_packed(opt, loss, gs, "/cpu:0") if packed else opt.minimize(loss, global_step=gs)
        # Packed: the three dense gradients travel as one tensor, split once before the update.
        splits = [op for op in g.get_operations() if op.type == "SplitV"]
        assert len(splits) == (1 if packed else 0)
        if packed:
            sizes = tf.make_ndarray(splits[0].inputs[1].op.get_attr("value"))
            assert sizes.tolist() == [5 * 8, 8, 8 * 3]   # w1, b1, w2 (emb's gradient is sparse)
        with v1.Session() as s:
            s.run(v1.global_variables_initializer())
            before = {v.op.name: s.run(v) for v in v1.global_variables()}
            for _ in range(steps):
                s.run(train)
            return before, {v.op.name: s.run(v) for v in v1.global_variables()}


def test_packed_gradients_update_the_variables_as_minimize_does():
    (before, plain), (_, packed) = _train(False), _train(True)
    assert plain.keys() == packed.keys()
    assert plain["global_step"] == packed["global_step"] == 4
    for name in plain:
        np.testing.assert_allclose(packed[name], plain[name], rtol=1e-5, atol=1e-6, err_msg=name)
    # The variables did change (the comparison above is not between two untouched models).
    for name in ("w1", "b1", "w2", "emb"):
        assert not np.allclose(plain[name], before[name]), name
    np.testing.assert_array_equal(packed["unused"], before["unused"])


def test_the_loop_of_k_steps_ends_at_the_last_step():
    from tfps.task.graph.steps import step_loop
    g = tf.Graph()
    with g.as_default():
        gs = v1.train.get_or_create_global_step()
        w = v1.get_variable("w", initializer=np.float32(5.0))
        opt = v1.train.GradientDescentOptimizer(0.1)

        def one_step():
            loss = tf.square(w)
            return opt.minimize(loss, global_step=gs), loss, {"abs_w": tf.sqrt(loss)}

        train_op, steps, loss, metrics, bound = step_loop(one_step, gs, last_step=12)
        with v1.Session() as s:
            s.run(v1.global_variables_initializer())
            ran = [s.run(steps, {bound: 5}) for _ in range(4)]
            assert ran == [5, 5, 2, 0]
            assert s.run(gs) == 12
            # Loss and metrics are those of the step that ran, computed before its update:
            # after 12 updates of w -= 0.1 * 2w, w is 5 * 0.8**12.
            s.run(v1.assign(gs, 3))
            _, l_, m = s.run([train_op, loss, metrics], {bound: 1})
            expected_w = 5 * 0.8 ** 12
            assert m["abs_w"] == pytest.approx(expected_w, rel=1e-4)
            assert l_ == pytest.approx(expected_w ** 2, rel=1e-4)


def test_a_task_imports_tensorflow_without_keras_and_keras_still_imports_later():
    import subprocess
    import sys
    code = ("import sys\n"
            "from tfps.task import import_tensorflow\n"
            "tf = import_tensorflow()\n"
            "assert 'keras' not in sys.modules, 'Keras was imported with TensorFlow'\n"
            "assert float(tf.constant(2.0) * 3) == 6.0\n"
            "import keras.src.optimizers\n"
            "import tf_keras\n"
            "print('ok', tf_keras.layers.Dense(2).units)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.strip() == "ok 2", p.stderr[-2000:]


def test_the_chiefs_history_follows_the_jobs_global_step(tmp_path):
    """Other workers may take most steps of a short job: the chief's history still holds a
    record per ``every`` global steps, though the chief itself ran only a few."""
    import types

    from tfps.outcome import results
    from tfps.task.runtime.hooks import ProgressHook

    job = types.SimpleNamespace(first_step_at=None, started_wall=0.0, last_seen_step=0, local_steps=0,
                                watchdog=types.SimpleNamespace(progress=lambda: None))
    hook = ProgressHook(job, {}, every=20, batch_size=8, last_step=300, is_chief=True, model_dir=str(tmp_path),
                        name="worker0")
    # The chief's own runs (one step each) see the global step that worker1 pushed ahead.
    for step in (1, 9, 35, 48, 77, 130, 139, 300):
        hook.after_run(None, types.SimpleNamespace(results={"global_step": step, "loss": 1.0 / step}))
    history = results.read_history(str(tmp_path))
    assert [r["step"] for r in history] == [1, 35, 48, 77, 130, 300]   # one per multiple of 20 passed
    assert history[-1]["loss"] == pytest.approx(1 / 300)
    # A worker keeps no history.
    other = tmp_path / "other"
    other.mkdir()
    hook = ProgressHook(job, {}, every=20, batch_size=8, last_step=300, is_chief=False, model_dir=str(other),
                        name="worker1")
    for step in (1, 40, 80):
        hook.after_run(None, types.SimpleNamespace(results={"global_step": step, "loss": 0.5}))
    assert results.read_history(str(other)) == []


def test_a_board_write_carries_the_global_step_read_with_it():
    """A worker's board write needs no run of its own to read the global step first: the
    write itself stores at least the step the ps holds (tfps.task.monitor.board)."""
    from tfps.cluster.single_host import free_ports
    from tfps.task.monitor.board import Board
    cluster = tf.train.ClusterSpec({"ps": [f"127.0.0.1:{free_ports(1, '127.0.0.1')[0]}"]})
    server = tf.distribute.Server(cluster, job_name="ps", task_index=0)   # the board lives on ps 0
    g = tf.Graph()
    with g.as_default():
        with v1.device("/job:ps/task:0"):
            step = v1.train.get_or_create_global_step()
        board = Board(2, 1, step)
        with v1.Session(server.target) as s:
            s.run(step.initializer)      # then the assignment: one run would not order them
            s.run(step.assign(42))
            s.run(board.publish, {board.value: [7, 10, 1700000000.5, 9, 3, 0, 2]})
            assert s.run(board.read[1]).tolist() == [7, 42, 1700000000.5, 9, 3, 0, 2]
            s.run(board.publish, {board.value: [8, 50, 1700000000.5, 9, 3, 0, 2]})   # it saw a later step
            assert s.run(board.read[1]).tolist() == [8, 50, 1700000000.5, 9, 3, 0, 2]


def _cluster_loop(pack: bool, k: int = 3) -> tuple[dict, dict]:
    """Train ``k`` steps of a loop on 2 in-process ps and 1 worker; return (variables, edges).

    ``edges`` counts the tensors the worker received from the ps, by name. A tensor made in
    the loop is received once per step and once more as the loop ends (a "dead" value, which
    tells the worker the loop is over)."""
    import collections

    from tfps.cluster.single_host import free_ports
    from tfps.task.graph.steps import PackedReads, apply_packed, step_loop
    ports = free_ports(3, "127.0.0.1")
    cluster = tf.train.ClusterSpec({"ps": [f"127.0.0.1:{ports[0]}", f"127.0.0.1:{ports[1]}"],
                                    "worker": [f"127.0.0.1:{ports[2]}"]})
    servers = [tf.distribute.Server(cluster, job_name=job, task_index=i)
               for job, i in (("ps", 0), ("ps", 1), ("worker", 0))]
    rng = np.random.default_rng(5)
    x = rng.normal(size=(16, 4)).astype(np.float32)
    y = rng.integers(0, 3, size=(16,))
    g = tf.Graph()
    setter = v1.train.replica_device_setter(cluster=cluster, worker_device="/job:worker/task:0")
    initial = [rng.normal(size=(4, 4)).astype(np.float32) for _ in range(4)] + [
        rng.normal(size=(4, 3)).astype(np.float32)]
    with g.as_default(), v1.device(setter):
        gs = v1.train.get_or_create_global_step()                              # ps 0
        opt = v1.train.AdamOptimizer(0.05)

        def model(features):
            ws = [v1.get_variable(f"w{i}", initializer=initial[i]) for i in range(4)]
            head = v1.get_variable("head", initializer=initial[4])
            big = v1.get_variable("big", initializer=np.ones((512, 513), np.float32))   # > PACK_MAX_ELEMENTS
            h = features
            for w in ws:
                h = tf.nn.tanh(tf.matmul(h, w)) + tf.matmul(h, w)   # each variable read and used twice
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=h @ head))
            return loss + 1e-3 * tf.reduce_mean(tf.square(big))

        def one_step():
            reads = PackedReads("/job:worker/task:0") if pack else None
            loss = reads.build(model, tf.constant(x)) if pack else model(tf.constant(x))
            return apply_packed(opt, loss, gs, "/job:worker/task:0"), loss, {}

        train_op, steps, _, _, bound = step_loop(one_step, gs, last_step=100)
        meta = v1.RunMetadata()
        with v1.Session(servers[2].target) as s:
            s.run(v1.global_variables_initializer())
            assert s.run(steps, {bound: k}, options=v1.RunOptions(trace_level=v1.RunOptions.FULL_TRACE),
                         run_metadata=meta) == k
            values = {v.op.name: s.run(v) for v in v1.global_variables()}
    edges = collections.Counter()
    for dev in meta.step_stats.dev_stats:
        if "/job:worker/" in dev.device:
            for node in dev.node_stats:
                m = re.search(r"edge_\d+_(\S+) from (\S*job:ps\S*)", node.timeline_label)
                if m:
                    edges[m.group(1)] += 1
    return values, edges


def test_a_step_receives_the_variables_of_each_ps_as_one_tensor():
    plain, plain_edges = _cluster_loop(pack=False)
    packed, packed_edges = _cluster_loop(pack=True)

    def variable_reads(edges):
        return {name: n for name, n in edges.items()
                if name.endswith("ReadVariableOp") and not name.endswith("Read/ReadVariableOp")}   # not the step's

    # Unpacked, each step receives every variable read on its own (6 variables on 2 ps).
    assert len(variable_reads(plain_edges)) >= 6 and min(variable_reads(plain_edges).values()) >= 3 + 1
    # Packed: one tensor per ps per step; only the variable too large to pack comes alone.
    assert list(variable_reads(packed_edges)) == ["train_steps/body/_1/ReadVariableOp"], packed_edges
    joined = [n for name, n in packed_edges.items() if re.search(r"/concat(_\d+)?$", name)]
    assert joined == [3 + 1, 3 + 1], packed_edges
    # The same training: every variable ends as without packing.
    assert plain.keys() == packed.keys() and plain["global_step"] == packed["global_step"] == 3
    for name in plain:
        np.testing.assert_allclose(packed[name], plain[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_packed_reads_leave_rows_and_variable_objects_to_the_model_and_keep_every_gradient():
    """What ``PackedReads`` packs and what it leaves: an embedding (its rows are gathered)
    keeps its variable; a variable also read by a regularizer is packed and its gradient is
    the sum of both paths (as without packing); a model that needs a variable object (here
    ``assign_add``) gets no packed reads and builds as it is."""
    from tfps.cluster.single_host import free_ports
    from tfps.task.graph.steps import PackedReads
    ports = free_ports(2, "127.0.0.1")
    cluster = tf.train.ClusterSpec({"ps": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"]})
    servers = [tf.distribute.Server(cluster, job_name=job, task_index=0) for job in ("ps", "worker")]
    rng = np.random.default_rng(2)
    a0, a1, e0 = (rng.normal(size=shape).astype(np.float32) for shape in ((3, 4), (4, 2), (5, 2)))

    def model(x):
        w0 = v1.get_variable("w0", initializer=a0)
        w1 = v1.get_variable("w1", initializer=a1, regularizer=lambda w: 0.1 * tf.reduce_sum(tf.square(w)))
        emb = v1.get_variable("emb", initializer=e0)
        h = tf.matmul(tf.matmul(x, w0), w1) + tf.nn.embedding_lookup(emb, [0, 3])
        return tf.reduce_sum(tf.square(h)) + v1.losses.get_regularization_loss()

    def gradients(pack: bool) -> dict:
        g = tf.Graph()
        with g.as_default(), v1.device(v1.train.replica_device_setter(cluster=cluster,
                                                                      worker_device="/job:worker/task:0")):
            x = tf.constant(xs)
            opt = v1.train.GradientDescentOptimizer(0.1)
            if pack:
                reads = PackedReads("/job:worker/task:0")
                loss = reads.build(model, x)
                assert list(reads.plan) == ["w0", "w1"], reads.plan
                pairs = opt.compute_gradients(loss)
                # The embedding's rows are gathered on its ps: its gradient is those rows'.
                assert isinstance(pairs[2][0], tf.IndexedSlices), pairs
            else:
                pairs = opt.compute_gradients(model(x))
            with v1.Session(servers[1].target) as s:
                s.run(v1.global_variables_initializer())
                return {v.op.name: s.run(tf.convert_to_tensor(grad)) for grad, v in pairs}

    xs = rng.normal(size=(2, 3)).astype(np.float32)
    plain, packed = gradients(False), gradients(True)
    assert list(plain) == list(packed) == ["w0", "w1", "emb"]
    for name in plain:
        np.testing.assert_allclose(packed[name], plain[name], rtol=1e-6, err_msg=name)

    def counting(x):
        n = v1.get_variable("n", initializer=0.0)
        with tf.control_dependencies([n.assign_add(1.0)]):
            return model(x) * n

    with tf.Graph().as_default():
        reads = PackedReads("/job:worker/task:0")
        loss = reads.build(counting, tf.constant(xs))
        assert reads.plan == {} and loss.shape == ()


def test_the_rehearsal_leaves_a_keras_layers_weights_to_keras_whatever_the_file_names(tmp_path):
    """Which variables ``PackedReads`` packs is decided where tf_keras creates a weight (its
    ``add_weight`` runs: ``tfps.compat.in_keras_add_weight``), not from the file names on the
    call stack: a ``tf.compat.v1.layers`` layer's weights stay Keras's, and the user's own
    ``get_variable`` is packed, even from a package directory named ``keras``."""
    import importlib.util

    from tfps import compat
    from tfps.task.graph import partition
    from tfps.task.graph.steps import _rehearse
    (tmp_path / "keras").mkdir()
    source = tmp_path / "keras" / "user_model.py"
    source.write_text("import tensorflow as tf\n"
                      "def model(x):\n"
                      "    w = tf.compat.v1.get_variable('w', [3, 3], initializer=tf.compat.v1.ones_initializer())\n"
                      "    return tf.compat.v1.layers.dense(tf.matmul(x, w), 2)\n")
    spec = importlib.util.spec_from_file_location("user_model_under_keras", source)
    user = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(user)
    # As a worker builds it (inside partition.partitioned, whose add_weight wrapper marks), and bare.
    for around in (lambda: partition.partitioned(1, 1000), lambda: compat.keras_add_weight_wrapped(lambda a: a)):
        with tf.Graph().as_default(), around():
            plan = _rehearse(user.model, (tf.constant(np.ones((2, 3), np.float32)),))
        assert list(plan) == ["w"], plan
    assert not compat.in_keras_add_weight()


# ----------------------------------------------------------------------------- running metrics
def test_running_auc_is_updated_by_every_step_of_the_loop_and_read_after_it():
    """wide_deep's running ``auc`` (binary labels) inside the loop of K steps: each step adds
    its batch to the worker's own histograms (local variables, not global), and the value
    the run reports is the AUC of the histograms after its last step."""
    from tfps import models
    from tfps.models import modelspec
    from tfps.task.graph.steps import step_loop
    rng = np.random.default_rng(4)
    x = rng.normal(size=(96, 3)).astype(np.float32)
    y = (x[:, 0] + rng.normal(size=96) > 0).astype(np.int64)
    params = modelspec.ModelParams((3,), 2, hidden_units=(4,), columns=(("a", "float32"), ("b", "float32"),
                                                                        ("c", "float32")))
    g = tf.Graph()
    with g.as_default():
        gs = v1.train.get_or_create_global_step()
        batches = v1.data.make_one_shot_iterator(tf.data.Dataset.from_tensor_slices((x, y)).batch(16))
        opt = v1.train.GradientDescentOptimizer(0.1)
        state = []

        def one_step():
            features, labels = batches.get_next()
            with modelspec.on_worker("/cpu:0"):
                spec = models.wide_deep(features, labels, "train", params)
            update, result, variables = spec.streaming["auc"]
            state.extend(variables)
            return tf.group(opt.minimize(spec.loss, global_step=gs), update), spec.loss, {"auc": result}

        train_op, steps, _, metrics, bound = step_loop(one_step, gs, last_step=100)
        assert [v.op.name for v in state] == ["running_auc/positives", "running_auc/negatives"]
        assert {v.device for v in state} == {"/device:CPU:0"}
        assert {v.op.name for v in state} <= {v.op.name for v in v1.local_variables()}
        assert not {v.op.name for v in state} & {v.op.name for v in v1.global_variables()}
        with v1.Session() as s:
            s.run([v1.global_variables_initializer(), v1.local_variables_initializer()])
            assert s.run(steps, {bound: 1}) == 1
            _, auc = s.run([train_op, metrics["auc"]], {bound: 4})
            positives, negatives = s.run(state)
    assert positives.sum() == y[:80].sum() and negatives.sum() == 80 - y[:80].sum()   # 5 steps, each once
    below = np.cumsum(negatives) - negatives
    assert auc == pytest.approx((positives * (below + negatives / 2)).sum() / (positives.sum() * negatives.sum()))


def test_the_running_auc_is_the_rank_auc_of_the_bucketed_scores():
    from tfps import models
    from tfps.task.output.export import auc as rank_auc
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 1000)
    p = 1 / (1 + np.exp(-(y + rng.normal(size=1000))))
    with tf.Graph().as_default():
        _, result, state = models._running_auc(tf.constant(y), tf.constant(p, tf.float32))
        with v1.Session() as s:
            s.run(v1.variables_initializer(state))
            got = s.run(result)
    assert got == pytest.approx(rank_auc(np.floor(p * 200), y), abs=1e-6)
    assert got == pytest.approx(rank_auc(p, y), abs=2e-3)


def test_progress_lines_show_running_metrics_and_reset_them_after_each_line(tmp_path, caplog):
    """The line shows the running value as fetched; the hook then resets it, once per line."""
    import logging
    import types

    from tfps.task.runtime.hooks import ProgressHook
    job = types.SimpleNamespace(first_step_at=None, started_wall=0.0, last_seen_step=0, local_steps=0,
                                watchdog=types.SimpleNamespace(progress=lambda: None))
    ran = []
    context = types.SimpleNamespace(session=types.SimpleNamespace(run=ran.append))
    hook = ProgressHook(job, {}, every=4, batch_size=8, last_step=100, is_chief=False, model_dir=str(tmp_path),
                        name="worker1", reset="the reset op")
    with caplog.at_level(logging.INFO, logger="tfps"):
        for step in range(1, 10):
            hook.after_run(context, types.SimpleNamespace(results={"global_step": step, "loss": 0.5,
                                                                   "auc": 0.6 + step / 100}))
    lines = [r.getMessage() for r in caplog.records if ": step " in r.getMessage()]
    assert [line.split(" | ")[0] for line in lines] == ["worker1: step 4/100 loss 0.5000 auc 0.6400",
                                                        "worker1: step 8/100 loss 0.5000 auc 0.6800"]
    assert ran == ["the reset op"] * 2


def _sync_cluster(pack: bool, steps: int = 4, workers: int = 2, backup: bool = False,
                  probe_step: int | None = None, loop: bool = False, sparse: bool = True) -> tuple[dict, dict]:
    """``steps`` sync steps of 2 workers on 2 in-process ps (Adam, tfps's lazy Adam).

    ``workers`` > 2: the job has that many workers and aggregates 2 gradients a step; the
    others never run (frozen). ``backup``: tfps's mode for backup workers. ``probe_step``: at
    that step the chief's update does not run; instead ``values["accumulated"]`` is how many
    gradients of that step the first variable's accumulator holds.

    Each worker builds its own graph, as in a job; the chief's update (the queue runner's
    op) runs in the main thread once both workers have sent their gradients and wait for a
    token, so every step aggregates exactly one gradient of each worker: the same training
    whatever the timing. ``pack``: the graph a tfps worker trains on, built by
    ``tfps.task.graph.build_train_graph`` (mode "sync" or "backup"; its model replaced by
    the one below, its input by constants); else the reference, ``SyncReplicasOptimizer.minimize``
    as it is. Returns (the model's and optimizer's variables, the tensors worker 1 sends to
    the ps in a step, by name: its partition graphs).

    ``loop``: tfps's loop of sync steps (``sync_step_loop``), each worker running all
    ``steps`` in one ``session.run`` while the chief's update runs ``steps`` times; each step
    still aggregates one gradient of each worker. ``sparse``: the model has an embedding
    (a sparse gradient, which a loop cannot take)."""
    import collections
    import shutil
    import tempfile
    import threading

    from tfps.cluster.single_host import free_ports
    from tfps.config import RunConfig
    from tfps.models.modelspec import ModelSpec
    from tfps.task.graph import Devices, build_train_graph, optimizers
    from tfps.task.setup import JobSetup
    ports = free_ports(2 + workers, "127.0.0.1")
    hosts = ClusterSpec(tuple(f"127.0.0.1:{p}" for p in ports[:2]), tuple(f"127.0.0.1:{p}" for p in ports[2:]))
    cluster = tf.train.ClusterSpec({"ps": list(hosts.ps), "worker": list(hosts.worker)})
    servers = [tf.distribute.Server(cluster, job_name=job, task_index=i)
               for job, i in [("ps", 0), ("ps", 1)] + [("worker", w) for w in range(workers)]]
    here = tempfile.mkdtemp()
    with open(f"{here}/rows.csv", "w") as f:   # the input the graph reads (the model ignores it)
        f.write("a,b,label\n" + "0.5,-1.0,1\n" * 64)
    cfg = RunConfig(model="linear", train_data=f"{here}/rows.csv", num_classes=3, batch_size=16, optimizer="adam",
                    learning_rate=0.05, sync_replicas=True, replicas_to_aggregate=2, train_steps=10**6,
                    progressive_window=0, model_dir=f"{here}/m").validate()
    built = []
    for index in (0, 1):
        rng = np.random.default_rng(11)                   # the same initial values in both graphs
        data = np.random.default_rng(100 + index)         # each worker its own batch
        x = data.normal(size=(16, 4)).astype(np.float32)
        y = data.integers(0, 3, size=(16,))
        ids = data.integers(0, 6, size=(16,))
        device = f"/job:worker/task:{index}"
        initial = [rng.normal(size=(4, 4)).astype(np.float32) for _ in range(4)] + [
            rng.normal(size=(4, 3)).astype(np.float32), rng.normal(size=(6, 3)).astype(np.float32)]

        def loss_of_step(x=x, y=y, ids=ids, initial=initial):   # the model: creates its variables, as a model_fn does
            ws = [v1.get_variable(f"w{i}", initializer=initial[i]) for i in range(4)]
            head = v1.get_variable("head", initializer=initial[4])
            emb = v1.get_variable("emb", initializer=initial[5])   # sparse gradient
            big = v1.get_variable("big", initializer=np.ones((512, 513), np.float32))   # > PACK_MAX_ELEMENTS
            h = tf.constant(x)
            for w in ws:
                h = tf.nn.tanh(tf.matmul(h, w)) + tf.matmul(h, w)
            logits = h @ head + (tf.nn.embedding_lookup(emb, tf.constant(ids)) if sparse else 0.0)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
            return loss + 1e-3 * tf.reduce_mean(tf.square(big))

        if pack:   # the graph of a tfps worker
            setup = JobSetup(cfg)
            setup.model_fn = lambda features, labels, mode, params, loss=loss_of_step: ModelSpec(loss(), {})
            g, ops = build_train_graph(setup, "backup" if backup else "sync",
                                       Devices.of(TaskRef(hosts, "worker", index)), loop=loop)
            opt = ops.sync_hook.agg
            # The run's stale gradients (loop), else the global step as the run read it (with the reads).
            train = [ops.train_op, ops.sync_fetch["stale"] if loop else ops.global_step_read]
            feed = {ops.steps_per_run: steps} if loop else None
            with g.as_default():
                init = (v1.global_variables_initializer(), opt.chief_init_op) if index == 0 else ()
                local_init = v1.local_variables_initializer()
            sync_op, step_init = opt.queue_runner.enqueue_ops[0], opt.local_step_init_op
        else:   # the reference
            g = tf.Graph()
            with g.as_default(), v1.device(v1.train.replica_device_setter(cluster=cluster, worker_device=device)):
                gs = v1.train.get_or_create_global_step()
                opt = v1.train.SyncReplicasOptimizer(optimizers.make("adam", 0.05), replicas_to_aggregate=2,
                                                     total_num_replicas=workers)
                with v1.device(gs.device):
                    gs_value = gs.read_value()
                with v1.device(device):
                    gs_read = tf.identity(gs_value)
                train = [opt.minimize(loss_of_step(), global_step=gs), gs_read]
                init = (v1.global_variables_initializer(), opt.chief_init_op) if index == 0 else ()
                feed, local_init = None, v1.local_variables_initializer()
                sync_op, step_init = opt.get_chief_queue_runner().enqueue_ops[0], opt.local_step_init_op
        with g.as_default():
            names = {v.op.name: v for v in v1.global_variables()
                     if v.op.name.split("/")[0] in _MODEL_VARIABLES}   # not the job's coordination
            accumulator = next(op for op in g.get_operations()
                               if op.type in ("ConditionalAccumulator", "ResourceConditionalAccumulator"))
            count = (tf.raw_ops.ResourceAccumulatorNumAccumulated if accumulator.type.startswith("Resource")
                     else tf.raw_ops.AccumulatorNumAccumulated)
            names["accumulated"] = count(handle=accumulator.outputs[0])
        built.append((g, train, sync_op, init, local_init, step_init, names, feed))
    sessions = [v1.Session(servers[2 + i].target, graph=b[0]) for i, b in enumerate(built)]
    chief, worker = sessions
    for op in built[0][3]:   # the variables, then the accumulators' step (which reads the global step)
        chief.run(op)
    for s, b in zip(sessions, built):
        s.run([b[4]])
        s.run(b[5])
    meta = v1.RunMetadata()
    seen: list[tuple[int, int]] = []   # (step, the global step a worker's run read)
    if loop:   # one run of every step per worker; the chief's update once per step meanwhile
        errors = []

        def run_all(i):
            try:
                options = v1.RunOptions(output_partition_graphs=True) if i == 1 else None
                _, stale = sessions[i].run(built[i][1], feed_dict=built[i][7], options=options,
                                           run_metadata=meta if i == 1 else None)
                seen.append((0, int(stale)))
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)
        threads = [threading.Thread(target=run_all, args=(i,)) for i in (0, 1)]
        for t in threads:
            t.start()
        for _ in range(steps):
            chief.run(built[0][2])
        for t in threads:
            t.join(60)
        assert not errors and not any(t.is_alive() for t in threads), errors
        assert seen == [(0, 0), (0, 0)], seen   # no gradient dropped
        seen.clear()
    for step in range(steps if not loop else 0):
        errors = []

        def run(i, traced):
            try:
                options = v1.RunOptions(output_partition_graphs=True) if traced else None
                _, read = sessions[i].run(built[i][1], options=options, run_metadata=meta if traced else None)
                seen.append((step, int(read)))
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)
        threads = [threading.Thread(target=run, args=(i, i == 1 and step == steps - 1)) for i in (0, 1)]
        for t in threads:
            t.start()
        if step == probe_step:   # both gradients are sent before the workers wait for a token
            deadline = time.monotonic() + 10
            while (accumulated := chief.run(built[0][6]["accumulated"])) < 2 and time.monotonic() < deadline:
                time.sleep(0.2)
            if accumulated < 2:   # one was dropped: the step cannot end, the workers found old tokens
                for t in threads:
                    t.join(60)
                assert not errors and not any(t.is_alive() for t in threads), errors
                break
        chief.run(built[0][2])            # takes both gradients, updates, gives each worker a token
        for t in threads:
            t.join(60)
        assert not errors and not any(t.is_alive() for t in threads), errors
        if step == probe_step:
            break
    values = {name: chief.run(v) for name, v in built[0][6].items()}
    # Each run began after the chief's update of the step before: it read that step's number.
    assert all(read == step for step, read in seen), seen
    if probe_step is not None:
        values["accumulated"] = accumulated
    for s in sessions:
        s.close()
    shutil.rmtree(here)
    sent = collections.Counter()   # the receives of worker 1's tensors in the ps's parts of its step
    received = collections.Counter()   # ... and of the ps's tensors in worker 1's part
    for part in meta.partition_graphs:
        for node in part.node:
            if node.op != "_Recv":
                continue
            name = re.sub(r"^edge_\d+_|:\d+$", "", node.attr["tensor_name"].s.decode())
            to, by = node.attr["recv_device"].s.decode(), node.attr["send_device"].s.decode()
            if "/job:ps/" in to and "/job:worker/replica:0/task:1/" in by:
                sent[name] += 1
            if "/job:worker/replica:0/task:1/" in to and "/job:ps/" in by:
                received[name] += 1
    values["received"] = received
    return values, sent


def test_packed_sync_steps_train_exactly_as_sync_replicas_optimizer():
    plain, plain_sent = _sync_cluster(pack=False)
    packed, packed_sent = _sync_cluster(pack=True)
    assert plain.keys() == packed.keys() and plain["global_step"] == packed["global_step"] == 4
    for name in set(plain) - {"accumulated", "received"}:   # the same bits: the same gradients and updates
        np.testing.assert_array_equal(packed[name], plain[name], err_msg=name)
    assert not np.allclose(plain["w0"], _sync_cluster_initial("w0"))   # training did move the variables
    # Unpacked, each of the 7 accumulators gets its gradient and a read of the local step on
    # their own (the sparse gradient as indices and values): 15 tensors.
    assert sum(plain_sent.values()) == 2 * 7 + 1, plain_sent
    # Packed: one tensor per ps (its dense gradients and the local step), plus what keeps its
    # own path: the embedding's sparse gradient (indices, values) and the gradient too large to pack.
    joined = [name for name in packed_sent if re.search(r"(^|/)concat(_\d+)?$", name)]
    assert len(joined) == 2, packed_sent
    assert not [name for name in packed_sent if "ReadVariableOp" in name], packed_sent
    assert sum(packed_sent.values()) == 2 + 2 + 1, packed_sent
    # What the worker receives: unpacked, a read per variable and use, the global step's read
    # ("Read/ReadVariableOp") and the token; packed, one tensor per ps (its variables' reads,
    # and on the first ps the global step's read too), the large variable's read and the
    # embedding's rows, which keep their own path, and the token.
    assert plain["received"]["Read/ReadVariableOp"] == 1, plain["received"]
    assert "Read/ReadVariableOp" not in packed["received"], packed["received"]
    assert len([name for name in packed["received"] if re.search(r"(^|/)concat(_\d+)?$", name)]) == 2
    assert sum(packed["received"].values()) == 2 + 2 + 1 + 1, packed["received"]


def test_a_loop_of_sync_steps_trains_exactly_as_sync_replicas_optimizer():
    """Each worker runs its 4 steps in one ``session.run`` (``sync_step_loop``): the same bits
    as 4 steps of SyncReplicasOptimizer as it is; with a backup worker (3 workers, one never
    running), 6 steps as 6 of a 2-worker job. A model with a sparse gradient is refused
    (``NotLoopable``: the worker then builds one step per run)."""
    from tfps.task.graph.syncagg import NotLoopable
    plain, _ = _sync_cluster(pack=False, sparse=False)
    looped, sent = _sync_cluster(pack=True, loop=True, sparse=False)
    assert plain["global_step"] == looped["global_step"] == 4
    for name in set(plain) - {"accumulated", "received"}:
        np.testing.assert_array_equal(looped[name], plain[name], err_msg=name)
    assert not np.allclose(plain["w0"], _sync_cluster_initial("w0"))
    two, _ = _sync_cluster(pack=False, steps=6, sparse=False)
    backup, _ = _sync_cluster(pack=True, steps=6, workers=3, backup=True, loop=True, sparse=False)
    assert two["global_step"] == backup["global_step"] == 6
    for name in set(two) - {"accumulated", "received"}:
        np.testing.assert_array_equal(backup[name], two[name], err_msg=name)
    with pytest.raises(NotLoopable, match="emb"):
        _sync_cluster(pack=True, loop=True, steps=1)


#: The model's and its optimizer's variables (Adam's slots are under the variable's name).
_MODEL_VARIABLES = {"w0", "w1", "w2", "w3", "head", "emb", "big", "beta1_power", "beta2_power", "global_step"}


def _sync_cluster_initial(name: str) -> np.ndarray:
    rng = np.random.default_rng(11)
    return [rng.normal(size=(4, 4)).astype(np.float32) for _ in range(4)][int(name[1:])]


def test_backup_workers_keep_fresh_gradients_when_a_frozen_worker_leaves_tokens_behind():
    """3 workers, 2 gradients a step, worker 2 frozen from the start.

    SyncReplicasOptimizer adds 3 tokens a step and the 2 running workers take 2: from the
    third step on, one of them takes an old token and its gradient, computed from the
    current variables, is dropped as stale. tfps's step for backup workers carries the later
    of the token and the global step read before the variables: both gradients count, and
    6 steps train exactly as 6 steps of a 2-worker job."""
    plain_3, _ = _sync_cluster(pack=False, steps=3, workers=3, probe_step=2)
    assert plain_3["global_step"] == 2 and plain_3["accumulated"] == 1, plain_3["accumulated"]
    backup_3, _ = _sync_cluster(pack=True, steps=3, workers=3, backup=True, probe_step=2)
    assert backup_3["global_step"] == 3 and backup_3["accumulated"] == 2, backup_3["accumulated"]
    two, _ = _sync_cluster(pack=False, steps=6)
    backup, _ = _sync_cluster(pack=True, steps=6, workers=3, backup=True)
    assert two["global_step"] == backup["global_step"] == 6
    for name in set(two) - {"accumulated", "received"}:
        np.testing.assert_array_equal(backup[name], two[name], err_msg=name)
