"""Sync training with backup workers: each step aggregates fewer gradients than workers.

The sync strategy (tfps.task.graph.sync_mode) with three changes: a step's variables are
read after its global step read (``PackedReads(wait_for_step=True)``), its gradient carries
the later of its token and that read (``fresh_from``: tokens pile up while a worker is
frozen, and a fresh gradient must not be dropped as stale), and the chief releases waiting
workers one step ahead (``release_tokens(ahead=1)``).
"""

from __future__ import annotations

import logging

from tfps.task.graph.sync_mode import SyncMode

log = logging.getLogger("tfps")


class BackupMode(SyncMode):
    """The backup-workers strategy of ``build_train_graph``."""

    backup = True

    def use(self, opt) -> None:
        task = self.devices.task
        log.info("%s: sync: each step aggregates %d of %d gradients; the %d slowest are dropped "
                 "(backup workers)", task.name, self.per_step, task.num_workers, task.num_workers - self.per_step)
        super().use(opt)
