"""Big variables split row-wise over every ps, small ones left whole.

Parameter servers exist for models whose tables do not fit one process, so a variable
larger than ``--partition_mb`` is split row-wise into one shard per ps task (TensorFlow's
partitioned variables: ``row_partitioner``). ``tf.nn.embedding_lookup`` sends each id to
the shard that holds its row, and the gradient stays ``IndexedSlices`` per shard, so only
the touched rows travel and are updated. A model is built inside ``partitioned``: its
``get_variable`` calls and, for a tf_keras model, its layers' ``add_weight``
(tfps.task.graph.keras_weights) split big variables the same way.

The checkpoint holds each partitioned variable whole (with its slices), so a job resumed
with another number of ps tasks splits it again, and the export (a fresh local graph)
restores the whole table.
"""

from __future__ import annotations

import contextlib

from tfps.task.graph.keras_weights import partitioned_keras_weights
from tfps.task.graph.placement import variable_bytes


def row_partitioner(num_ps: int, partition_bytes: int):
    """A partitioner that splits a variable over ``num_ps`` shards by rows when it is larger
    than ``partition_bytes``, and leaves smaller ones whole."""
    def partition(shape, dtype):
        dims = shape.as_list()
        rows = dims[0] if dims else 0
        if num_ps > 1 and rows and rows >= num_ps and variable_bytes(shape, dtype) > partition_bytes:
            return [num_ps] + [1] * (len(dims) - 1)
        return [1] * len(dims)
    return partition


def _splits(partitioner, shape, dtype) -> bool:
    """Whether ``partitioner`` splits a variable of this shape and dtype (known shapes only)."""
    import tensorflow as tf
    if shape is None:
        return False
    tshape = tf.TensorShape(shape)
    return bool(tshape.is_fully_defined() and tshape.rank
                and partitioner(tshape, tf.as_dtype(dtype))[0] > 1)


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

    keras_split = (partitioned_keras_weights(split, lambda shape, dtype: _splits(split, shape, dtype)) if keras
                   else contextlib.nullcontext())
    with v1.variable_scope(v1.get_variable_scope(), custom_getter=split_big), keras_split:
        yield
