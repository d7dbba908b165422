"""Restoring a dynamic table's checkpoint that lacks what the table now saves.

A table saves its admission counts (``sketch``) only with ``min_count`` > 1; a job continued
with a larger ``min_count`` restores them from a checkpoint that has none (see
:func:`saver_builder`)."""

from __future__ import annotations

import tensorflow as tf

from tfps import compat
from tfps.layers.dynamic_embedding import SKETCH_DEPTH, SKETCH_WIDTH, saver_var_list, tables

v1 = tf.compat.v1


def saver_builder(checkpoint: str | None, graph=None):
    """A builder for the job's Saver (``Saver(builder=...)``) that restores as zeros the
    admission counts (``sketch``) that ``checkpoint`` lacks; None when it lacks none.

    A table saves its sketch only with ``min_count`` > 1, so a job saved with ``min_count`` 1
    and continued with more (``--replace``) found no ``<table>/sketch`` and every restore
    failed. Zeros are exact there: with ``min_count`` 1 every id seen got a row, so no id was
    still being counted. (A session the chief recreates in the same process, after a lost ps,
    restores zeros too: ids not yet admitted then start their count again.)"""
    graph = graph or v1.get_default_graph()
    wanted = {f"{t.name}/sketch" for t in tables(graph) if t.shards and t.min_count > 1}
    if not wanted or not checkpoint:
        return None
    try:
        absent = wanted - set(tf.train.load_checkpoint(checkpoint).get_variable_to_shape_map())
    except (tf.errors.OpError, ValueError):
        return None
    if not absent:
        return None

    class ZeroSketchBuilder(compat.bulk_saver_builder()):
        def bulk_restore(self, filename_tensor, saveables, preferred_shard, restore_sequentially):
            specs = [spec for saveable in saveables for spec in saveable.specs]
            present = [spec for spec in specs if spec.name not in absent]
            with tf.device("cpu:0"):
                read = iter(tf.raw_ops.RestoreV2(
                    prefix=filename_tensor, tensor_names=[sp.name for sp in present],
                    shape_and_slices=[sp.slice_spec for sp in present], dtypes=[sp.dtype for sp in present])
                    if present else [])
                return [tf.zeros([SKETCH_DEPTH * SKETCH_WIDTH], spec.dtype) if spec.name in absent else next(read)
                        for spec in specs]

    return ZeroSketchBuilder()


def job_saver(graph, checkpoint: str | None):
    """The job's Saver (the chief's checkpoints, the newest 5 kept): dynamic tables save their
    live rows (one saveable each) instead of their variables, and the admission counts
    ``checkpoint`` (the one to restore) lacks are restored as zeros. ``sharded=False``: every
    file on the chief's disk."""
    return v1.train.Saver(saver_var_list(graph), sharded=False, max_to_keep=5, save_relative_paths=True,
                          builder=saver_builder(checkpoint, graph))
