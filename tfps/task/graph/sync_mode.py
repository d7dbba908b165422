"""Sync training: tfps's own aggregation (tfps.task.graph.syncagg), K steps per run or one.

Every step's gradients go to the accumulators on the ps with the step they belong to; the
chief's queue runner applies a step once ``replicas_per_step`` gradients arrived and hands
out tokens. With dense gradients the steps run in a loop (``syncagg.sync_step_loop``), each
reading the global step before its variables; a sparse gradient raises
``syncagg.NotLoopable`` and the worker builds one step per run, whose global step read
travels with the step's packed reads.
"""

from __future__ import annotations

from tfps.config import replicas_per_step
from tfps.task.graph.model_step import Built


class SyncMode:
    """The sync strategy of ``build_train_graph``; ``BackupMode`` adds backup workers."""

    sync, backup = True, False

    def __init__(self, setup, devices, global_step, step_value, loop: bool = True):
        import tensorflow as tf
        self.setup, self.devices, self.global_step, self.loop = setup, devices, global_step, loop
        self.per_step = replicas_per_step(setup.cfg, devices.task.num_workers)
        self.sync_fetch: dict = {}
        self.step_read = None
        if loop:
            with tf.compat.v1.device(devices.worker):
                self.step_read = tf.identity(step_value, name="global_step_read")

    def use(self, opt) -> None:
        from tfps.task.graph import syncagg  # lazy: imports TensorFlow
        task = self.devices.task
        self.agg = syncagg.SyncAggregation(opt, self.global_step, self.per_step, task.num_workers,
                                           self.devices.worker)

    def train(self, loss, read, local_step):
        import tensorflow as tf

        from tfps.task.graph import syncagg  # lazy: imports TensorFlow
        fresh_from = read if self.backup else None
        last = self.setup.cfg.train_steps
        if local_step is not None:
            sync = syncagg.sync_loop_step(self.agg, loss, local_step, read, fresh_from=fresh_from, last_step=last)
            return sync.train, (sync.token, sync.stale)
        # The global step as this run starts (read before its gradients reach an accumulator:
        # the hooks' own read, no transfer of its own), and the token the run takes at its
        # end: the step of the next gradient. A gradient whose step is behind the first is
        # stale: the accumulator drops it. With backup workers the gradient carries the later
        # of its token and that read (syncagg.SyncAggregation.send: tokens pile up while a
        # worker is frozen), and the step is read again as it reaches the ps.
        sync = syncagg.apply_sync_packed(self.agg, loss, after=read, fresh_from=fresh_from, last_step=last)
        self.sync_fetch["step_read"] = read
        self.sync_fetch["stale"] = tf.cast(sync.sent_step < sync.arrived_at, tf.int32)
        return sync.train, ()

    def build(self, step) -> Built:
        import tensorflow as tf

        from tfps.task.graph import syncagg  # lazy: imports TensorFlow
        if self.loop:   # several sync steps per session.run
            def sync_step(local_step):
                # Each step reads the global step before its variables: the dropped count's
                # comparison, and with backup workers the step its gradient is fresh for.
                with tf.compat.v1.device(self.global_step.device):
                    now = self.global_step.read_value()
                return step(local_step, now)

            train_op, count, loss, metrics, per_run, stale = syncagg.sync_step_loop(
                sync_step, self.agg, self.setup.cfg.train_steps)
            self.sync_fetch["stale"] = stale
            return Built(train_op, count, loss, metrics, per_run, self.step_read, self.sync_fetch)
        # One step per run: the hooks' read and the step's reads are those of the same run
        # (plain sync: the global step's read travels with the packed reads; backup workers:
        # a step's variable reads come after its global step read).
        train_op, loss, metrics = step()
        step_read = self.sync_fetch.pop("step_read")
        return Built(train_op, None, loss, metrics, None, step_read, self.sync_fetch)

    def coordination(self) -> dict:
        from tfps.task.graph import syncagg  # lazy: imports TensorFlow
        task = self.devices.task
        return {"release_tokens": syncagg.release_tokens(self.agg.token_queue, self.global_step, task.num_workers,
                                                         ahead=1 if self.backup else 0, marked=self.loop),
                "sync_hook": self.agg.hook(task.is_chief),
                "close_tokens": None if task.is_chief else self.agg.token_queue.close(),
                "token_queue": self.agg.token_queue, "backup_workers": self.backup}
