"""Async training: K steps per ``session.run`` (tfps.task.graph.steps.step_loop).

Each step applies its own gradients on the ps (``steps.apply_packed``); the loop runs up to
K of them per call, K fed by ``steps.StepsPerRunHook``. No coordination between workers.
"""

from __future__ import annotations

from tfps.task.graph.model_step import Built


class AsyncMode:
    """The async strategy of ``build_train_graph``."""

    sync = backup = False

    def __init__(self, setup, devices, global_step, step_value, loop: bool = True):
        import tensorflow as tf
        self.setup, self.devices, self.global_step = setup, devices, global_step
        with tf.compat.v1.device(devices.worker):
            self.step_read = tf.identity(step_value, name="global_step_read")

    def use(self, opt) -> None:
        self.opt = opt

    def train(self, loss, read, local_step):
        from tfps.task.graph import steps  # lazy: imports TensorFlow
        return steps.apply_packed(self.opt, loss, self.global_step, self.devices.worker), ()

    def build(self, step) -> Built:
        from tfps.task.graph import steps  # lazy: imports TensorFlow
        train_op, count, loss, metrics, per_run = steps.step_loop(step, self.global_step, self.setup.cfg.train_steps)
        return Built(train_op, count, loss, metrics, per_run, self.step_read, {})

    def coordination(self) -> dict:
        return {}
