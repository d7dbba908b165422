"""Embeddings with one row per id, admitted by count and freed by age: stock TensorFlow only.

``DynamicTable`` is the table (plain ``tf.compat.v1`` graph ops, no tf_keras), and
``DynamicEmbedding`` (``keras_layer_class``) the tf_keras layer around it; it trains, or with
``serving=True`` (the layer: ``training=False``) serves a checkpoint's live rows. The design,
its bounds, its races and what a checkpoint guarantees: docs/design/dynamic_embedding.md.
Per training shard (one per ps task, :func:`shard_devices`; else one on the current device):

* ``table``: a ``MutableHashTable`` int64 key -> int64 row (string ids are keyed by their
  64-bit fingerprint, int64 ids by themselves);
* ``weights``: a ``[capacity + 1, dim]`` resource variable (row ``capacity`` is the
  default row, read as zeros); lookups are ``tf.gather``, so the optimizers' sparse
  updates touch the batch's rows only;
* ``free``/``free_top``: a stack of the free rows; ``row_keys``: each row's key;
  ``last_seen``: the global step each row was last looked up in training;
* ``sketch``: a count-min sketch (int32, ``SKETCH_DEPTH`` x ``SKETCH_WIDTH``) of the
  occurrences of ids that have no row yet (only with ``min_count`` > 1);
* a ``tf.CriticalSection``: lookups (find, allocate, gather), evictions, snapshots and
  restores take it in turn: a key never has two live rows, a row never changes owner in a read.
"""

from __future__ import annotations

import contextlib
import math
import threading
import weakref

import tensorflow as tf

from tfps import compat
from tfps.layers.table_args import check_id_dtype, check_table_args

v1 = tf.compat.v1

#: The count-min sketch of a shard: SKETCH_DEPTH rows of SKETCH_WIDTH int32 counters
#: (1 MiB). An id's count is overestimated by at most e/SKETCH_WIDTH of the counted
#: occurrences since the last halving, with probability 1 - e**-SKETCH_DEPTH.
SKETCH_DEPTH = 4
SKETCH_WIDTH = 1 << 16
#: Rows of a table when neither ``capacity`` nor ``expected_ids`` says.
DEFAULT_CAPACITY = 1 << 20
#: A shard gets its part of the capacity with this much room for an uneven hash.
SHARD_SLACK = 1.1
#: The key row_keys holds for a free row (an int64 id may be this value too: whether a row is
#: free is read from last_seen, -1 for a free row).
EMPTY_KEY = -(2**63)
#: A full shard's early eviction never frees a row last seen within this many global steps of
#: the eviction's step: a row found by a step whose gradient is still in flight keeps its key.
#: In async training, the global step moves on by the steps the other workers finish meanwhile
#: (about workers - 1 per step; more for a slow worker); in sync training by at most 1 (a later
#: gradient is dropped as stale). 100 covers tens of workers, or one 10x slower than the rest;
#: a shard whose every row is younger refuses new ids until rows age (read zeros, counted).
EARLY_EVICTION_MIN_AGE = 100
#: The tables built in each graph. Not a graph collection: a meta graph (every checkpoint's,
#: the SavedModel's) would write an object with a ``name`` as a node name and fail to load.
_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

_CONTEXT = threading.local()


@contextlib.contextmanager
def shard_devices(devices: list[str]):
    """While a model is built: its dynamic tables get one shard on each of ``devices``."""
    old = getattr(_CONTEXT, "devices", None)
    _CONTEXT.devices = list(devices)
    try:
        yield
    finally:
        _CONTEXT.devices = old


def fingerprint64(x):
    """A 64-bit fingerprint of each element of the 1-D tensor ``x`` (strings or numbers), as int64."""
    return tf.bitcast(tf.fingerprint(x), tf.int64)


def shard_of(keys, num_shards: int):
    """The shard of each int64 key: its fingerprint modulo ``num_shards`` (stable across runs)."""
    return tf.math.floormod(fingerprint64(keys), num_shards)


def tables(graph=None) -> list:
    return list(_TABLES.get(graph or v1.get_default_graph(), ()))


def saver_var_list(graph=None):
    """What the job's Saver saves: every global variable but the tables' own state, and one
    saveable per table (its live rows); None when the graph has no dynamic table (the
    Saver's default)."""
    graph = graph or v1.get_default_graph()
    found = tables(graph)
    if not found:
        return None
    owned = {id(v) for t in found for v in t.owned_variables()}
    kept = [v for v in graph.get_collection(v1.GraphKeys.GLOBAL_VARIABLES) if id(v) not in owned]
    others = list(graph.get_collection(v1.GraphKeys.SAVEABLE_OBJECTS))
    return kept + others + [t.saveable() for t in found if t.shards]


def serving_initializers(checkpoint: str, graph=None) -> list[tuple]:
    """(initializer op, feed_dict) that load each serving table of ``graph`` (``serving=True``)
    with the live rows of ``checkpoint`` (the export's and the evaluation's restore)."""
    reader = tf.train.load_checkpoint(checkpoint)
    return [t.serving_load(reader) for t in tables(graph) if t.serving]


def _initial(initializer, shape, dtype):
    try:
        return initializer(shape, dtype=dtype)
    except TypeError:
        return initializer(shape, dtype)


def _fill_value(variable) -> float:
    """The constant a slot variable starts from (Adagrad's 0.1, Adam's 0), else 0."""
    op = variable.initial_value.op
    try:
        if op.type == "Fill":
            return float(tf.get_static_value(op.inputs[1]))
        if op.type == "Const":
            value = tf.get_static_value(op.outputs[0])
            flat = value.reshape(-1)
            if flat.size and (flat == flat[0]).all():
                return float(flat[0])
    except (TypeError, ValueError):
        pass
    return 0.0


def _locked(shard, fn):
    """``fn()`` under ``shard``'s lock, on its device.

    tf.CriticalSection lists itself and its executions in two graph collections for its own
    checks while a graph is built; a meta graph (every checkpoint's) cannot hold them, so
    they are emptied again."""
    graph = v1.get_default_graph()
    with tf.device(shard.device):
        out = shard.lock.execute(fn, exclusive_resource_access=False)
    compat.clear_critical_section_collections(graph)
    return out


def _evict_writes(shard, table, rows, keys, m, top, shape, sketch, slots):
    """The writes of an eviction (inside the shard's lock, after its reads)."""
    writes = [tf.raw_ops.LookupTableRemoveV2(table_handle=shard.table, keys=keys),
              tf.raw_ops.ResourceScatterUpdate(resource=shard.weights.handle, indices=rows,
                                               updates=_initial(table.initializer, shape, tf.float32)),
              tf.raw_ops.ResourceScatterUpdate(resource=shard.row_keys.handle, indices=rows,
                                               updates=tf.fill([m], tf.constant(EMPTY_KEY, tf.int64))),
              tf.raw_ops.ResourceScatterUpdate(resource=shard.last_seen.handle, indices=rows,
                                               updates=tf.fill([m], tf.constant(-1, tf.int64))),
              tf.raw_ops.ResourceScatterUpdate(resource=shard.free.handle, indices=tf.range(top, top + m),
                                               updates=rows),
              shard.free_top.assign(top + m, read_value=False),
              shard.sketch.assign(tf.bitwise.right_shift(sketch, 1), read_value=False),   # counts decay
              shard.counters.assign_add(tf.stack([tf.constant(0, tf.int64), m, tf.constant(0, tf.int64)]),
                                        read_value=False)]
    for slot in slots:   # the optimizer's slots start again from their initial value
        writes.append(tf.raw_ops.ResourceScatterUpdate(
            resource=slot.handle, indices=rows,
            updates=tf.fill(shape, tf.constant(_fill_value(slot), slot.dtype.base_dtype))))
    with tf.control_dependencies(writes):
        return tf.identity(m)


class _Shard:
    def __init__(self, table: DynamicTable, index: int, device: str | None):
        self.index, self.device = index, device
        cap, dim, name = table.shard_capacity, table.dim, f"{table.name}/shard_{index}"
        self.name = name
        # Out of any loop body (a FuncGraph: the worker builds its steps in a while loop):
        # the shard's state lives in the graph itself, next to the other variables.
        with tf.init_scope(), tf.device(device), v1.name_scope(None):
            self.table = tf.raw_ops.MutableHashTableV2(
                key_dtype=tf.int64, value_dtype=tf.int64, shared_name=f"{name}/table",
                use_node_name_sharing=False, name=f"{name}/table")
            self.lock = tf.CriticalSection(name=f"{name}/lock", shared_name=f"{name}/lock")

            def var(vname, init, dtype, trainable=False):
                return v1.Variable(init, dtype=dtype, trainable=trainable, name=f"{name}/{vname}",
                                   use_resource=True)
            self.weights = var("weights", lambda: _initial(table.initializer, [cap + 1, dim], tf.float32),
                               tf.float32, trainable=True)
            self.free = var("free_rows", lambda: tf.range(cap - 1, -1, -1, dtype=tf.int64), tf.int64)
            self.free_top = var("free_top", lambda: tf.constant(cap, tf.int64), tf.int64)
            self.row_keys = var("row_keys", lambda: tf.fill([cap], tf.constant(EMPTY_KEY, tf.int64)), tf.int64)
            self.last_seen = var("last_seen", lambda: tf.fill([cap], tf.constant(-1, tf.int64)), tf.int64)
            self.sketch = var("sketch", lambda: tf.zeros([SKETCH_DEPTH * SKETCH_WIDTH], tf.int32), tf.int32)
            # admitted, evicted, refused: totals since the start (not saved)
            self.counters = var("counters", lambda: tf.zeros([3], tf.int64), tf.int64)
        self.cap = cap

    def variables(self) -> list:
        return [self.weights, self.free, self.free_top, self.row_keys, self.last_seen, self.sketch, self.counters]

    # ------------------------------------------------------------------ step path
    def sketch_index(self, keys):
        """Linear indices ``[SKETCH_DEPTH, n]`` of ``keys`` in the flat sketch."""
        h = fingerprint64(fingerprint64(keys))
        rows = [tf.bitwise.bitwise_and(tf.bitwise.right_shift(h, tf.constant(16 * d, tf.int64)),
                                       tf.constant(SKETCH_WIDTH - 1, tf.int64)) + d * SKETCH_WIDTH
                for d in range(SKETCH_DEPTH)]
        return tf.stack(rows)

    def lookup(self, table: DynamicTable, keys, counts, step, training: bool):
        """Values ``[n, dim]`` of the unique int64 ``keys``, read under the shard's lock (zeros for
        a key without a row: not admitted, or no room); in training, also counts the keys,
        allocates rows for admitted new keys and marks them seen at ``step``. The rows are
        gathered before the lock is released, so no eviction can hand a row to another key
        between finding it and reading it."""
        minus = tf.constant(-1, tf.int64)

        def read(final):
            with tf.control_dependencies([final]):
                safe = tf.where(final >= 0, final, tf.fill(tf.shape(final), tf.constant(self.cap, tf.int64)))
                return [final, tf.gather(self.weights, safe)]

        def critical():
            found = tf.raw_ops.LookupTableFindV2(table_handle=self.table, keys=keys, default_value=minus)
            if not training:
                return read(found)
            missing = found < 0
            new = tf.boolean_mask(keys, missing)
            if table.min_count > 1:
                idx = self.sketch_index(new)
                times = tf.cast(tf.tile(tf.boolean_mask(counts, missing)[None, :], [SKETCH_DEPTH, 1]), tf.int32)
                flat = tf.reshape(idx, [-1])
                added = tf.raw_ops.ResourceScatterAdd(resource=self.sketch.handle, indices=flat,
                                                      updates=tf.reshape(times, [-1]))
                with tf.control_dependencies([added]):
                    seen = tf.reshape(tf.gather(self.sketch.read_value(), flat), tf.shape(idx))
                new = tf.boolean_mask(new, tf.reduce_min(seen, axis=0) >= table.min_count)
            n = tf.size(new, out_type=tf.int64)
            top = self.free_top.read_value()
            take = tf.minimum(n, top)
            rows = tf.gather(self.free.read_value(), tf.range(top - take, top))
            taken = new[:take]
            with tf.control_dependencies([rows, found]):
                writes = [self.free_top.assign(top - take, read_value=False),
                          tf.raw_ops.LookupTableInsertV2(table_handle=self.table, keys=taken, values=rows),
                          tf.raw_ops.ResourceScatterUpdate(resource=self.row_keys.handle, indices=rows,
                                                           updates=taken),
                          self.counters.assign_add(tf.stack([take, tf.constant(0, tf.int64), n - take]),
                                                   read_value=False)]
            with tf.control_dependencies(writes):
                final = tf.raw_ops.LookupTableFindV2(table_handle=self.table, keys=keys, default_value=minus)
            live = tf.boolean_mask(final, final >= 0)
            seen_now = tf.raw_ops.ResourceScatterUpdate(
                resource=self.last_seen.handle, indices=live,
                updates=tf.fill(tf.shape(live), tf.cast(step, tf.int64)))
            with tf.control_dependencies([seen_now]):
                return read(tf.identity(final))

        rows, values = _locked(self, critical)
        with tf.device(self.device):   # the default row (capacity) reads as zeros; its gradient is 0
            return values * tf.cast(rows >= 0, values.dtype)[:, None]

    # ------------------------------------------------------------------ ps side
    def evict(self, table: DynamicTable, step, slots: list, oldest_share: float = 0.0,
              min_age: int = 0):
        """Free the rows not seen for ``steps_to_live`` steps (and, with ``oldest_share``, when
        the shard is nearly full, up to that share of its capacity, oldest first, among the rows
        last seen more than ``min_age`` steps before ``step``); halve the sketch. Returns the
        number of rows freed."""
        def critical():
            # Every value is read once, and every write waits for the reads: a write that ran
            # first would make the read see it (a row read as free keeps its key in the table).
            # A row is in use when it was seen (last_seen >= 0, set with its key under the lock):
            # row_keys cannot say it, since every int64, EMPTY_KEY too, is some integer id.
            owners = self.row_keys.read_value()
            seen = self.last_seen.read_value()
            used = tf.greater_equal(seen, 0)
            room = self.free_top.read_value()
            stale = tf.zeros_like(used)
            if table.steps_to_live:
                stale = tf.logical_and(used, seen < tf.cast(step, tf.int64) - table.steps_to_live)
            if oldest_share > 0:
                # Only rows older than min_age steps: a row looked up by a step still in flight
                # (its gradient not applied yet) stays with its key (docs/design/dynamic_embedding.md).
                want = int(self.cap * oldest_share)
                full = room < max(1, int(self.cap * 0.02))
                old = tf.logical_and(used, seen < tf.cast(step, tf.int64) - min_age)
                age = tf.where(old, -seen, tf.fill(tf.shape(seen), tf.constant(-(2**62), tf.int64)))
                _, oldest = tf.math.top_k(age, k=min(want, self.cap))
                early = tf.scatter_nd(oldest[:, None], tf.ones_like(oldest, tf.bool), [self.cap])
                stale = tf.logical_or(stale, tf.logical_and(full, tf.logical_and(early, old)))
            rows = tf.reshape(tf.where(stale), [-1])
            keys = tf.gather(owners, rows)
            m = tf.size(rows, out_type=tf.int64)
            top = room
            shape = tf.stack([m, table.dim])
            sketch = self.sketch.read_value()
            with tf.control_dependencies([keys, top, sketch]):
                return _evict_writes(self, table, rows, keys, m, top, shape, sketch, slots)

        return _locked(self, critical)

    def stats(self):
        """[live rows, admitted, evicted, refused] of this shard."""
        with tf.device(self.device):
            live = tf.raw_ops.LookupTableSizeV2(table_handle=self.table)
            return tf.concat([live[None], self.counters.read_value()], 0)

    def snapshot(self, slots: list):
        """Keys, weights rows, slot rows, last-seen steps and the sketch of this shard, read
        under its lock (so every row read belongs to the key read with it)."""
        def critical():
            keys, rows = tf.raw_ops.LookupTableExportV2(table_handle=self.table, Tkeys=tf.int64, Tvalues=tf.int64)
            out = [keys, tf.gather(self.weights, rows), tf.gather(self.last_seen, rows)]
            out += [tf.gather(s, rows) for s in slots]
            out.append(self.sketch.read_value())
            return out

        return _locked(self, critical)

    def restore(self, table: DynamicTable, keys, values, last_seen, slot_values: list, slots: list, sketch):
        """Make this shard hold exactly the saved keys it owns under the current shard count."""
        def critical():
            mine = tf.reshape(tf.where(tf.equal(shard_of(keys, table.num_shards), self.index)), [-1])
            k = tf.gather(keys, mine)
            n = tf.size(k, out_type=tf.int64)
            check = tf.debugging.assert_less_equal(
                n, tf.constant(self.cap, tf.int64),
                message=f"{self.name}: the checkpoint holds more live ids than this shard's capacity "
                        f"({self.cap} rows); restore with a larger capacity (--expected_ids)")
            with tf.control_dependencies([check]):   # every op that sizes rows by n waits for the check
                n = tf.identity(n)
                rows = tf.range(n)
            cap = self.cap
            fresh = _initial(table.initializer, [cap + 1, table.dim], tf.float32)
            writes = [self.weights.assign(tf.tensor_scatter_nd_update(fresh, rows[:, None], tf.gather(values, mine)),
                                          read_value=False),
                      self.row_keys.assign(tf.tensor_scatter_nd_update(
                          tf.fill([cap], tf.constant(EMPTY_KEY, tf.int64)), rows[:, None], k), read_value=False),
                      self.last_seen.assign(tf.tensor_scatter_nd_update(
                          tf.fill([cap], tf.constant(-1, tf.int64)), rows[:, None], tf.gather(last_seen, mine)),
                          read_value=False),
                      self.free.assign(tf.concat([tf.range(cap - 1, n - 1, -1, dtype=tf.int64),
                                                  tf.zeros([n], tf.int64)], 0), read_value=False),
                      self.free_top.assign(cap - n, read_value=False),
                      self.sketch.assign(sketch if sketch is not None else tf.zeros_like(self.sketch),
                                         read_value=False),
                      self.counters.assign(tf.zeros([3], tf.int64), read_value=False),
                      tf.raw_ops.LookupTableImportV2(table_handle=self.table, keys=k, values=rows)]
            for slot, saved in zip(slots, slot_values):
                base = tf.fill([cap + 1, table.dim], tf.constant(_fill_value(slot), slot.dtype.base_dtype))
                writes.append(slot.assign(tf.tensor_scatter_nd_update(base, rows[:, None], tf.gather(saved, mine)),
                                          read_value=False))
            with tf.control_dependencies(writes):
                return tf.identity(n)

        return _locked(self, critical)


class DynamicTable:
    """One embedding row per id; see the module docstring.

    ``output_dim``: the row width. ``min_count``: occurrences (counted in training) before an
    id gets a row; until then it reads zeros. ``steps_to_live``: rows not looked up in
    training for that many global steps are freed by :meth:`evict_op`. ``capacity``: rows
    of the whole table (split over the shards), a hard budget. ``initializer``: of new rows.
    ``serving``: False (the default), the table trains: shards on the ps with their hash
    tables. True, it serves a checkpoint's live rows (an export's or an evaluation's graph):
    two plain variables, sorted keys and their rows, loaded by :func:`serving_initializers`
    (empty until then: every id reads zeros). A model_fn passes ``serving=(mode != "train")``.
    """

    def __init__(self, output_dim: int, min_count: int = 1, steps_to_live: int | None = None,
                 capacity: int | None = None, initializer=None, name: str = "dynamic_embedding",
                 devices: list | None = None, serving: bool = False):
        output_dim, min_count, steps_to_live, capacity = check_table_args(
            name, output_dim, min_count, steps_to_live, capacity)
        self.name, self.dim, self.min_count, self.steps_to_live = name, output_dim, min_count, steps_to_live
        self.capacity = capacity or DEFAULT_CAPACITY
        self.initializer = initializer or v1.random_uniform_initializer(-0.05, 0.05)
        devices = devices if devices is not None else getattr(_CONTEXT, "devices", None) or [None]
        self.num_shards = len(devices)
        self.shard_capacity = max(1, math.ceil(self.capacity * (SHARD_SLACK if self.num_shards > 1 else 1)
                                                / self.num_shards))
        if not isinstance(serving, bool):
            raise ValueError(f"DynamicTable {name}: serving must be True or False, not {serving!r}")
        self.serving = serving
        self.own_step = None      # the table's own step count, where the graph has no global step
        self.chief_ops = None     # the chief's eviction and counts (tfps.task.graph.tables)
        self._saveable = None
        if serving:
            self._build_serving()
            self.shards = []
        else:
            self.shards = [_Shard(self, i, d) for i, d in enumerate(devices)]
        with tf.init_scope():   # the graph itself, not a loop body's FuncGraph
            _TABLES.setdefault(v1.get_default_graph(), []).append(self)

    # ------------------------------------------------------------------ lookups
    def keys_of(self, ids):
        """int64 keys of ``ids`` (1-D): fingerprints of strings, int64 ids as they are."""
        check_id_dtype(self.name, ids.dtype)
        return fingerprint64(ids) if ids.dtype == tf.string else tf.cast(ids, tf.int64)

    def lookup(self, ids, training: bool = False):
        """Rows of ``ids`` (any shape), shape ``ids.shape + [dim]``."""
        ids = tf.convert_to_tensor(ids)
        flat = tf.reshape(ids, [-1])
        keys = self.keys_of(flat)
        if self.serving:
            if training is True:
                raise ValueError(f"DynamicTable {self.name} serves a checkpoint's rows (serving=True) and cannot "
                                 "train; build the training graph's table with serving=False")
            out = self._serve(keys)
        else:
            uniq, idx, counts = tf.unique_with_counts(keys, out_idx=tf.int64)
            step = self._step() if training else None
            if self.num_shards == 1:
                values = self.shards[0].lookup(self, uniq, counts, step, training)
            else:
                shard = tf.cast(shard_of(uniq, self.num_shards), tf.int32)
                positions = tf.dynamic_partition(tf.range(tf.size(uniq)), shard, self.num_shards)
                ukeys = tf.dynamic_partition(uniq, shard, self.num_shards)
                ucounts = tf.dynamic_partition(counts, shard, self.num_shards)
                parts = [s.lookup(self, k, c, step, training) for s, k, c in zip(self.shards, ukeys, ucounts)]
                values = tf.dynamic_stitch(positions, parts)
            out = tf.gather(values, idx)
        return tf.reshape(out, tf.concat([tf.shape(ids), [self.dim]], 0))

    def _step(self):
        step = v1.train.get_global_step()
        if step is not None:
            with tf.device(step.device):
                return tf.identity(step.read_value())
        if self.own_step is None:
            with tf.init_scope(), tf.device(self.shards[0].device), v1.name_scope(None):
                self.own_step = v1.Variable(lambda: tf.constant(0, tf.int64), trainable=False,
                                             name=f"{self.name}/lookups", use_resource=True)
        return self.own_step.assign_add(1)

    # ------------------------------------------------------------------ the chief
    def owned_variables(self) -> list:
        own = [v for s in self.shards for v in s.variables()] + [v for s in self.shards for v in self._slots(s)]
        if self.own_step is not None:
            own.append(self.own_step)
        return own

    def _slots(self, shard) -> list:
        """The optimizer's slots of ``shard``'s weights (``.../weights/Adagrad``): found by name."""
        prefix = shard.weights.op.name + "/"
        return [v for v in shard.weights.graph.get_collection(v1.GraphKeys.GLOBAL_VARIABLES)
                if v.op.name.startswith(prefix) and v.shape.as_list() == shard.weights.shape.as_list()]

    def evict_op(self, step=None, oldest_share: float = 0.1, min_age: int = EARLY_EVICTION_MIN_AGE):
        """Frees the rows to evict on every shard, each on its own device; returns the count.
        A full shard's early eviction (``oldest_share``) spares rows seen in the last
        ``min_age`` global steps."""
        step = step if step is not None else self._step()
        return tf.add_n([s.evict(self, step, self._slots(s), oldest_share, min_age) for s in self.shards])

    def stats_op(self):
        """``[shards, 4]``: live rows, admitted, evicted, refused of each shard."""
        return tf.stack([s.stats() for s in self.shards])

    def slot_names(self) -> list[str]:
        if not self.shards:
            return []
        prefix = self.shards[0].weights.op.name + "/"
        return [v.op.name[len(prefix):] for v in self._slots(self.shards[0])]

    def saveable(self):
        if self._saveable is None:
            self._saveable = _saveable_of(self)
        return self._saveable

    # ------------------------------------------------------------------ serving
    def _build_serving(self) -> None:
        """Sorted keys and their rows as two variables of any length (fed by serving_load);
        empty by default: no key, only the zero row."""
        with tf.init_scope(), v1.name_scope(None):
            pk = v1.placeholder_with_default(tf.zeros([0], tf.int64), [None], name=f"{self.name}/serving_keys_value")
            pv = v1.placeholder_with_default(tf.zeros([1, self.dim], tf.float32), [None, self.dim],
                                             name=f"{self.name}/serving_values_value")
            self.serving_keys = v1.Variable(pk, trainable=False, name=f"{self.name}/serving_keys", use_resource=True,
                                            shape=tf.TensorShape([None]))
            self.serving_values = v1.Variable(pv, trainable=False, name=f"{self.name}/serving_values",
                                              use_resource=True, shape=tf.TensorShape([None, self.dim]))
        self._serving_feeds = (pk, pv)

    def serving_load(self, reader) -> tuple:
        """(initializer, feed_dict) giving this serving table the live rows saved in ``reader``."""
        import numpy as np
        keys = reader.get_tensor(f"{self.name}/keys")
        values = reader.get_tensor(f"{self.name}/values")
        order = np.argsort(keys, kind="stable")
        values = np.concatenate([values[order], np.zeros([1, self.dim], np.float32)], 0)
        pk, pv = self._serving_feeds
        return tf.group(self.serving_keys.initializer, self.serving_values.initializer), {pk: keys[order], pv: values}

    def _serve(self, keys):
        known = self.serving_keys.read_value()
        n = tf.size(known, out_type=tf.int64)
        at = tf.minimum(tf.searchsorted(known, keys, out_type=tf.int64), tf.maximum(n - 1, 0))
        hit = tf.logical_and(n > 0, tf.equal(tf.gather(tf.concat([known, [EMPTY_KEY]], 0), at), keys))
        return tf.gather(self.serving_values, tf.where(hit, at, tf.fill(tf.shape(at), n)))


def _saveable_of(table: DynamicTable):
    """One SaveableObject of the whole table: keys, values, last-seen steps, slots (by name)
    and the sketch (the shards' sketches summed), each one tensor over all shards, so that a
    restore into another number of shards hands each key to its new owner."""
    saveable_object, save_spec = compat.saveable_classes()
    slots = [table._slots(s) for s in table.shards]
    names = table.slot_names()
    snaps = [s.snapshot(sl) for s, sl in zip(table.shards, slots)]
    with tf.device(table.shards[0].device):
        keys = tf.concat([sn[0] for sn in snaps], 0)
        values = tf.concat([sn[1] for sn in snaps], 0)
        seen = tf.concat([sn[2] for sn in snaps], 0)
        slot_values = [tf.concat([sn[3 + j] for sn in snaps], 0) for j in range(len(names))]
        sketch = tf.add_n([sn[-1] for sn in snaps])
    tensors = [("keys", keys), ("values", values), ("last_seen", seen)]
    if table.min_count > 1:   # the admission counts matter only then (1 MiB a shard)
        tensors.append(("sketch", sketch))
    tensors += [(f"slots/{n}", t) for n, t in zip(names, slot_values)]

    class TableSaveable(saveable_object):
        def restore(self, restored_tensors, restored_shapes):
            got = dict(zip([n for n, _ in tensors], restored_tensors))
            return tf.group(*[s.restore(table, got["keys"], got["values"], got["last_seen"],
                                        [got[f"slots/{n}"] for n in names], sl, got.get("sketch"))
                              for s, sl in zip(table.shards, slots)])

    specs = [save_spec(t, "", f"{table.name}/{n}") for n, t in tensors]
    return TableSaveable(keys, specs, table.name)


def keras_layer_class():
    """The tf_keras layer ``DynamicEmbedding`` (imports tf_keras: only when asked for)."""
    global _LAYER
    if _LAYER is not None:
        return _LAYER
    import tf_keras

    class DynamicEmbedding(tf_keras.layers.Layer):
        """A tf_keras layer: ``DynamicEmbedding(output_dim, min_count=1, steps_to_live=None,
        capacity=None, initializer=None, name=None)``; takes string or integer ids of any
        shape and returns ``ids.shape + [output_dim]``. Graph mode (what tfps trains in)."""

        def __init__(self, output_dim, min_count=1, steps_to_live=None, capacity=None, initializer=None,
                     name=None, **kwargs):
            super().__init__(name=name, **kwargs)
            check_table_args(self.name, output_dim, min_count, steps_to_live, capacity)   # ValueError now
            self.output_dim, self.min_count, self.steps_to_live = output_dim, min_count, steps_to_live
            self.capacity, self.initializer = capacity, initializer
            self.table = None   # made by the first call that says training=True or False

        def _table(self, serving: bool):
            if self.table is None:
                self.table = DynamicTable(self.output_dim, self.min_count, self.steps_to_live, self.capacity,
                                          tf_keras.initializers.get(self.initializer) if self.initializer else None,
                                          name=self.name, serving=serving)
                self.table_weights = [s.weights for s in self.table.shards]
            elif self.table.serving != serving:
                raise ValueError(f"DynamicEmbedding {self.name} was called with training={not self.table.serving} "
                                 f"and then training={not serving} in one graph: a graph either trains the "
                                 "table or serves a checkpoint's rows; build a model per graph")
            return self.table

        def __call__(self, ids, *args, **kwargs):
            # Refused here, not in call(): autograph would wrap the error in a traceback of its own.
            dtype = getattr(ids, "dtype", None)
            if dtype is not None:
                check_id_dtype(self.name, tf.as_dtype(dtype))
            return super().__call__(ids, *args, **kwargs)

        def call(self, ids, training=None):
            # Train or serve is the call's explicit training: True trains the table on the ps,
            # False serves a checkpoint's live rows (tfps's export and evaluation). A call that
            # says neither (the functional model's construction on keras.Input) builds no table
            # and gives zeros of the right shape, unless the graph's table is already made.
            if isinstance(training, (bool, int)) and not isinstance(training, tf.Tensor):
                return self._table(serving=not training).lookup(ids, training=bool(training))
            if self.table is not None:
                return self.table.lookup(ids, training=False)
            return tf.zeros(tf.concat([tf.shape(ids), [self.output_dim]], 0), tf.float32)

        def compute_output_shape(self, input_shape):
            return tf.TensorShape(input_shape).concatenate([self.output_dim])

        def get_config(self):
            return {**super().get_config(), "output_dim": self.output_dim, "min_count": self.min_count,
                    "steps_to_live": self.steps_to_live, "capacity": self.capacity}

    _LAYER = DynamicEmbedding
    return _LAYER


_LAYER = None
