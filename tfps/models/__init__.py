"""Models built from ``tf.compat.v1`` ops, and the interface for a user's own model.

Keras 3 has no parameter-server training and ``tf.compat.v1.layers`` needs the separate
``tf_keras`` package, so models here create their variables with ``get_variable`` and
use plain ops. A user's model plugs in as ``--model package.module:function``::

    def model_fn(features, labels, mode, params) -> tfps.models.ModelSpec

* ``features``: float32 tensor ``[batch, *params.feature_shape]``.
* ``labels``: int64 ``[batch]`` (classification) or float32 ``[batch]`` (regression);
  ``None`` when ``mode == "predict"`` (the serving graph).
* ``mode``: ``"train"``, ``"eval"`` or ``"predict"``.
* ``params``: ``ModelParams`` (feature_shape, num_classes (0 = regression),
  hidden_units, learning_rate, ...).
* Returns ``ModelSpec(loss, predictions, metrics)``: ``loss`` a scalar (``None`` in
  predict mode), ``predictions`` a dict of tensors with a leading batch dimension (these
  are the SavedModel's ``serving_default`` outputs; the input is named ``features``),
  ``metrics`` a dict of scalar tensors computed on the batch (logged, averaged in eval).

Variables must be created with ``tf.compat.v1.get_variable`` (or ``tf.Variable``) under
the same names in every mode: the export graph restores them from the checkpoint.
See ``examples/custom_model.py``.

The package holds the models' other parts:

    modelspec.py         ModelSpec, ModelParams: the interface a model_fn returns and gets
    keras_model.py       a user's tf_keras model as a model_fn (--model pkg.module:build_model)
    keras_optimizers.py  a compiled tf_keras optimizer mapped to tfps's tf.compat.v1 one
    demo.py              the demo datasets (generated, deterministic)
"""

from __future__ import annotations

import functools
import importlib
import inspect

from tfps.errors import ConfigError, UserCodeExit, user_code
from tfps.models import keras_model
from tfps.models.modelspec import ModelFn, ModelParams, ModelSpec, local_state  # noqa: F401 - the interface, imported from here by users


def _dense(x, units: int, name: str, seed: int, activation=None):
    import tensorflow as tf
    v1 = tf.compat.v1
    with v1.variable_scope(name):
        w = v1.get_variable("kernel", [int(x.shape[-1]), units],
                            initializer=v1.glorot_uniform_initializer(seed=seed))
        b = v1.get_variable("bias", [units], initializer=v1.zeros_initializer())
        y = tf.matmul(x, w) + b
    return activation(y) if activation else y


def _head(logits_or_value, labels, mode: str, params: ModelParams) -> ModelSpec:
    """Loss, predictions and metrics for classification or regression."""
    import tensorflow as tf
    if params.num_classes:
        probs = tf.nn.softmax(logits_or_value, name="probabilities")
        classes = tf.argmax(logits_or_value, axis=-1, name="classes")
        preds = {"probabilities": probs, "classes": classes}
        if labels is None:
            return ModelSpec(None, preds)
        labels = tf.cast(labels, tf.int64)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=logits_or_value), name="loss")
        acc = tf.reduce_mean(tf.cast(tf.equal(classes, labels), tf.float32), name="accuracy")
        return ModelSpec(loss, preds, {"accuracy": acc})
    value = tf.squeeze(logits_or_value, axis=-1, name="predictions")
    preds = {"predictions": value}
    if labels is None:
        return ModelSpec(None, preds)
    err = value - tf.cast(labels, tf.float32)
    loss = tf.reduce_mean(tf.square(err), name="loss")
    return ModelSpec(loss, preds, {"mae": tf.reduce_mean(tf.abs(err))})


def _flat(features):
    import tensorflow as tf
    n = 1
    for d in features.shape[1:]:
        n *= int(d)
    return tf.reshape(features, [-1, n])


def linear(features, labels, mode, params: ModelParams) -> ModelSpec:
    """Linear regression, or multinomial logistic regression when there are classes."""
    out = _dense(_flat(features), params.num_classes or 1, "linear", params.seed)
    return _head(out, labels, mode, params)


def mlp(features, labels, mode, params: ModelParams) -> ModelSpec:
    """Fully connected ReLU layers (``--hidden_units``), softmax or linear output."""
    import tensorflow as tf
    x = _flat(features)
    for i, units in enumerate(params.hidden_units):
        x = _dense(x, units, f"hidden{i}", params.seed + i, tf.nn.relu)
    out = _dense(x, params.num_classes or 1, "output", params.seed + 99)
    return _head(out, labels, mode, params)


def cnn(features, labels, mode, params: ModelParams) -> ModelSpec:
    """Two 3x3 conv + 2x2 max-pool blocks, one dense layer: for small images [H, W, C]."""
    import tensorflow as tf
    v1 = tf.compat.v1
    x = features
    if len(params.feature_shape) == 2:
        x = tf.expand_dims(x, -1)
    for i, filters in enumerate((16, 32)):
        with v1.variable_scope(f"conv{i}"):
            w = v1.get_variable("kernel", [3, 3, int(x.shape[-1]), filters],
                                initializer=v1.glorot_uniform_initializer(seed=params.seed + i))
            b = v1.get_variable("bias", [filters], initializer=v1.zeros_initializer())
            x = tf.nn.relu(tf.nn.conv2d(x, w, strides=1, padding="SAME") + b)
            x = tf.nn.max_pool2d(x, ksize=2, strides=2, padding="SAME")
    x = _dense(_flat(x), params.hidden_units[0] if params.hidden_units else 64, "dense", params.seed + 5, tf.nn.relu)
    out = _dense(x, params.num_classes or 1, "output", params.seed + 99)
    return _head(out, labels, mode, params)


def _columns(features, params: ModelParams) -> dict:
    """Each feature column as a 1-D tensor, by name (a matrix of numbers is split by index)."""
    import tensorflow as tf
    if isinstance(features, dict):
        return {n: tf.reshape(features[n], [-1]) for n, _ in params.columns}
    return {n: features[:, i] for i, (n, _) in enumerate(params.columns)}


def wide_deep(features, labels, mode, params: ModelParams) -> ModelSpec:
    """Wide & deep for tabular data with id columns: the CTR model for a CSV and no model.

    Every text or integer (TFRecord int64) column is hashed (with its column name, so equal
    values of two columns differ) into ``--hash_buckets`` rows of two shared tables: an
    embedding of ``--embedding_dim``
    (the deep part: an MLP of ``--hidden_units`` over the embeddings and the numeric columns)
    and one weight per class (the wide part: a linear model of the ids, plus the numeric
    columns). Tables above ``--partition_mb`` are split over every ps; a step touches only
    its ids' rows. Two classes get one logit and a sigmoid (``probability`` of class 1).
    """
    import tensorflow as tf
    v1 = tf.compat.v1
    cols = _columns(features, params)
    text = [n for n, kind in params.columns if kind in ("string", "int64")]   # ids: hashed
    numeric = [n for n, kind in params.columns if kind not in ("string", "int64")]
    binary = params.num_classes == 2
    units = 1 if binary or not params.num_classes else params.num_classes
    parts = []
    dynamic = getattr(params, "embedding", "hashed") == "dynamic"
    if text and dynamic:
        deep_in, wide_part = _dynamic_ids(cols, text, units, params, training=mode == "train")
        parts.append(wide_part)
    elif text:
        ids_of = {n: cols[n] if cols[n].dtype == tf.string else tf.strings.as_string(tf.cast(cols[n], tf.int64))
                  for n in text}
        keyed = tf.stack([tf.strings.join([f"{n}=", ids_of[n]]) for n in text], axis=1)    # [batch, columns]
        ids = tf.strings.to_hash_bucket_fast(keyed, params.hash_buckets)
        table = v1.get_variable("embeddings", [params.hash_buckets, params.embedding_dim],
                                initializer=v1.random_normal_initializer(0.0, 0.05, seed=params.seed))
        wide = v1.get_variable("wide_weights", [params.hash_buckets, units], initializer=v1.zeros_initializer())
        deep_in = tf.reshape(tf.nn.embedding_lookup(table, ids), [-1, len(text) * params.embedding_dim])
        parts.append(tf.reduce_sum(tf.nn.embedding_lookup(wide, ids), axis=1))
    else:
        deep_in = None
    if numeric:
        nums = tf.stack([tf.cast(cols[n], tf.float32) for n in numeric], axis=1)
        parts.append(_dense(nums, units, "wide_numeric", params.seed + 50))
        deep_in = nums if deep_in is None else tf.concat([deep_in, nums], axis=1)
    x = deep_in
    for i, h in enumerate(params.hidden_units):
        x = _dense(x, h, f"deep{i}", params.seed + i, tf.nn.relu)
    logits = tf.add_n(parts + [_dense(x, units, "deep_output", params.seed + 99)])
    if binary:
        return _binary_head(tf.reshape(logits, [-1]), labels, mode)
    return _head(logits, labels, mode, params)


def _dynamic_ids(cols: dict, text: list, units: int, params: ModelParams, training: bool) -> tuple:
    """``--embedding dynamic``: each id of each column its own row (``tfps.layers.DynamicTable``),
    the embedding and the wide weights side by side in one row of ``embedding_dim + units``.

    String ids are keyed ``column=value`` (as the hashed table); when every id column is
    int64, an id is keyed by itself XOR a 64-bit constant of its column's name (distinct ids
    of one column stay distinct). Returns (deep input, wide logits)."""
    import hashlib

    import tensorflow as tf

    from tfps.layers.dynamic_embedding import DynamicTable  # lazy: imports TensorFlow
    v1 = tf.compat.v1
    dim = params.embedding_dim
    if all(cols[n].dtype.is_integer for n in text):
        def salt(n):
            return int.from_bytes(hashlib.blake2b(n.encode(), digest_size=8).digest(), "little", signed=True)
        keys = tf.stack([tf.bitwise.bitwise_xor(tf.cast(cols[n], tf.int64), tf.constant(salt(n), tf.int64))
                         for n in text], axis=1)
    else:
        keys = tf.stack([tf.strings.join([f"{n}=", cols[n] if cols[n].dtype == tf.string
                                          else tf.strings.as_string(tf.cast(cols[n], tf.int64))]) for n in text],
                        axis=1)
    table = DynamicTable(dim + units, min_count=getattr(params, "min_count", 1) or 1,
                         steps_to_live=getattr(params, "steps_to_live", None) or None,
                         capacity=getattr(params, "expected_ids", None) or None,
                         initializer=v1.random_normal_initializer(0.0, 0.05, seed=params.seed), name="embeddings",
                         serving=not training)   # eval and predict: the checkpoint's live rows
    rows = table.lookup(keys, training=training)                         # [batch, columns, dim + units]
    deep_in = tf.reshape(rows[:, :, :dim], [-1, len(text) * dim])
    return deep_in, tf.reduce_sum(rows[:, :, dim:], axis=1)


def _binary_head(logit, labels, mode: str) -> ModelSpec:
    """One logit: the probability of class 1, and the sigmoid cross-entropy.

    In train mode also ``auc``, running over the worker's batches for its progress lines
    (``_running_auc``). The evaluation ranks the whole set exactly instead."""
    import tensorflow as tf
    p = tf.sigmoid(logit, name="probability")
    preds = {"probability": p, "probabilities": tf.stack([1.0 - p, p], axis=1, name="probabilities"),
             "classes": tf.cast(logit > 0, tf.int64, name="classes")}
    if labels is None:
        return ModelSpec(None, preds)
    y = tf.cast(labels, tf.float32)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=logit), name="loss")
    acc = tf.reduce_mean(tf.cast(tf.equal(preds["classes"], tf.cast(labels, tf.int64)), tf.float32))
    streaming = {"auc": _running_auc(labels, p)} if mode == "train" else {}
    return ModelSpec(loss, preds, {"accuracy": acc}, streaming=streaming)


def _running_auc(labels, p, buckets: int = 200) -> tuple:
    """(update, result, variables) of a running AUC in the worker's own variables (``local_state``).

    Two histograms of the scores over ``buckets`` equal buckets of [0, 1], of the positive and
    the negative examples; the result is the Mann-Whitney statistic of the bucketed scores
    (ties within a bucket count half), the area under the ROC curve through the buckets'
    edges (Keras's AUC with as many thresholds). One pass over the batch, where
    ``tf.compat.v1.metrics.auc`` compares every example with every threshold (several times
    the cost of a small step). The result reads the histograms after the update.
    """
    import tensorflow as tf
    v1 = tf.compat.v1
    with local_state() as state:
        pos = v1.Variable(lambda: tf.zeros([buckets]), trainable=False, name="running_auc/positives")
        neg = v1.Variable(lambda: tf.zeros([buckets]), trainable=False, name="running_auc/negatives")
        bucket = tf.clip_by_value(tf.cast(tf.floor(p * buckets), tf.int32), 0, buckets - 1)
        y = tf.cast(labels, tf.float32)
        update = tf.group(pos.assign_add(tf.math.unsorted_segment_sum(y, bucket, buckets)),
                          neg.assign_add(tf.math.unsorted_segment_sum(1.0 - y, bucket, buckets)))
        with tf.control_dependencies([update]):
            positives, negatives = pos.read_value(), neg.read_value()
        below = tf.cumsum(negatives, exclusive=True)   # negatives in lower buckets than each bucket
        pairs = tf.reduce_sum(positives) * tf.reduce_sum(negatives)
        auc = tf.math.divide_no_nan(tf.reduce_sum(positives * (below + 0.5 * negatives)), pairs)
    return update, auc, list(state)


class NamedColumns:
    """A built-in model that takes the data's columns by name: its SavedModel serves each
    column as its own input, in its own dtype (strings for text columns)."""

    def __init__(self, fn: ModelFn, columns: tuple[tuple[str, str], ...]):
        self.fn, self.columns, self.__name__ = fn, columns, fn.__name__

    @property
    def serving_inputs(self) -> dict[str, tuple[list, str]]:
        return {n: ([], kind) for n, kind in self.columns}

    def __call__(self, features, labels, mode, params):
        return self.fn(features, labels, mode, params)


BUILTIN: dict[str, ModelFn] = {"linear": linear, "mlp": mlp, "cnn": cnn, "wide_deep": wide_deep}


def may_use_keras(name: str) -> bool:
    """Whether the model ``--model name`` may build tf_keras layers: any but a built-in one.

    The built-in models are plain ops and ``get_variable``; their jobs never import tf_keras
    (about 0.3-0.7 s of every launch here). A user's model may use it, even a model_fn
    (``tf.compat.v1.layers`` is tf_keras), so theirs get it imported and patched
    (``tfps.task.graph.partition.partitioned``)."""
    return name not in BUILTIN


#: Built-in models that read named columns, text included (the others take a matrix of numbers).
NAMED_COLUMNS = ("wide_deep",)


def check_shape(name: str, feature_shape: tuple[int, ...], columns: tuple = ()) -> None:
    if name in NAMED_COLUMNS and not columns:
        raise ConfigError(f"the {name} model reads named columns (CSV, or TFRecord with one value per key); "
                          "this data has none. Use mlp, or CSV data", "model")
    if name == "cnn" and len(feature_shape) not in (2, 3):
        raise ConfigError(f"the cnn model needs image data ([height, width] or [height, width, channels]); "
                          f"this data has flat features of shape {list(feature_shape)}. Use mlp or image data",
                          "model")


def resolve(name: str) -> ModelFn:
    """Return the model function named by ``--model``; ConfigError says what to fix.

    A function without required arguments (or taking only ``params``) is a Keras model
    builder: it comes back as a ``keras_model.KerasBuilder``, which ``keras_model.bind``
    turns into a model_fn once the data is known.
    """
    if name in BUILTIN:
        return BUILTIN[name]
    if ":" not in name:
        raise ConfigError(f"unknown model {name!r}; use one of {', '.join(BUILTIN)} or package.module:function",
                          "model")
    module_name, _, attr = name.partition(":")
    try:
        with user_code(f"importing {module_name}"):
            module = importlib.import_module(module_name)
    except UserCodeExit:
        raise
    except Exception as e:  # ImportError, or any error raised while importing user code
        if keras_model.missing_tf_keras(e):
            raise ConfigError(f"{module_name} imports Keras, and tf_keras (Keras 2, what tf.keras is under tfps) "
                              f"is not installed here; install it: {keras_model.tf_keras_install()}",
                              "model") from None
        raise ConfigError(f"cannot import {module_name!r}: {type(e).__name__}: {e}. Check PYTHONPATH "
                          "(the module must be importable by every task; tfps also looks in the working directory)",
                          "model") from None
    fn = getattr(module, attr, None)
    if fn is None or not callable(fn):
        raise ConfigError(f"{module_name} has no function {attr!r}", "model")
    if keras_model.is_builder(fn):
        return keras_model.KerasBuilder(fn, name)
    try:
        inspect.signature(fn).bind("features", "labels", "mode", "params")
    except TypeError:
        raise ConfigError(f"{name} must accept (features, labels, mode, params) (a model_fn), or take no "
                          f"required arguments and return a tf_keras Model; its signature is "
                          f"{inspect.signature(fn)}", "model") from None
    return _guarded(fn, name)


def _guarded(fn: ModelFn, name: str) -> ModelFn:
    """A user's model_fn that cannot end the process (``errors.user_code``), and whose result
    is a ModelSpec: anything else (``None``, a bare loss tensor) is refused in one line, in the
    launcher's pre-check (which builds the training graph) rather than as an AttributeError
    in every task."""
    @functools.wraps(fn)
    def model_fn(features, labels, mode, params):
        with user_code(f"the model function {name}"):
            spec = fn(features, labels, mode, params)
        if not (hasattr(spec, "loss") and hasattr(spec, "predictions")):
            got = "None (no return statement?)" if spec is None else f"a {type(spec).__name__}"
            raise ConfigError(f"{name} returned {got} in {mode} mode; a model_fn must return "
                              "tfps.models.ModelSpec(loss, predictions, metrics)", "model")
        return spec
    return model_fn
