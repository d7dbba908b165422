"""The interface of every model form: what a model function is given and what it returns.

A model is a function ``(features, labels, mode, params) -> ModelSpec``: the built-in
models (tfps.models), a user's ``tf.compat.v1`` model_fn, and a tf_keras model
wrapped by tfps.models.keras_model all have this shape, so one training lifecycle serves all.

A model's own per-worker state (the running metrics of its progress lines) is created
inside ``local_state()``: on the worker that builds the step, never on a ps, in a
checkpoint or in the SavedModel.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Callable
from typing import Any

from tfps.errors import ConfigError


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
    #: "hashed" (hash_buckets shared rows) or "dynamic" (tfps.layers.DynamicEmbedding: a row
    #: per admitted id) (--embedding), and the dynamic tables' options:
    embedding: str = "hashed"
    min_count: int = 1              # times an id is seen before it gets its own row (--min_count)
    steps_to_live: int = 0          # free rows of ids unseen for N global steps; 0 never (--steps_to_live)
    expected_ids: int = 0           # live ids expected per table; 0 unknown (--expected_ids)

    def __getitem__(self, key: str) -> Any:   # params["num_classes"] works too
        return getattr(self, key)


@dataclasses.dataclass
class ModelSpec:
    loss: Any
    predictions: dict
    metrics: dict = dataclasses.field(default_factory=dict)
    #: Ops to run with every training step (a Keras model's BatchNormalization updates).
    update_ops: list = dataclasses.field(default_factory=list)
    #: Stateful metrics (a Keras model's AUC, Precision, Recall, ...): name -> (update op,
    #: result tensor, variables).
    #: In eval mode they are streamed over the whole evaluation set: the variables are
    #: initialised once, updated with every batch, read at the end.
    #: In train mode they are the running values of the progress lines: the worker runs the
    #: update with every training step and fetches the result with it, so the result must read
    #: the variables after the update (build it under ``tf.control_dependencies([update])``),
    #: and the variables must be created inside ``local_state()`` (the worker refuses others).
    streaming: dict = dataclasses.field(default_factory=dict)


#: The device of the worker whose training step is being built (``on_worker``), if any.
_WORKER_DEVICE: contextvars.ContextVar[str | None] = contextvars.ContextVar("tfps_worker_device", default=None)


@contextlib.contextmanager
def on_worker(device: str):
    """While a worker builds its training step: ``local_state`` creates variables on ``device``."""
    token = _WORKER_DEVICE.set(device)
    try:
        yield
    finally:
        _WORKER_DEVICE.reset(token)


@contextlib.contextmanager
def local_state():
    """Create a model's per-worker state inside this (the running metrics of a training step).

    Variables created here are the building worker's own: placed on its device (not where
    ``replica_device_setter`` would put a variable, a ps), in ``LOCAL_VARIABLES`` only (each
    worker's session initialises its own; the Saver, which saves ``GLOBAL_VARIABLES``, never
    sees them, so neither the checkpoint nor the SavedModel holds them), and not trainable.
    Outside a worker's step (evaluation, a test's graph) only the collections change.
    Yields the list of the variables created inside (filled as they are).
    """
    import tensorflow as tf
    v1 = tf.compat.v1
    created: list = []

    def local(next_creator, **kwargs):
        kwargs["trainable"] = False
        if "collections" in kwargs:   # tf.compat.v1 variables (Keras's, get_variable, v1.Variable)
            kwargs["collections"] = [v1.GraphKeys.LOCAL_VARIABLES]
        v = next_creator(**kwargs)
        graph = getattr(v, "graph", None)
        if graph is not None:   # a TF2 tf.Variable takes no collections: moved to the local ones here
            shared = graph.get_collection_ref(v1.GraphKeys.GLOBAL_VARIABLES)
            if any(x is v for x in shared):
                shared[:] = [x for x in shared if x is not v]
                graph.add_to_collection(v1.GraphKeys.LOCAL_VARIABLES, v)
        created.append(v)
        return v

    device = _WORKER_DEVICE.get()
    with v1.variable_creator_scope(local), (v1.device(device) if device else contextlib.nullcontext()):
        yield created


def running_metrics(spec, graph, task_index: int, model: str) -> dict:
    """name -> (update, result) of the model's running metrics (``ModelSpec.streaming`` in train
    mode), each checked to keep its state on this worker: never on a ps, where every worker
    would update one copy, nor among the global variables, which the checkpoint saves."""
    import tensorflow as tf
    v1 = tf.compat.v1
    local = {id(v) for v in graph.get_collection(v1.GraphKeys.LOCAL_VARIABLES)}
    shared = {id(v) for v in graph.get_collection(v1.GraphKeys.GLOBAL_VARIABLES)}
    out = {}
    for name, (update, result, variables) in spec.streaming.items():
        for v in variables:
            where = tf.DeviceSpec.from_string(v.device or "")
            if id(v) not in local or id(v) in shared or (where.job, where.task) != ("worker", task_index):
                raise ConfigError(f"{model} returned the running metric {name!r} with the variable {v.name} on "
                                  f"{v.device or 'no device'}{'' if id(v) in local else ', not a local variable'}; "
                                  "create a metric's variables inside tfps.models.modelspec.local_state() (this "
                                  "worker's own, never on a ps or in the checkpoint)", "model")
        out[name] = (update, result)
    return out


ModelFn = Callable[[Any, Any, str, ModelParams], ModelSpec]
