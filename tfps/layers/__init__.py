"""Keras layers for tfps models: ``DynamicEmbedding`` (one row per id, admitted by count,
freed by age, saved and served by its live rows; docs/design/dynamic_embedding.md).

``tfps.layers.DynamicEmbedding`` is the tf_keras layer (tf_keras is imported when it is first
named); ``tfps.layers.DynamicTable`` the same table as plain graph ops, for a model_fn.
"""

from __future__ import annotations

from tfps.layers.dynamic_embedding import DynamicTable, keras_layer_class, shard_devices  # noqa: F401 - the interface

__all__ = ["DynamicEmbedding", "DynamicTable", "shard_devices"]


def __getattr__(name: str):
    if name == "DynamicEmbedding":
        return keras_layer_class()
    raise AttributeError(f"module 'tfps.layers' has no attribute {name!r}")
