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
"""

from __future__ import annotations

import importlib
import inspect

from tfps import keras_model
from tfps.errors import ConfigError
from tfps.modelspec import ModelFn, ModelParams, ModelSpec  # noqa: F401 - the interface, imported from here by users




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


BUILTIN: dict[str, ModelFn] = {"linear": linear, "mlp": mlp, "cnn": cnn}


def check_shape(name: str, feature_shape: tuple[int, ...]) -> None:
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
        module = importlib.import_module(module_name)
    except Exception as e:  # ImportError, or any error raised while importing user code
        hint = (" tf_keras is not installed: pip install --no-deps 'tf_keras==2.21.*'"
                if isinstance(e, ImportError) and getattr(e, "name", "") == "tf_keras" else "")
        raise ConfigError(f"cannot import {module_name!r}: {type(e).__name__}: {e}.{hint} Check PYTHONPATH "
                          "(the module must be importable by every task)", "model") from None
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
    return fn
