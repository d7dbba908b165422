"""The interface of every model form: what a model function is given and what it returns.

A model is a function ``(features, labels, mode, params) -> ModelSpec``: the built-in
models (tfps.models), a user's ``tf.compat.v1`` model_fn, and a tf_keras model
wrapped by tfps.keras_model all have this shape, so one training lifecycle serves all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass(frozen=True)
class ModelParams:
    feature_shape: tuple[int, ...]
    num_classes: int
    hidden_units: tuple[int, ...] = (64, 32)
    learning_rate: float = 0.01
    seed: int = 7
    #: (name, "string" or "float32") of each feature column of CSV/TFRecord data, in order
    columns: tuple[tuple[str, str], ...] = ()
    hash_buckets: int = 1 << 20     # rows of wide_deep's shared tables (--hash_buckets)
    embedding_dim: int = 16         # wide_deep's embedding width (--embedding_dim)
    #: --model_arg KEY=VALUE pairs: keyword arguments of a Keras builder; a model_fn reads them here
    model_args: dict = dataclasses.field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:   # params["num_classes"] works too
        return getattr(self, key)


@dataclasses.dataclass
class ModelSpec:
    loss: Any
    predictions: dict
    metrics: dict = dataclasses.field(default_factory=dict)
    #: Ops to run with every training step (a Keras model's BatchNormalization updates).
    update_ops: list = dataclasses.field(default_factory=list)
    #: Stateful metrics of an evaluation (a Keras model's AUC, Precision, Recall, ...): name ->
    #: (update op, result tensor, variables). Streamed over the whole evaluation set: the
    #: variables are initialised once, updated with every batch, read at the end.
    streaming: dict = dataclasses.field(default_factory=dict)


ModelFn = Callable[[Any, Any, str, ModelParams], ModelSpec]
