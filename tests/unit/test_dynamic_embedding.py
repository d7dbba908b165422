"""tfps.layers' DynamicTable in one process: admission, eviction with the optimizer's slots,
the allocation race and checkpoints taken while threads write (one local graph per test)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import tensorflow as tf

from tfps.layers import dynamic_embedding as de

v1 = tf.compat.v1


def _session(graph):
    return v1.Session(graph=graph, config=v1.ConfigProto(inter_op_parallelism_threads=2,
                                                          intra_op_parallelism_threads=1))


def _build(dim=2, devices=("/cpu:0",), lr=0.1, zeros=False, **kwargs):
    """A graph with a table, a loss sum(rows * weight) over int64 ids, Adagrad and the table's ops."""
    g = tf.Graph()
    with g.as_default():
        step = v1.train.get_or_create_global_step()
        ids = v1.placeholder(tf.int64, [None], name="ids")
        weight = v1.placeholder_with_default(tf.ones_like(ids, tf.float32), [None], name="weight")
        table = de.DynamicTable(dim, devices=list(devices), name="emb",
                                initializer=v1.zeros_initializer() if zeros else None, **kwargs)
        rows = table.lookup(ids, training=True)
        train = v1.train.AdagradOptimizer(lr, use_locking=True).minimize(
            tf.reduce_sum(rows * weight[:, None]), global_step=step)
        ops = {"ids": ids, "weight": weight, "rows": rows, "train": train, "step": step,
               "evict": table.evict_op(), "stats": table.stats_op(),
               "saver": v1.train.Saver(de.saver_var_list()), "init": v1.global_variables_initializer()}
    return g, table, ops


def _live(sess, table) -> dict[int, int]:
    """key -> row of every live id, over all shards."""
    out = {}
    for s in table.shards:
        keys, rows = sess.run(tf.raw_ops.LookupTableExportV2(table_handle=s.table, Tkeys=tf.int64,
                                                             Tvalues=tf.int64))
        out.update(zip(keys.tolist(), rows.tolist()))
    return out


def test_an_id_seen_fewer_than_min_count_times_reads_zeros_then_gets_its_own_row():
    g, table, ops = _build(min_count=3)
    with g.as_default(), _session(g) as sess:
        sess.run(ops["init"])
        for seen in (1, 2):
            rows = sess.run(ops["rows"], {ops["ids"]: [7]})
            assert not rows.any(), (seen, rows)                  # not admitted: the default, zeros
            assert sess.run(ops["stats"])[0][0] == 0
        rows = sess.run(ops["rows"], {ops["ids"]: [7, 8]})      # 7's third time; 8's first
        assert rows[0].any() and not rows[1].any(), rows
        assert sess.run(ops["stats"]).tolist() == [[1, 1, 0, 0]]   # live 1, admitted 1
        # Two occurrences in one batch count twice.
        sess.run(ops["rows"], {ops["ids"]: [9, 9, 9]})
        assert set(_live(sess, table)) == {7, 9}


def test_eviction_frees_rows_with_their_adagrad_slots_and_the_rows_are_reused():
    g, table, ops = _build(steps_to_live=2, capacity=4)
    slot = table._slots(table.shards[0])[0]
    with g.as_default(), _session(g) as sess:
        sess.run(ops["init"])
        for _ in range(3):                                      # 1 and 2 trained three times
            sess.run(ops["train"], {ops["ids"]: [1, 2]})
        old = _live(sess, table)
        accum = sess.run(slot)
        assert all(accum[r].min() > 0.1 + 2.9 for r in old.values()), accum
        for _ in range(3):                                      # then only 3 for three steps
            sess.run(ops["train"], {ops["ids"]: [3]})
        assert sess.run(ops["evict"]) == 2
        assert set(_live(sess, table)) == {3}
        accum, weights = sess.run([slot, table.shards[0].weights])
        for r in old.values():                                  # slots back to Adagrad's initial 0.1
            np.testing.assert_allclose(accum[r], [0.1, 0.1])
            assert np.abs(weights[r]).max() <= 0.05             # a fresh row of the initializer
        assert sess.run(table.shards[0].free_top) == 3
        # The table holds 4 rows: 3 more ids fit only in the freed ones.
        sess.run(ops["train"], {ops["ids"]: [4, 5, 6]})
        now = _live(sess, table)
        assert set(now) == {3, 4, 5, 6} and set(old.values()) <= set(now.values()), (old, now)
        assert sess.run(ops["stats"]).tolist() == [[4, 6, 2, 0]]
        sess.run(ops["train"], {ops["ids"]: [7]})               # full: refused, reads zeros
        assert sess.run(ops["stats"])[0][3] == 1 and 7 not in _live(sess, table)


def test_two_threads_that_insert_the_same_new_ids_leave_one_live_row_per_id():
    g, table, ops = _build(devices=("/cpu:0", "/cpu:0"), capacity=4000)
    with g.as_default(), _session(g) as sess:
        sess.run(ops["init"])
        batches = [np.arange(k * 100, k * 100 + 100) for k in range(15)]
        start = threading.Barrier(2)

        def insert():
            start.wait()
            for b in batches:
                sess.run(ops["rows"], {ops["ids"]: b})

        threads = [threading.Thread(target=insert) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        live = _live(sess, table)
        assert set(live) == set(range(1500))
        for s in table.shards:                                  # no row given twice, none leaked
            keys, rows = sess.run(tf.raw_ops.LookupTableExportV2(table_handle=s.table, Tkeys=tf.int64,
                                                                 Tvalues=tf.int64))
            assert len(set(rows.tolist())) == len(rows)
            row_keys, top = sess.run([s.row_keys, s.free_top])
            assert (row_keys[rows] == keys).all()
            assert top == table.shard_capacity - len(rows)
        assert sess.run(ops["stats"])[:, 1].sum() == 1500     # admitted once each


def _adagrad_rows(g: float, lr: float, n_max: int) -> np.ndarray:
    """The weight after n = 0..n_max Adagrad steps of gradient g from 0 (accumulator 0.1)."""
    acc, w, out = 0.1, 0.0, [0.0]
    for _ in range(n_max):
        acc += g * g
        w -= lr * g / np.sqrt(acc)
        out.append(w)
    return np.array(out)


def test_checkpoints_taken_while_threads_train_and_evict_restore_each_key_with_its_own_row_and_slot(tmp_path):
    """The DeepRec #1023 case: rows are evicted and reused by other ids while checkpoints are
    written. Every id's gradient is its own constant (1 + id % 3), so an id's Adagrad
    accumulator says how many updates it had and its weight must match that count: a
    weight or a slot saved under another id (a reused row) or from another moment would not.
    The restored key set is exactly the saved one, into another number of shards too."""
    lr = 0.1
    # steps_to_live well above the steps a session.run of another thread takes: a gradient
    # still in flight when its row is freed would land on the row's next owner (documented).
    g, table, ops = _build(dim=1, lr=lr, zeros=True, steps_to_live=40, capacity=1200,
                           devices=("/cpu:0", "/cpu:0"))
    curves = {gk: _adagrad_rows(gk, lr, 2000) for gk in (1.0, 2.0, 3.0)}
    saved, evicted_before = [], []
    with g.as_default(), _session(g) as sess:
        sess.run(ops["init"])
        stop = threading.Event()

        def train(seed):
            rng = np.random.default_rng(seed)
            base = 0
            while not stop.is_set():   # a window of ids that moves on: old ones stop appearing
                base += 10
                ids = np.unique(rng.integers(base, base + 100, 40))
                sess.run(ops["train"], {ops["ids"]: ids, ops["weight"]: 1.0 + ids % 3})

        def evict():
            while not stop.is_set():
                sess.run(ops["evict"])

        threads = [threading.Thread(target=train, args=(i,)) for i in range(2)] + [threading.Thread(target=evict)]
        for t in threads:
            t.start()
        try:
            for k in range(200):   # until rows have been evicted (and reused) before two saves
                if len(saved) >= 2 and evicted_before[-2]:
                    break
                evicted_before.append(sess.run(ops["stats"])[:, 2].sum())
                saved.append(ops["saver"].save(sess, str(tmp_path / "ckpt"), global_step=k))
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert evicted_before[-2] > 0                          # rows were evicted meanwhile

    for path in saved[-2:]:
        reader = tf.train.load_checkpoint(path)
        keys, values = reader.get_tensor("emb/keys"), reader.get_tensor("emb/values")[:, 0]
        accum = reader.get_tensor("emb/slots/Adagrad")[:, 0]
        assert len(keys) == len(set(keys.tolist())) > 0
        for k, w, a in zip(keys.tolist(), values, accum):
            gk = 1.0 + k % 3
            n = round((a - 0.1) / gk**2)
            assert abs(0.1 + n * gk**2 - a) < 1e-3, (k, w, a)   # n 0: allocated, its update not yet in
            assert abs(curves[gk][n] - w) < 1e-4, (k, n, w, curves[gk][n])
        # Restored into three shards: exactly the saved keys, each with its saved row and slot.
        g3, table3, ops3 = _build(dim=1, lr=lr, zeros=True, steps_to_live=40, capacity=1200,
                                  devices=("/cpu:0",) * 3)
        with g3.as_default(), _session(g3) as sess:
            ops3["saver"].restore(sess, path)
            live = _live(sess, table3)
            assert sorted(live) == sorted(keys.tolist())
            got = sess.run(ops3["rows"], {ops3["ids"]: keys})[:, 0]
            np.testing.assert_allclose(got, values)
            slots = sess.run([table3._slots(sh)[0] for sh in table3.shards])
            shards = sess.run(de.shard_of(tf.constant(keys, tf.int64), 3))
            for k, a, shard in zip(keys.tolist(), accum, shards.tolist()):
                assert abs(slots[shard][live[k], 0] - a) < 1e-6


def test_a_table_takes_strings_and_refuses_other_ids():
    g = tf.Graph()
    with g.as_default():
        table = de.DynamicTable(3, name="s", devices=["/cpu:0"])
        rows = table.lookup(tf.constant([["a", "b"], ["a", "c"]]), training=True)
        assert rows.shape.as_list() == [2, 2, 3] or rows.shape.rank == 3
        with pytest.raises(TypeError, match="string or integer ids"):
            table.lookup(tf.constant([1.5]), training=True)
        with _session(g) as sess:
            sess.run(v1.global_variables_initializer())
            out = sess.run(rows)
        np.testing.assert_array_equal(out[0, 0], out[1, 0])     # the same id, the same row
        assert not np.array_equal(out[0, 1], out[1, 1])


def test_a_full_shard_frees_its_oldest_rows_early_but_none_seen_within_the_minimum_age():
    g, table, ops = _build(capacity=10)   # no steps_to_live: only a full shard evicts
    age = de.EARLY_EVICTION_MIN_AGE
    with g.as_default(), _session(g) as sess:
        sess.run(ops["init"])
        for i in range(10):                                     # id i last seen at step i
            sess.run(ops["train"], {ops["ids"]: [i]})
        assert sess.run(ops["evict"]) == 0                      # full, but every row is young
        sess.run(ops["step"].assign(age + 1))                   # id 0 is now older than the minimum age
        assert sess.run(ops["evict"]) == 1                      # the oldest 10 % that are old enough
        assert set(_live(sess, table)) == set(range(1, 10))
        sess.run(ops["train"], {ops["ids"]: [10]})
        assert set(_live(sess, table)) == set(range(1, 11))
        assert sess.run(table.shards[0].weights).shape[0] == 11   # capacity + the default row


def test_an_early_eviction_never_frees_a_row_looked_up_in_the_current_step():
    """A full shard whose rows were all found at this step: before the minimum age, the early
    eviction freed 10 % of them (ties), so a gradient in flight landed on the row's next owner."""
    g, table, ops = _build(capacity=10)
    age = de.EARLY_EVICTION_MIN_AGE
    with g.as_default(), _session(g) as sess:
        sess.run(ops["init"])
        sess.run(ops["step"].assign(500))
        rows = sess.run(ops["rows"], {ops["ids"]: np.arange(10)})   # all ten seen at step 500
        assert rows.any(axis=1).all() and len(_live(sess, table)) == 10
        step = v1.placeholder(tf.int64, [])
        evict = table.evict_op(step)
        for now in (500, 501, 500 + age):                       # this step, and any within the minimum age
            assert sess.run(evict, {step: now}) == 0, now
        assert set(_live(sess, table)) == set(range(10))
        assert sess.run(evict, {step: 501 + age}) == 1          # older than that: one row goes


def _ancestors(tensors) -> set:
    seen, todo = set(), [t.op if hasattr(t, "op") else t for t in tensors]
    while todo:
        op = todo.pop()
        if op not in seen:
            seen.add(op)
            todo += [i.op for i in op.inputs] + list(op.control_inputs)
    return seen


def test_rows_are_gathered_before_the_shards_lock_is_released_in_training_and_not():
    """The lookup's read of the rows is an input of the lock's release: no eviction can give a
    row to another key between finding it and reading it (the gather ran after the release)."""
    g = tf.Graph()
    with g.as_default():
        table = de.DynamicTable(2, devices=["/cpu:0", "/cpu:0"], name="emb")
        before = set(g.get_operations())
        for training in (True, False):
            table.lookup(tf.constant([1, 2, 3], tf.int64), training=training)
        made = [op for op in g.get_operations() if op not in before]
        handles = {s.weights.handle.op for s in table.shards}
        gathers = [op for op in made if op.type == "ResourceGather" and op.inputs[0].op in handles]
        releases = [op for op in made if op.type == "ConsumeMutexLock"]
        assert len(gathers) == len(releases) == 4               # 2 shards x (training, not)
        under = set().union(*(_ancestors([r]) for r in releases))
        assert all(gt in under for gt in gathers), [gt.name for gt in gathers if gt not in under]


def test_the_id_minus_two_to_the_63_is_evicted_like_any_other():
    """-2**63 was the free-row marker of row_keys: a row it owned looked free and was never evicted."""
    g, table, ops = _build(steps_to_live=2)
    with g.as_default(), _session(g) as sess:
        sess.run(ops["init"])
        sess.run(ops["train"], {ops["ids"]: [-(2**63), 5]})
        assert set(_live(sess, table)) == {-(2**63), 5}
        for _ in range(4):
            sess.run(ops["train"], {ops["ids"]: [6]})
        assert sess.run(ops["evict"]) == 2
        assert set(_live(sess, table)) == {6}
        assert sess.run(table.shards[0].free_top) == table.shard_capacity - 1   # both rows back on the stack


@pytest.mark.parametrize("kwargs, message", [
    ({"output_dim": "8"}, r"output_dim must be a whole number .*not '8' \(a str\)"),
    ({"output_dim": 8.5}, r"output_dim must be a whole number .*not 8.5"),
    ({"output_dim": 0}, r"output_dim must be 1\.\."),
    ({"output_dim": 4, "min_count": 2.5}, r"min_count must be a whole number"),
    ({"output_dim": 4, "min_count": 2**31}, r"min_count must be 1\.\.2147483647 .*32 bits.*not 2147483648"),
    ({"output_dim": 4, "steps_to_live": 10.5}, r"steps_to_live must be a whole number"),
    ({"output_dim": 4, "capacity": 0}, r"capacity must be 1\.\.2147483647"),
    ({"output_dim": 4, "capacity": -3}, r"capacity must be 1\.\."),
    ({"output_dim": 4, "capacity": 999999999999}, r"capacity must be 1\.\.2147483647"),
])
def test_a_table_refuses_each_bad_argument_by_name_before_any_variable(kwargs, message):
    g = tf.Graph()
    with g.as_default():
        with pytest.raises(ValueError, match=message):
            de.DynamicTable(name="t", devices=["/cpu:0"], **kwargs)
        assert not g.get_collection(v1.GraphKeys.GLOBAL_VARIABLES)
        table = de.DynamicTable(np.int64(4), min_count=2**31 - 1, capacity=10, name="ok", devices=["/cpu:0"])
        assert (table.dim, table.min_count, table.capacity) == (4, 2**31 - 1, 10)


def test_the_keras_layer_refuses_bad_arguments_when_made_and_float_ids_in_one_line():
    import os
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    tf_keras = pytest.importorskip("tf_keras")
    from tfps.layers import DynamicEmbedding
    with pytest.raises(ValueError, match=r"DynamicEmbedding e: output_dim must be a whole number .*'8'"):
        DynamicEmbedding("8", name="e")
    with pytest.raises(ValueError, match=r"DynamicEmbedding e: capacity must be 1\.\."):
        DynamicEmbedding(8, capacity=0, name="e")
    with tf.Graph().as_default():
        with pytest.raises(TypeError) as e:
            DynamicEmbedding(4, name="e")(tf_keras.Input([2], dtype="float32"))
        assert str(e.value).startswith("DynamicEmbedding e takes string or integer ids (tf.string, tf.int32")
        assert "in user code" not in str(e.value)
        assert DynamicEmbedding(4, name="f")(tf_keras.Input([2], dtype="int64")).shape.as_list() == [None, 2, 4]


def test_a_checkpoint_saved_with_min_count_1_restores_into_a_table_with_a_larger_min_count(tmp_path):
    """--min_count 1 -> 3 with --replace failed every restore (NotFoundError: the checkpoint has
    no emb/sketch, saved only with min_count > 1). The job's saver restores zero counts, exact
    here: with min_count 1 every id seen has its row, so no id was being counted."""
    from tfps.layers import table_restore
    g, table, ops = _build(min_count=1)
    with g.as_default(), _session(g) as sess:
        sess.run(ops["init"])
        sess.run(ops["train"], {ops["ids"]: [1, 2, 3]})
        path = table_restore.job_saver(g, None).save(sess, str(tmp_path / "ckpt"), global_step=1)
        saved = sess.run(ops["rows"], {ops["ids"]: [1, 2, 3]})
    assert "emb/sketch" not in tf.train.load_checkpoint(path).get_variable_to_shape_map()
    g3, table3, ops3 = _build(min_count=3)
    with g3.as_default(), _session(g3) as sess:
        with pytest.raises(tf.errors.NotFoundError, match="emb/sketch"):   # what restoring it did
            ops3["saver"].restore(sess, path)
        table_restore.job_saver(g3, path).restore(sess, path)
        assert set(_live(sess, table3)) == {1, 2, 3}
        np.testing.assert_allclose(sess.run(ops3["rows"], {ops3["ids"]: [1, 2, 3]}), saved, rtol=1e-6)
        assert not sess.run(table3.shards[0].sketch).any()
        for _ in range(2):                                   # a new id is counted from zero: 3 sightings
            sess.run(ops3["train"], {ops3["ids"]: [9]})
            assert 9 not in _live(sess, table3)
        sess.run(ops3["train"], {ops3["ids"]: [9]})
        assert 9 in _live(sess, table3)
        # The other way (3 -> 1) needs nothing: the saved counts are not read.
        path3 = table_restore.job_saver(g3, path).save(sess, str(tmp_path / "ckpt3"), global_step=2)
    assert "emb/sketch" in tf.train.load_checkpoint(path3).get_variable_to_shape_map()
    g1, table1, ops1 = _build(min_count=1)
    with g1.as_default(), _session(g1) as sess:
        table_restore.job_saver(g1, path3).restore(sess, path3)
        assert set(_live(sess, table1)) == {1, 2, 3, 9}


def _hash_tables(graph) -> list:
    return [op for op in graph.get_operations() if op.type == "MutableHashTableV2"]


def test_a_table_trains_or_serves_by_its_serving_argument_not_by_a_context(tmp_path):
    """serving=True: the checkpoint's live rows as plain variables, loaded at the restore
    (serving_initializers), with no hash table in the graph; the default trains. Before, the
    mode was read from a thread-local that the export set around the model's construction."""
    g, table, ops = _build(dim=2, zeros=True)
    with g.as_default(), _session(g) as sess:
        sess.run(ops["init"])
        for _ in range(2):
            sess.run(ops["train"], {ops["ids"]: [3, 4], ops["weight"]: [1.0, -2.0]})
        trained = sess.run(ops["rows"], {ops["ids"]: [3, 4]})
        path = ops["saver"].save(sess, str(tmp_path / "ckpt"), global_step=2)
    assert _hash_tables(g) and trained.any()
    served = tf.Graph()
    with served.as_default():
        ids = v1.placeholder(tf.int64, [None])
        table = de.DynamicTable(2, name="emb", serving=True)
        rows = table.lookup(ids)
        with pytest.raises(ValueError, match="emb serves a checkpoint's rows .*build the training graph's table "
                                             "with serving=False"):
            table.lookup(ids, training=True)
        init = v1.global_variables_initializer()
    assert not _hash_tables(served) and table.shards == []
    with _session(served) as sess:
        sess.run(init)                                          # before the load: every id reads zeros
        assert not sess.run(rows, {ids: [3, 4, 5]}).any()
        for load, feed in de.serving_initializers(path, served):
            sess.run(load, feed)
        got = sess.run(rows, {ids: [4, 3, 5]})
    np.testing.assert_allclose(got, [trained[1], trained[0], [0.0, 0.0]])
    with pytest.raises(ValueError, match="serving must be True or False"):
        de.DynamicTable(2, name="x", serving="yes")


def test_the_keras_layer_trains_on_training_true_and_serves_on_training_false(tmp_path):
    import os
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    tf_keras = pytest.importorskip("tf_keras")
    from tfps.layers import DynamicEmbedding
    from tfps.task.output import export

    def model_in(graph, training):
        with graph.as_default():
            x = tf_keras.Input([2], dtype="int64")
            layer = DynamicEmbedding(3, name="e", initializer="ones")
            model = tf_keras.Model(x, tf_keras.layers.Lambda(lambda r: tf.reduce_sum(r, axis=[1, 2]))(layer(x)))
            assert layer.table is None                          # the construction's call builds no table
            ids = v1.placeholder(tf.int64, [None, 2])
            return ids, model(ids, training=training), layer

    g = tf.Graph()
    ids, out, layer = model_in(g, True)
    with g.as_default():
        step = v1.train.get_or_create_global_step()
        train = v1.train.GradientDescentOptimizer(0.5).minimize(tf.reduce_sum(out), global_step=step)
        saver = v1.train.Saver(de.saver_var_list())
        init = v1.global_variables_initializer()
    assert not layer.table.serving and _hash_tables(g)
    with _session(g) as sess:
        sess.run(init)
        sess.run(train, {ids: [[1, 2]]})                        # rows of 1 and 2: ones - 0.5
        path = saver.save(sess, str(tmp_path / "ckpt"), global_step=1)
    s = tf.Graph()
    ids, out, layer = model_in(s, False)
    assert layer.table.serving and not _hash_tables(s)
    with _session(s) as sess:
        export._restore(sess, path)                             # the export's and the evaluation's restore
        np.testing.assert_allclose(sess.run(out, {ids: [[1, 2], [2, 9]]}), [3.0, 1.5])
    with s.as_default(), pytest.raises(ValueError, match="training=False and then training=True in one graph"):
        layer(ids, training=True)
