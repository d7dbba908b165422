"""The ceiling: the same model and input pipeline trained in one process, no cluster.

Prints ``BENCH done <steps> <first step unix time> <end unix time>``.
"""

from __future__ import annotations

import argparse
import sys
import time

import tensorflow as tf

from tfps import models
from tfps.data import dataset as data
from tfps.models import demo

v1 = tf.compat.v1


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--train_steps", type=int, default=1000)
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--model", default="mlp")
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    schema = data.infer_schema(demo.demo_globs(a.model)[0])
    params = models.ModelParams(schema.feature_shape, schema.num_classes)
    g = tf.Graph()
    with g.as_default():
        ds = data.make_dataset(schema, "label", a.batch_size)
        x, y = v1.data.make_one_shot_iterator(ds).get_next()
        spec = models.BUILTIN[a.model](x, y, "train", params)
        train_op = v1.train.AdamOptimizer(0.01).minimize(spec.loss)
        init = v1.global_variables_initializer()
    cfg = v1.ConfigProto(intra_op_parallelism_threads=a.threads, inter_op_parallelism_threads=a.threads)
    with v1.Session(graph=g, config=cfg) as s:
        s.run(init)
        s.run(train_op)
        first = time.time()
        for _ in range(a.train_steps - 1):
            s.run(train_op)
    print(f"BENCH done {a.train_steps - 1} {first:.3f} {time.time():.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
