"""A tf_keras (Keras 2) model for tfps: a small compiled classifier.

Use it with::

    pip install --no-deps 'tf_keras==2.21.*'
    PYTHONPATH=. tfps local --model examples.keras_model:build_model --train_steps 300

``build_model`` takes no required arguments (it may take ``params``: the data's
``feature_shape`` and ``num_classes``, ``--hidden_units``, ``--learning_rate``) and returns
a tf_keras ``Model``, compiled or not. tfps calls it inside every graph it builds (train,
evaluation, export), so it must build the model from scratch each time and must not
load weights or train. The compiled optimizer and learning rate are used unless
``--optimizer`` / ``--learning_rate`` are given; the compiled loss and accuracy metrics are
used as they are. Keras 3 (``import keras``) cannot do parameter-server training: import
``tf_keras`` instead.
"""

from __future__ import annotations

import tf_keras as keras


def build_model(params=None):
    features = params.feature_shape if params is not None else (8,)
    classes = params.num_classes if params is not None else 3
    model = keras.Sequential([
        keras.Input(shape=features, name="features"),
        keras.layers.Dense(32, activation="relu", kernel_regularizer=keras.regularizers.l2(1e-4)),
        keras.layers.BatchNormalization(),
        keras.layers.Dropout(0.2),
        keras.layers.Dense(classes, activation="softmax"),
    ])
    model.compile(optimizer=keras.optimizers.Adam(learning_rate=0.005),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model
