"""One training step of the model, as every training mode builds it (tfps.task.graph).

``input_batches``: this worker's batches (its static share, or the slice queue's).
``ModelStep``: the step: the next batch, the model on the packed reads of the variables
(tfps.task.graph.steps.PackedReads), the update the mode gives (``strategy.train``), the running
metrics, the progressive window (each batch scored before its update) and the slice
queue's count.
"""

from __future__ import annotations

import logging
import os
from typing import NamedTuple

from tfps import models
from tfps.data import dataset as data_mod
from tfps.errors import ConfigError
from tfps.models import keras_model, modelspec
from tfps.task.graph import partition

log = logging.getLogger("tfps")


class Built(NamedTuple):
    """What a mode's ``build`` returns (the fields of TrainGraph of the same names)."""

    train_op: object
    steps: object
    loss: object
    metrics: dict
    steps_per_run: object
    step_read: object
    sync_fetch: dict


def input_batches(setup, devices, graph, slices, queue_input):
    """The iterator of this worker's training batches (on its CPU)."""
    import tensorflow as tf
    v1 = tf.compat.v1
    cfg, task = setup.cfg, devices.task
    with v1.device(devices.worker):
        if cfg.train_data and cfg.train_data.startswith(data_mod.LIST_PREFIX):
            own = data_mod.shard_files(setup.schema.files, task.num_workers, task.index)
            log.info("%s: reads %d of the %d listed training files: %s", task.name, len(own),
                     len(setup.schema.files), " ".join(os.path.basename(f) for f in own))
        if slices is not None:
            ds = queue_input(graph, slices)
        else:
            ds = data_mod.make_dataset(setup.schema, cfg.label_column, cfg.batch_size,
                                       num_shards=task.num_workers, shard_index=task.index,
                                       train=True, seed=cfg.seed, epochs=cfg.epochs)
        return v1.data.make_one_shot_iterator(ds)


class ModelStep:
    """``step(local_step=None, now=None)`` builds one step and returns (train, loss, metrics,
    *extra): sync in a loop, ``local_step`` is the token before and ``now`` the global step
    read on its ps before the step's variables; ``extra`` is what ``strategy.train`` adds."""

    def __init__(self, setup, devices, graph, batches, step_value, window, slices, strategy):
        self.setup, self.devices, self.graph, self.batches = setup, devices, graph, batches
        self.step_value, self.window, self.slices, self.strategy = step_value, window, slices, strategy
        self.running_state: list = []   # the running metrics' variables (set as the step is built)

    def __call__(self, local_step=None, now=None):
        import tensorflow as tf

        from tfps.layers import dynamic_embedding  # lazy: imports TensorFlow
        from tfps.task.graph import steps as steps_mod  # lazy: imports TensorFlow
        v1 = tf.compat.v1
        setup, task, worker, strategy = self.setup, self.devices.task, self.devices.worker, self.strategy
        cfg = setup.cfg
        with v1.device(worker):
            features, labels, *slice_of = self.batches.get_next()
        # The variables of each ps as one tensor (tfps.task.graph.steps.PackedReads). Sync: with the
        # global step's read (the dropped count's comparison); backup workers: the variables
        # are read after it, and it travels alone.
        sync_value = now if now is not None else self.step_value if strategy.sync else None
        reads = steps_mod.PackedReads(worker, step_value=sync_value, wait_for_step=strategy.backup,
                                      pack=not isinstance(setup.model_fn, keras_model.KerasModelFn))
        with partition.partitioned(task.num_ps, cfg.partition_mb, keras=models.may_use_keras(cfg.model)), \
                modelspec.on_worker(worker), \
                dynamic_embedding.shard_devices([f"/job:ps/task:{i}" for i in range(task.num_ps)]):
            spec = reads.build(lambda f, lb: setup.model_fn(f, lb, "train", setup.params), features, labels)
        read = None if sync_value is None else reads.step_read(
            "global_step_at_step" if now is not None else "global_step_read")
        if spec.loss is None:
            raise ConfigError(f"{cfg.model} returned no loss in train mode", "model")
        running = modelspec.running_metrics(spec, self.graph, task.index, cfg.model)
        self.running_state[:] = [v for _, _, variables in spec.streaming.values() for v in variables]
        # The progress lines' running metrics: updated with the step, read after it.
        metrics = {**{k: result for k, (_, result) in running.items()},
                   **{k: t for k, t in spec.metrics.items() if k not in running}}
        with v1.control_dependencies(spec.update_ops):   # e.g. BatchNormalization's moving statistics
            train, extra = strategy.train(spec.loss, read, local_step)
        if running:
            train = tf.group(train, *[update for update, _ in running.values()])
        train = self.window.attach(train, spec, labels, cfg.batch_size)   # scored before its update
        if self.slices is not None:   # after the update: count the examples, mark a slice done
            with v1.control_dependencies([train]):
                train = self.slices.step_updates(*slice_of, tf.shape(labels)[0])
        return (train, spec.loss, metrics, *extra)
