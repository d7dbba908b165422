"""What a dynamic table changed since its last save: the table part of a delta checkpoint.

A delta holds, per table, the rows touched since the previous save (full or delta) with
their keys, values, optimizer slots and last-seen steps, and what left the table since:

* touched rows need no new state: ``last_seen`` already holds the global step of each row's
  last training lookup (and admission). A row whose ``last_seen`` is at least the previous
  save's step minus ``IN_FLIGHT_STEPS`` is saved: the optimizer updates only rows a step
  looked up, and a step's gradient may land up to that many global steps after its lookup
  (the bound the early eviction already relies on, ``EARLY_EVICTION_MIN_AGE``). A row looked
  up without a change is saved too: harmless, the value is the same;
* what left: each shard keeps, on its ps, the key of every row at the last delta (two local
  variables, not saved). A row that was live then and is now free or holds another key gave
  up its key: the delta lists it as evicted. The first delta after a full checkpoint has no
  such reference (its full save read the shards at another moment), so it carries the
  shard's whole live key set instead, and the restore keeps only those keys of the full
  checkpoint. Keys, rows, marks are read and the marks updated in ONE critical section of
  the shard, so no lookup or eviction falls between them.

Everything is concatenated over the shards and keyed by id, so a restore into another
number of ps hands each row to its owner (the full checkpoint's own restore does it).
"""

from __future__ import annotations

import tensorflow as tf

from tfps.layers import dynamic_embedding as de

v1 = tf.compat.v1

#: Rows last seen this many global steps before the previous save are saved again (see above).
IN_FLIGHT_STEPS = de.EARLY_EVICTION_MIN_AGE


def _marks(shard):
    """The shard's keys and liveness at the last delta (local variables on its ps, not saved)."""
    with tf.init_scope(), tf.device(shard.device), v1.name_scope(None):
        def local(name, init):
            return v1.Variable(init, trainable=False, name=f"{shard.name}/{name}", use_resource=True,
                               collections=[v1.GraphKeys.LOCAL_VARIABLES])
        keys = local("delta_keys", lambda: tf.fill([shard.cap], tf.constant(de.EMPTY_KEY, tf.int64)))
        live = local("delta_live", lambda: tf.zeros([shard.cap], tf.bool))
    return keys, live


def _shard_delta(table, shard, since, marks):
    """[keys, values, last_seen, *slots, evicted, live keys, sketch] of the rows of ``shard`` seen at
    or after ``since``, read and marked under the shard's lock."""
    slots = table._slots(shard)
    mark_keys, mark_live = marks

    def critical():
        seen = shard.last_seen.read_value()
        owners = shard.row_keys.read_value()
        live = tf.greater_equal(seen, 0)
        rows = tf.reshape(tf.where(tf.logical_and(live, seen >= since)), [-1])
        was, old = mark_live.read_value(), mark_keys.read_value()
        gone = tf.logical_and(was, tf.logical_or(tf.logical_not(live), tf.not_equal(owners, old)))
        out = [tf.gather(owners, rows), tf.gather(shard.weights, rows), tf.gather(seen, rows)]
        out += [tf.gather(s, rows) for s in slots]
        out += [tf.boolean_mask(old, gone), tf.boolean_mask(owners, live), shard.sketch.read_value()]
        with tf.control_dependencies(out):
            marked = [mark_keys.assign(owners, read_value=False), mark_live.assign(live, read_value=False)]
        with tf.control_dependencies(marked):
            return [tf.identity(x) for x in out]

    return de._locked(shard, critical)


class TableDeltas:
    """The delta ops of every dynamic table of a graph (built once, before it is finalized).

    ``fetches(with_keys)`` gives, per table, the tensors a delta saves; ``since`` is the
    placeholder of the previous save's global step. Run them and pass the result to
    :func:`arrays` for ``{table: {tensor name: numpy array}}``.
    """

    def __init__(self, graph=None, in_flight: int = IN_FLIGHT_STEPS):
        graph = graph or v1.get_default_graph()
        self.tables = [t for t in de.tables(graph) if t.shards]
        with graph.as_default(), v1.name_scope(None):
            self.since = v1.placeholder_with_default(tf.constant(0, tf.int64), [], name="tfps_delta_since")
            floor = self.since - in_flight
            self.ops = {}
            for t in self.tables:
                parts = [_shard_delta(t, s, floor, _marks(s)) for s in t.shards]
                names = t.slot_names()
                with tf.device(t.shards[0].device):
                    def cat(j):
                        return tf.concat([p[j] for p in parts], 0)
                    ops = {"keys": cat(0), "values": cat(1), "last_seen": cat(2)}
                    ops.update({f"slots/{n}": cat(3 + j) for j, n in enumerate(names)})
                    k = 3 + len(names)
                    ops["evicted"], ops["live_keys"] = cat(k), cat(k + 1)
                    if t.min_count > 1:   # saved whole, as the full checkpoint sums it
                        ops["sketch"] = tf.add_n([p[k + 2] for p in parts])
                self.ops[t.name] = ops

    def fetches(self, with_keys: bool) -> dict:
        """What a delta's run fetches: the live key sets only when ``with_keys`` (the first delta
        of a chain), the evictions since the last delta otherwise."""
        drop = "evicted" if with_keys else "live_keys"
        return {name: {k: v for k, v in ops.items() if k != drop} for name, ops in self.ops.items()}
