"""A Criteo-shaped DLRM: generated data, the model as a tf_keras user writes it, and its
one-process and TF2 ParameterServerStrategy runs (bench/run.py's "dlrm" section).

    dlrm.py data OUT_DIR [--rows 300000]                 # train-NNNN.csv, eval.csv, data.json
    dlrm.py single --train_data 'OUT_DIR/train-*.csv' --eval_data OUT_DIR/eval.csv --steps 600
    dlrm.py pss --ps 1 --workers 2 --train_data ... --eval_data ... --steps 600
    tfps local --ps 1 --workers 2 --model bench.dlrm:build_model --model_arg table=dynamic \\
        --train_data 'OUT_DIR/train-*.csv' --eval_data OUT_DIR/eval.csv --batch_size 512 ...

**The data** has Criteo's shape: a ``label`` (click), 13 numeric columns ``I1``..``I13``
(counts with a long tail, as Criteo's integer features) and 26 categorical columns
``C1``..``C26`` of Criteo-style ids, 8 hex digits (``4e992287``). Each categorical column
has its own vocabulary (from a handful of values to ``MAX_VOCAB``, as Criteo's columns
range from 3 to millions) and Zipf-like frequencies (exponent ``ZIPF``). The click is
drawn from a logistic model (a per-id effect in every column, the dot product of latent
vectors for a few pairs of columns, a weight per log count) tuned to Criteo's click rate of
about 25 %, so that there is something to learn. Unlike Criteo, no cell is missing.

**The model** (``build_model``): DLRM (Naumov et al. 2019) at the size of DeepRec's modelzoo
bench: embedding dimension 16, a bottom MLP 512-256-16 on the log of the counts, the dot
interaction of the 27 vectors (the bottom MLP's output and the 26 embeddings: their 351
pairwise dot products, with the bottom output), a top MLP 512-256-1, Adagrad, batch 512.
``table=hashed``: each column hashed (``keras.layers.Hashing``) into its own range of one
shared ``Embedding`` of ``buckets`` rows (tfps splits it over the ps when it is larger than
``--partition_mb``); ``table=dynamic``: one ``tfps.layers.DynamicEmbedding`` with a row per
id (ids of different columns are different 32-bit hex values: they share a key with
probability about 2**-32 per pair).

``single`` and ``pss`` train the hashed model with ``model.fit`` as bench/ctr_tf2.py does
(its ``fit``: the rate over all epochs but the first, ``BENCH done`` and ``BENCH cpu``
lines), then print the AUC of the held-out rows: ``BENCH auc <auc>``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")   # tf.keras is tf_keras (Keras 3 has no PSS)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for _p in (ROOT, HERE):
    if _p not in sys.path:
        sys.path.insert(0, _p)

NUMERIC = [f"I{i}" for i in range(1, 14)]
CATEGORICAL = [f"C{i}" for i in range(1, 27)]
DIM = 16
BATCH = 512
#: Rows of the hashed side's one shared table (2**20 x 16 float32: 64 MiB, 128 MiB with Adagrad's slot).
BUCKETS = 2**20
LEARNING_RATE = 0.05
#: Criteo's columns range from 3 to millions of distinct values: here from 3 to this.
MAX_VOCAB = 200_000
ZIPF = 1.1
#: Each column's vocabulary at scale 1 (Criteo Kaggle's cardinalities, capped at MAX_VOCAB).
CRITEO_CARDINALITY = (1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27,
                      14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572)
FILES = 8


def vocab_sizes() -> list[int]:
    return [min(c, MAX_VOCAB) for c in CRITEO_CARDINALITY]


def generate(out_dir: str, rows: int = 300_000, eval_rows: int | None = None, seed: int = 0) -> dict:
    """Write ``rows`` training rows (FILES files ``train-NNNN.csv``) and ``eval_rows`` held-out
    rows (``eval.csv``, default a tenth) into ``out_dir``; returns (and writes as
    ``data.json``) what a bench plans with: rows, distinct ids seen, click rate, globs."""
    import numpy as np
    eval_rows = eval_rows if eval_rows is not None else max(2000, rows // 10)
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(seed)
    total = rows + eval_rows
    logit = np.full(total, -1.6)
    cols: dict[str, list[str]] = {}
    distinct_train = 0
    latent = {}
    for c, v in zip(CATEGORICAL, vocab_sizes()):
        p = 1.0 / np.arange(1, v + 1) ** ZIPF
        ids = np.minimum(np.searchsorted(np.cumsum(p / p.sum()), rng.random(total)), v - 1)
        # Column c's vocabulary: distinct random 32-bit values, Criteo's 8 hex digits.
        names = rng.choice(2**32, size=v, replace=False) if v < 2**20 else rng.integers(0, 2**32, v)
        names = [f"{x:08x}" for x in names.tolist()]
        names[0] = "f" + names[0][1:]      # the most frequent id is not a number: the column is text
        cols[c] = [names[i] for i in ids.tolist()]
        distinct_train += int(np.unique(ids[:rows]).size)
        logit += rng.normal(0, 0.5, v)[ids]                       # each id's own effect
        latent[c] = rng.normal(0, 1, (v, 4))[ids]
    for a, b in (("C1", "C2"), ("C4", "C10"), ("C12", "C24"), ("C6", "C14")):
        logit += 0.6 * np.einsum("ij,ij->i", latent[a], latent[b]) / 2
    for c in NUMERIC:
        counts = np.floor(np.exp(rng.normal(1.0, 1.5, total))).astype(np.int64)
        cols[c] = counts.astype(str).tolist()
        logit += rng.normal(0, 0.15) * (np.log1p(counts) - 1.2)
    label = (rng.random(total) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    header = ["label", *NUMERIC, *CATEGORICAL]
    columns = [label.astype(str).tolist()] + [cols[c] for c in header[1:]]
    bounds = np.linspace(0, rows, FILES + 1).astype(int).tolist() + [total]
    for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
        name = "eval.csv" if i == FILES else f"train-{i:04d}.csv"
        with open(os.path.join(out_dir, name), "w") as fh:
            fh.write(",".join(header) + "\n")
            fh.writelines(",".join(r) + "\n" for r in zip(*(col[lo:hi] for col in columns)))
    info = {"rows": rows, "eval_rows": eval_rows, "seed": seed, "numeric": len(NUMERIC),
            "categorical": len(CATEGORICAL), "vocab_sizes": vocab_sizes(), "distinct_ids_train": distinct_train,
            "click_rate": round(float(label[:rows].mean()), 4),
            "train_glob": os.path.join(out_dir, "train-*.csv"), "eval_csv": os.path.join(out_dir, "eval.csv")}
    with open(os.path.join(out_dir, "data.json"), "w") as fh:
        json.dump(info, fh, indent=1)
    return info


def build_model(params=None, table: str = "hashed", buckets: int = BUCKETS, capacity: int | None = None,
                learning_rate: float = LEARNING_RATE, dim: int = DIM):
    """DLRM as a tf_keras functional model (see the module's doc). ``table``: hashed or
    dynamic; ``capacity``: the dynamic table's rows (default: its own). Every argument can
    be set from tfps's command line: ``--model_arg table=dynamic``."""
    import numpy as np
    import tensorflow as tf
    import tf_keras as keras
    if table not in ("hashed", "dynamic"):
        raise ValueError(f"table={table!r}: use table=hashed or table=dynamic")
    num = {c: keras.Input(shape=(1,), name=c) for c in NUMERIC}
    cat = {c: keras.Input(shape=(1,), name=c, dtype="string") for c in CATEGORICAL}
    x = keras.layers.Concatenate(name="numeric")([num[c] for c in NUMERIC])
    x = keras.layers.Lambda(lambda t: tf.math.log1p(tf.maximum(t, 0.0)), name="log_counts")(x)
    for i, units in enumerate((512, 256, dim)):
        x = keras.layers.Dense(units, activation="relu", name=f"bottom_{i}")(x)
    if table == "hashed":
        per_column = buckets // len(CATEGORICAL)
        ids = [keras.layers.Hashing(per_column, name=f"hash_{c}")(cat[c]) for c in CATEGORICAL]
        # One table for every column: column i owns rows [i * per_column, (i + 1) * per_column).
        ids = keras.layers.Concatenate(name="ids")(
            [keras.layers.Lambda(lambda t, i=i: t + i * per_column, name=f"offset_{c}")(h)
             for i, (c, h) in enumerate(zip(CATEGORICAL, ids))])
        emb = keras.layers.Embedding(per_column * len(CATEGORICAL), dim, name="table")(ids)     # [batch, 26, dim]
    else:
        import tfps.layers
        ids = keras.layers.Concatenate(name="ids")([cat[c] for c in CATEGORICAL])              # [batch, 26] strings
        emb = tfps.layers.DynamicEmbedding(dim, capacity=capacity, name="table")(ids)          # [batch, 26, dim]
    n = len(CATEGORICAL) + 1
    rows, cols = np.tril_indices(n, -1)
    pairs = (rows * n + cols).tolist()                                                    # 351 of the 27 x 27

    def interact(t):
        dense, e = t
        z = tf.concat([dense[:, None, :], e], axis=1)                                     # [batch, 27, dim]
        dots = tf.reshape(tf.matmul(z, z, transpose_b=True), [-1, n * n])
        return tf.concat([dense, tf.gather(dots, pairs, axis=1)], axis=1)                 # [batch, dim + 351]
    y = keras.layers.Lambda(interact, name="interaction")([x, emb])
    for i, units in enumerate((512, 256)):
        y = keras.layers.Dense(units, activation="relu", name=f"top_{i}")(y)
    out = keras.layers.Dense(1, activation="sigmoid", name="click")(y)
    model = keras.Model(inputs=[*(num[c] for c in NUMERIC), *(cat[c] for c in CATEGORICAL)], outputs=out)
    model.compile(optimizer=keras.optimizers.Adagrad(learning_rate), loss="binary_crossentropy",
                  metrics=[keras.metrics.AUC(name="auc")])
    return model


# ------------------------------------------------------------- one process and TF2 PSS
def eval_auc(model, eval_csv: str, batch: int = 4096) -> float:
    """The AUC of ``model``'s outputs on the held-out rows (Keras's AUC, as tfps reports it),
    computed on this process from the model's predictions."""
    import tf_keras as keras

    from tfps.data import dataset as data
    schema = data.infer_schema(eval_csv)
    metric = keras.metrics.AUC()
    for features, labels in data.make_dataset(schema, "label", batch, train=False):
        metric.update_state(labels, model(features, training=False))
    return float(metric.result().numpy())


def recompile(model, steps_per_execution: int) -> None:
    """The model's own compile() (Adagrad, the running AUC as tfps computes it too), with
    several steps per call as bench/ctr_tf2.py runs model.fit."""
    import tf_keras as keras
    model.compile(optimizer=model.optimizer, loss=model.loss, metrics=[keras.metrics.AUC(name="auc")],
                  steps_per_execution=steps_per_execution)


def _fit_args(a):
    """The attributes bench/ctr_tf2.py's ``fit`` and ``dataset_fn`` read."""
    return argparse.Namespace(steps=a.steps, epochs=a.epochs, steps_per_execution=a.steps_per_execution,
                              batch_size=BATCH, train_data=a.train_data)


def run_single(a) -> int:
    import tensorflow as tf
    from ctr_tf2 import dataset_fn, fit
    tf.config.threading.set_intra_op_parallelism_threads(a.threads)
    tf.config.threading.set_inter_op_parallelism_threads(a.threads)
    f = _fit_args(a)
    model = build_model(buckets=a.buckets)
    recompile(model, a.steps_per_execution)
    fit(f, model, dataset_fn(f)())
    print(f"BENCH auc {eval_auc(model, a.eval_data):.5f}", flush=True)
    return 0


def run_pss(a) -> int:
    """bench/ctr_tf2.py's ``pss`` with this model: ps and worker servers as subprocesses,
    this process the coordinator, a MinSizePartitioner, ``model.fit`` with a DatasetCreator."""
    import tf_keras as keras
    from ctr_tf2 import dataset_fn, fit, ps_rss_line, pss_cluster
    with pss_cluster(a.ps, a.workers, a.partition_mb) as (strategy, servers):
        f = _fit_args(a)
        with strategy.scope():
            model = build_model(buckets=a.buckets)
            recompile(model, a.steps_per_execution)
        fit(f, model, keras.utils.experimental.DatasetCreator(dataset_fn(f)), servers)
        print(ps_rss_line(servers), flush=True)
        print(f"BENCH auc {eval_auc(model, a.eval_data):.5f}", flush=True)
    sys.stdout.flush()
    os._exit(0)     # the coordinator's own threads may hold the interpreter's exit


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("data", "single", "pss"))
    ap.add_argument("out_dir", nargs="?", help="data: where the files go")
    ap.add_argument("--rows", type=int, default=300_000, help="data: training rows")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--train_data")
    ap.add_argument("--eval_data")
    ap.add_argument("--buckets", type=int, default=BUCKETS)
    ap.add_argument("--steps", type=int, default=600, help="training steps, over every worker")
    ap.add_argument("--epochs", type=int, default=4, help="the first is not counted")
    ap.add_argument("--steps_per_execution", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2, help="single: TensorFlow's intra/inter-op threads")
    ap.add_argument("--ps", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--partition_mb", type=int, default=64)
    a = ap.parse_args()
    if a.mode == "data":
        if not a.out_dir:
            ap.error("data needs OUT_DIR")
        print(json.dumps(generate(a.out_dir, a.rows, seed=a.seed), indent=1))
        return 0
    if not (a.train_data and a.eval_data):
        ap.error(f"{a.mode} needs --train_data and --eval_data")
    t0 = time.time()
    rc = run_single(a) if a.mode == "single" else run_pss(a)
    print(f"BENCH wall {time.time() - t0:.1f}", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
