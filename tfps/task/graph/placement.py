"""Where the variables live: big ones split over every ps, the rest placed by bytes.

Parameter servers exist for models whose tables do not fit one process, so:

* a variable larger than ``--partition_mb`` is split row-wise into one shard per ps task
  (TensorFlow's partitioned variables: ``row_partitioner``). ``tf.nn.embedding_lookup``
  sends each id to the shard that holds its row, and the gradient stays ``IndexedSlices``
  per shard, so only the touched rows travel and are updated;
* every other variable (and every shard) goes to the ps with the fewest bytes so far
  (``ByteBalancer``, the ``ps_strategy`` of ``replica_device_setter``), instead of
  round-robin, which put a whole table on one ps and a few biases on the other;
* a tf_keras layer creates its weights through ``Layer.add_weight``, which takes a
  ``partitioner`` but is never given one by Keras: ``partitioned_keras_weights`` passes ours
  while a model is built, so an ``Embedding`` of a Keras model is split the same way.

Every worker builds the same graph in the same order, so every worker computes the same
placement. The checkpoint holds each partitioned variable whole (with its slices), so a job
resumed with another number of ps tasks splits it again, and the export (a fresh local
graph) restores the whole table.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re

from tfps import compat

log = logging.getLogger("tfps")

def _nbytes(shape, dtype) -> int:
    dims = [int(d) if d is not None else 0 for d in (shape.as_list() if hasattr(shape, "as_list") else shape)]
    return math.prod(dims) * dtype.size if dims else dtype.size


def row_partitioner(num_ps: int, partition_bytes: int):
    """A partitioner that splits a variable over ``num_ps`` shards by rows when it is larger
    than ``partition_bytes``, and leaves smaller ones whole."""
    def partition(shape, dtype):
        dims = shape.as_list()
        rows = dims[0] if dims else 0
        if num_ps > 1 and rows and rows >= num_ps and _nbytes(shape, dtype) > partition_bytes:
            return [num_ps] + [1] * (len(dims) - 1)
        return [1] * len(dims)
    return partition


def _per_shard(initializer):
    """A Keras initializer that draws each shard anew: an unseeded Keras initializer called
    twice returns the same values, which would make every shard a copy of the first."""
    config = initializer.get_config() if hasattr(initializer, "get_config") else None
    if config is None or "seed" not in config:
        return initializer

    def init(shape, dtype=None, partition_info=None):
        offset = partition_info.var_offset[0] if partition_info is not None else 0
        seed = (config.get("seed") or 0) * 1_000_003 + offset
        return type(initializer).from_config({**config, "seed": seed})(shape, dtype=dtype)
    return init


def _splits(partitioner, shape, dtype) -> bool:
    """Whether ``partitioner`` splits a variable of this shape and dtype (known shapes only)."""
    import tensorflow as tf
    if shape is None:
        return False
    tshape = tf.TensorShape(shape)
    return bool(tshape.is_fully_defined() and tshape.rank
                and partitioner(tshape, tf.as_dtype(dtype))[0] > 1)


class ByteBalancer:
    """``ps_strategy`` for ``replica_device_setter``: the ps with the fewest bytes so far.

    Called once per variable op in creation order; records what it placed where, so that
    the chief can say what each ps holds.
    """

    def __init__(self, num_ps: int):
        self.loads = [0] * num_ps
        self.placed: dict[str, tuple[int, int]] = {}
        self.slots: set[str] = set()   # the optimizer's slots among ``placed``

    def __call__(self, op) -> int:
        import tensorflow as tf
        try:
            nbytes = _nbytes(tf.TensorShape(op.get_attr("shape")), tf.as_dtype(op.get_attr("dtype")))
        except (ValueError, TypeError):
            nbytes = 0
        # An optimizer's slot (``table/part_0/Adam``) is colocated with its variable when the
        # graph is placed, after this choice: count its bytes where it will live.
        primary = op.name.rpartition("/")[0]
        if primary in self.placed:
            ps = self.placed[primary][0]   # an optimizer slot lives with its variable
            self.slots.add(op.name)
        else:
            ps = min(range(len(self.loads)), key=lambda i: (self.loads[i], i))
        self.loads[ps] += nbytes
        self.placed[op.name] = (ps, nbytes)
        return ps

    def shares_mb(self) -> dict[str, float]:
        """Megabytes of variables each ps holds, the optimizer's slots included (from the shapes)."""
        return {f"ps{i}": round(load / 2**20, 2) for i, load in enumerate(self.loads)}

    def variables_bytes(self) -> dict[str, int]:
        """Bytes of each variable without the optimizer's slots, a partitioned one whole
        (``table/embeddings``, not its ``part_N``): what a fresh graph restores."""
        whole: dict[str, int] = {}
        for name, (_, nbytes) in self.placed.items():
            if name not in self.slots:
                key = re.sub(r"/part_\d+$", "", name)
                whole[key] = whole.get(key, 0) + nbytes
        return whole


def device_setter(task, cluster_spec, balancer: ByteBalancer):
    import tensorflow as tf
    return tf.compat.v1.train.replica_device_setter(
        worker_device=f"/job:worker/task:{task.index}", cluster=cluster_spec, ps_strategy=balancer)


@contextlib.contextmanager
def partitioned(num_ps: int, partition_mb: float, keras: bool = True):
    """Build a model inside this: ``get_variable`` and tf_keras ``add_weight`` split big variables.

    ``keras=False`` (a built-in model: plain ops and ``get_variable``) leaves tf_keras alone:
    not even imported, which a task's start-up would pay for nothing."""
    import tensorflow as tf
    v1 = tf.compat.v1
    split = row_partitioner(num_ps, int(partition_mb * 2**20))

    def split_big(getter, name, shape=None, dtype=tf.float32, partitioner=None, **kwargs):
        # Only variables that are split get a partitioner: a partitioner of one shard would
        # still turn a small variable into a PartitionedVariable (a concat on every read).
        if partitioner is None and _splits(split, shape, dtype):
            partitioner = split
        return getter(name, shape=shape, dtype=dtype, partitioner=partitioner, **kwargs)

    with v1.variable_scope(v1.get_variable_scope(), custom_getter=split_big), \
            (partitioned_keras_weights(split) if keras else contextlib.nullcontext()):
        yield


@contextlib.contextmanager
def partitioned_keras_weights(partitioner):
    """While a tf_keras model is built in a graph: its weights above the size are split.

    tf_keras's graph-mode layers take ``add_weight(partitioner=...)``, but Keras never passes
    one, and its TF2 layers (what a model built in a ``tf.Graph`` of TensorFlow 2 gets)
    ignore the argument. So a big weight is created here instead, as a partitioned
    variable named as Keras would name it (``table/embeddings``): ``Embedding`` looks its
    rows up with ``tf.nn.embedding_lookup``, which takes the shards as they are, and the
    fresh export graph (built without this) restores the whole table under that name.
    """
    def wrap(original):
        def add_weight(self, name=None, shape=None, dtype=None, initializer=None, *args, **kwargs):
            if kwargs.get("partitioner") is None and _splits(partitioner, shape, dtype or self.dtype or "float32"):
                import tensorflow as tf
                from tf_keras import initializers
                v1 = tf.compat.v1
                with v1.variable_scope(v1.VariableScope(reuse=v1.AUTO_REUSE, name="")):
                    return v1.get_variable(
                        f"{self.name}/{name}", shape=shape, dtype=tf.as_dtype(dtype or self.dtype or "float32"),
                        initializer=_per_shard(initializers.get(initializer)), partitioner=partitioner,
                        trainable=kwargs.get("trainable", True) is not False)
            return original(self, name, shape, dtype, initializer, *args, **kwargs)
        return add_weight

    with compat.keras_add_weight_wrapped(wrap):   # tf_keras's layer bases; nothing without tf_keras
        yield
