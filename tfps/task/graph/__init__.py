"""The training graph of one worker: ``build_train_graph(setup, mode, devices)``.

One function builds every mode's graph; what differs between the modes is one small
strategy each (``MODES``): ``async_mode`` (K steps per run), ``sync_mode`` (tfps's sync
aggregation, K steps per run or one) and ``backup_mode`` (sync with backup workers). The
model's step itself (input, model, running metrics, progressive validation, the slice
queue) is ``tfps.task.graph.model_step``. The worker (tfps.task.worker) only runs sessions on it.
See docs/design/steps.md and the page of each mode.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from tfps import compat
from tfps.task.graph import async_mode, backup_mode, optimizers, placement, slicequeue, sync_mode
from tfps.task.graph.model_step import ModelStep, input_batches
from tfps.task.graph.traingraph import TrainGraph
from tfps.task.monitor import progressive
from tfps.task.monitor.board import Board
from tfps.task.runtime.donequeue import done_queue, stop_flag
from tfps.task.runtime.session import cluster_spec
from tfps.task.setup import JobSetup, optimizer_options

log = logging.getLogger("tfps")

#: The training modes: name -> the strategy that builds its steps and its coordination.
MODES = {"async": async_mode.AsyncMode, "sync": sync_mode.SyncMode, "backup": backup_mode.BackupMode}


@dataclass
class Devices:
    """Where a worker's graph goes: ``task`` (its TaskRef), ``worker`` (its CPU), and the
    ``balancer`` (tfps.task.graph.placement.ByteBalancer) that places its variables on the ps."""

    task: object
    worker: str
    balancer: placement.ByteBalancer

    @classmethod
    def of(cls, task) -> Devices:
        return cls(task, f"/job:worker/task:{task.index}/cpu:0", placement.ByteBalancer(task.num_ps))

    def setter(self):
        return placement.device_setter(self.task, cluster_spec(self.task), self.balancer)


def optimizer(setup: JobSetup):
    """The optimizer the setup chose (an explicit flag, else a Keras model's compile(), else the default)."""
    return optimizers.make(setup.optimizer, setup.learning_rate, optimizer_options(setup.cfg, setup.model_fn))


def build_train_graph(setup: JobSetup, mode: str, devices: Devices, *, loop: bool = True, queue_input=None):
    """(graph, TrainGraph) of one worker in ``mode`` (a key of ``MODES``). ``loop``: sync
    steps in a loop (``syncagg.NotLoopable`` when the model cannot); ``queue_input(graph,
    slices)``: the slice queue's dataset (tfps.task.graph.slicequeue.worker_input), with
    ``--input_split queue``. The ops are created in a fixed order (the graph seed's op ids)."""
    import tensorflow as tf
    v1 = tf.compat.v1
    cfg, task = setup.cfg, devices.task
    g = tf.Graph()
    with g.as_default():
        v1.set_random_seed(cfg.seed)
        slices = slicequeue.SliceOps(task.index) if setup.input_split == "queue" else None   # on ps 0
        with v1.device(devices.setter()):
            global_step = v1.train.get_or_create_global_step()
            # The global step as the hooks (StopAtStepHook, checkpoints, progress lines) fetch
            # it with every run: one read on its ps and one transfer (see share_global_step_read).
            with v1.device(global_step.device):
                step_value = global_step.read_value()
            strategy = MODES[mode](setup, devices, global_step, step_value, loop)
            batches = input_batches(setup, devices, g, slices, queue_input)
            log.info("%s: %s", task.name, setup.optimizer_note)
            strategy.use(optimizer(setup))
            window = progressive.Window(cfg.progressive_window, task.num_workers, devices.worker)
            step = ModelStep(setup, devices, g, batches, step_value, window, slices, strategy)
            built = strategy.build(step)
            compat.share_global_step_read(g, built.step_read)
            coordination = strategy.coordination()
        # Reset by ProgressHook after each progress line: running values since the last line.
        reset_running = (v1.variables_initializer(step.running_state, name="reset_running_metrics")
                         if step.running_state else None)
        flag = stop_flag()
        raise_flag = flag.assign(True)
        board = Board(task.num_workers, task.index, global_step, task.num_ps, window.summarize())
        v1.summary.scalar("loss", built.loss)
        for k, t in built.metrics.items():
            v1.summary.scalar(k, t)
        done = [done_queue(j, task.num_workers).enqueue(task.index) for j in range(task.num_ps)]
        ops = TrainGraph(train_op=built.train_op, global_step=global_step, global_step_read=built.step_read,
                         loss=built.loss, metrics=built.metrics, steps=built.steps,
                         steps_per_run=built.steps_per_run, flag=flag, raise_flag=raise_flag, board=board,
                         done=done, running_state=list(step.running_state), reset_running=reset_running,
                         sync_fetch=built.sync_fetch or None, progressive=window if window.kind else None,
                         slices=slices, **coordination)
    return g, ops
