"""A user model for tfps: a two-layer MLP with dropout while training.

Use it with::

    PYTHONPATH=. tfps local --model examples.custom_model:model_fn --train_steps 300

The module only has to be importable by every task (same PYTHONPATH on every host, or
installed in the tfps image). tfps calls ``model_fn`` three times per job, each time in
a new graph:

* ``mode == "train"`` on every worker, with ``labels``; variables are placed on the ps
  tasks by tfps (``replica_device_setter``), the model does not care where they live;
* ``mode == "eval"`` on the chief at the end, with the evaluation data;
* ``mode == "predict"`` on the chief for the SavedModel, with ``labels=None``; the returned
  ``predictions`` become the outputs of the ``serving_default`` signature.

The export restores the variables of the training checkpoint by name, so they must be
created with ``tf.compat.v1.get_variable`` under the same names in every mode. Ops that
only matter for training (here dropout) depend on ``mode``; variables never do.
"""

from __future__ import annotations

import tensorflow as tf

from tfps.models import ModelParams, ModelSpec

v1 = tf.compat.v1

#: Fraction of hidden units dropped at each training step. Eval and predict keep all.
DROPOUT_RATE = 0.2


def _dense(x, units: int, name: str, seed: int):
    """``x @ kernel + bias`` with variables named ``name/kernel`` and ``name/bias``."""
    with v1.variable_scope(name):
        kernel = v1.get_variable("kernel", [int(x.shape[-1]), units],
                                 initializer=v1.glorot_uniform_initializer(seed=seed))
        bias = v1.get_variable("bias", [units], initializer=v1.zeros_initializer())
    return tf.matmul(x, kernel) + bias


def model_fn(features, labels, mode: str, params: ModelParams) -> ModelSpec:
    """Two ReLU layers (``--hidden_units``, first two sizes), softmax output.

    ``features`` is float32 ``[batch, *params.feature_shape]``; ``labels`` int64 ``[batch]``
    or ``None`` in predict mode. Classification only: ``params.num_classes >= 2``.
    """
    if not params.num_classes:
        raise ValueError("examples.custom_model classifies; give data with class labels (num_classes >= 2)")
    width = 1
    for d in features.shape[1:]:
        width *= int(d)
    x = tf.reshape(features, [-1, width])
    sizes = (tuple(params.hidden_units) + (64, 32))[:2]
    for i, units in enumerate(sizes):
        x = tf.nn.relu(_dense(x, units, f"layer{i}", params.seed + i))
        if mode == "train":
            # Dropout only while training: the SavedModel must give deterministic answers.
            x = tf.nn.dropout(x, rate=DROPOUT_RATE, seed=params.seed + 10 + i)
    logits = _dense(x, params.num_classes, "logits", params.seed + 99)

    probabilities = tf.nn.softmax(logits, name="probabilities")
    classes = tf.argmax(logits, axis=-1, name="classes")
    predictions = {"probabilities": probabilities, "classes": classes}
    if labels is None:                       # predict mode: the serving graph
        return ModelSpec(loss=None, predictions=predictions)

    labels = tf.cast(labels, tf.int64)
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
    accuracy = tf.reduce_mean(tf.cast(tf.equal(classes, labels), tf.float32))
    return ModelSpec(loss=loss, predictions=predictions, metrics={"accuracy": accuracy})
