"""A tf_keras model's big weights split over the ps like any big variable.

tf_keras's graph-mode layers take ``add_weight(partitioner=...)``, but Keras never passes one;
``partitioned_keras_weights`` passes tfps's while a model is built (tfps.task.graph.partition),
through the ``add_weight`` wrapper of ``tfps.compat.keras_add_weight_wrapped``.
"""

from __future__ import annotations

import contextlib

from tfps import compat


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


@contextlib.contextmanager
def partitioned_keras_weights(partitioner, splits):
    """While a tf_keras model is built in a graph: its weights that ``splits(shape, dtype)``
    says ``partitioner`` splits are created split.

    tf_keras's graph-mode layers take ``add_weight(partitioner=...)``, but Keras never passes
    one, and its TF2 layers (what a model built in a ``tf.Graph`` of TensorFlow 2 gets)
    ignore the argument. So a big weight is created here instead, as a partitioned
    variable named as Keras would name it (``table/embeddings``): ``Embedding`` looks its
    rows up with ``tf.nn.embedding_lookup``, which takes the shards as they are, and the
    fresh export graph (built without this) restores the whole table under that name.
    """
    def wrap(original):
        def add_weight(self, name=None, shape=None, dtype=None, initializer=None, *args, **kwargs):
            if kwargs.get("partitioner") is None and splits(shape, dtype or self.dtype or "float32"):
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
