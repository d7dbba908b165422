"""A click-through-rate model for tfps: string ids hashed into one shared embedding table.

    tfps demo-data data/                      # data/ctr/train-*.csv: user,ad,site,price,label
    tfps local --ps 2 --workers 2 --model examples.ctr_model:build_model \
        --train_data 'data/ctr/train-*.csv' --eval_data data/ctr/eval.csv --train_steps 3000

Each text column is one ``keras.Input(dtype="string")`` named after it; the numeric column
is a float input. The ids are hashed into ``BUCKETS`` rows of one shared ``Embedding``
(each column into its own range of rows), which tfps splits row-wise over the ps tasks
when it is larger than ``--partition_mb``; a step moves only the rows its batch touched.
The SavedModel's ``serving_default`` takes the raw columns by name: strings and a float.

A 512 MiB table (2**23 x 16), split over two ps, with Adagrad (sparse updates in Keras's
``model.fit`` too):

    tfps local --ps 2 --workers 2 --model examples.ctr_model:build_model \
        --model_arg buckets=8388608 --model_arg optimizer=adagrad --model_arg learning_rate=0.5 ...
"""

import tensorflow as tf
import tf_keras as keras

#: Rows of the shared table: 2**20 x 16 float32 is 64 MiB (with Adam's slots, 192 MiB).
BUCKETS = 2**20
DIM = 16
TEXT = ("user", "ad", "site")


def build_model(params, buckets: int = BUCKETS, dim: int = DIM, optimizer: str = "adam",
                learning_rate: float = 0.01):
    """Every argument can be set from the command line: ``--model_arg buckets=8388608``."""
    inputs = {name: keras.Input(shape=(1,), name=name, dtype="string") for name in TEXT}
    inputs["price"] = keras.Input(shape=(1,), name="price")
    per_column = buckets // len(TEXT)
    ids = [keras.layers.Hashing(per_column, name=f"hash_{n}")(inputs[n]) for n in TEXT]
    # One table for every column: column i owns rows [i * per_column, (i + 1) * per_column).
    ids = keras.layers.Concatenate(name="ids")(
        [keras.layers.Lambda(lambda t, i=i: t + i * per_column)(x) for i, x in enumerate(ids)])
    table = keras.layers.Embedding(buckets, dim, name="table")(ids)          # [batch, 3, dim]
    # The user-ad affinity: the dot product of their two embeddings.
    cross = keras.layers.Lambda(lambda t: tf.reduce_sum(t[:, 0] * t[:, 1], axis=-1, keepdims=True),
                                name="user_ad")(table)
    deep = keras.layers.Dense(32, activation="relu")(
        keras.layers.Concatenate()([keras.layers.Flatten()(table), inputs["price"]]))
    # The standard binary head: one sigmoid unit, binary cross-entropy. The SavedModel's
    # serving_default returns "probability", the chance of a click.
    out = keras.layers.Dense(1, activation="sigmoid")(keras.layers.Concatenate()([deep, cross]))
    model = keras.Model(inputs=[inputs[n] for n in (*TEXT, "price")], outputs=out)
    model.compile(optimizer=keras.optimizers.get({"class_name": optimizer, "config": {"learning_rate": learning_rate}}),
                  loss="binary_crossentropy", metrics=["accuracy"])
    return model
