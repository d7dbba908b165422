"""tfps.task.graph.tables' DynamicTablesHook in one process: the chief's eviction follows the global
step, not the chief's own steps (other workers' steps count as much)."""

from __future__ import annotations

import time

import tensorflow as tf

from tfps.layers import dynamic_embedding as de
from tfps.task.graph.tables import DynamicTablesHook

v1 = tf.compat.v1


def test_the_chief_evicts_as_other_workers_advance_the_global_step_without_a_step_of_its_own():
    g = tf.Graph()
    with g.as_default():
        step = v1.train.get_or_create_global_step()
        ids = v1.placeholder(tf.int64, [None], name="ids")
        table = de.DynamicTable(2, steps_to_live=8, capacity=100, devices=["/cpu:0"], name="emb")
        rows = table.lookup(ids, training=True)
        advance = step.assign_add(1)                        # another worker's step
        keys = tf.raw_ops.LookupTableExportV2(table_handle=table.shards[0].table, Tkeys=tf.int64,
                                              Tvalues=tf.int64)[0]
        stats = table.stats_op()
        hook = DynamicTablesHook(tf.identity(step.read_value()), log_steps=100)
        hook.begin()
        init = v1.global_variables_initializer()
    assert hook.every == 2                                  # a quarter of steps_to_live
    sess = v1.Session(graph=g, config=v1.ConfigProto(inter_op_parallelism_threads=2,
                                                     intra_op_parallelism_threads=1))
    sess.run(init)
    sess.run(rows, {ids: [1]})                              # id 1 seen at step 0, then never again
    hook.after_create_session(sess, None)                   # the chief's hook never sees a run of its own
    try:
        for k in range(1, 41):                              # ids 1001..1040, each seen at its own step
            sess.run(advance)
            sess.run(rows, {ids: [1000 + k]})
            time.sleep(0.02)
        deadline = time.monotonic() + 60
        while (hook.evicted_at or 0) < 40 - hook.every + 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        # The last eviction ran at step 39 or 40 (then none is due until the step moves on): it
        # freed the rows last seen before step 31 or 32, id 1 and 1001..1030 at least.
        assert hook.evicted_at >= 39, hook.evicted_at
        live = set(sess.run(keys).tolist())
        assert not live & ({1} | set(range(1001, 1031))), sorted(live)
        assert set(range(1032, 1041)) <= live, sorted(live)
        assert sess.run(stats)[0].tolist()[2] == 41 - len(live), (sorted(live), hook.evicted_at)   # the others
    finally:
        hook.end(sess)
        sess.close()
