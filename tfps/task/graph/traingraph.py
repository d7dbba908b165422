"""What a worker's graph holds for the session, its hooks and the chief: ``TrainGraph``.

``build_train_graph`` (tfps.task.graph) returns the graph and one ``TrainGraph``; the worker's
session and hooks, the chief (tfps.task.chief) and its watch (tfps.task.monitor.watch) read its
fields by name. The values are TensorFlow ops, tensors and variables of that graph (typed
``Any`` here, so that this module does not import TensorFlow).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class TrainGraph:
    """The parts of one worker's training graph that are run, fetched or fed by name.

    Training (every mode):

    * ``train_op``: what one ``session.run`` of the training loop runs: ``steps_per_run``
      steps in a loop (async, and sync when the model's gradients are dense), else one step.
    * ``global_step``: the global step variable (on a ps).
    * ``global_step_read``: the global step as the hooks fetch it with every run (one read
      on its ps, one transfer; ``compat.share_global_step_read``).
    * ``loss``, ``metrics``: the loss and the named metrics (name -> tensor) of the run's
      last step, for the progress lines, the summaries and the chief's board.
    * ``steps``: how many steps the run trained, or None (one step per run).
    * ``steps_per_run``: the placeholder that sets K, the steps of the next run
      (``steps.StepsPerRunHook`` feeds it), or None (one step per run).
    * ``running_state``: the variables of the model's running metrics (this worker's own);
      ``reset_running`` re-initialises them after each progress line (None: no running metric).
    * ``progressive``: this worker's window of progressive scores (``progressive.Window``: each
      batch scored before it trains), or None (``--progressive_window 0``).

    Sync training (all None, or False, in async training):

    * ``sync_hook``: ``syncagg.SyncAggregation.hook`` for this task (the chief's token queue runner).
    * ``token_queue``: the sync token queue; ``close_tokens`` (non-chief) closes it, which ends
      a wait for a token once the job is over (``Worker._watch_for_the_jobs_end``).
    * ``release_tokens``: the chief's op that releases workers waiting for a token
      (``syncagg.release_tokens``); ``backup_workers``: fewer gradients than workers per step.
    * ``sync_fetch``: name -> tensor fetched with each run (``stale``: gradients that arrived
      stale), or None.

    The job's coordination (tfps.task.runtime.donequeue, tfps.task.monitor.board):

    * ``flag``, ``raise_flag``: the cluster-wide stop flag on ps 0 and the op that raises it.
    * ``board``: this worker's ``Board`` (its step, its failure, the chief's progress).
    * ``done``: the enqueue ops that tell every ps this worker is done.
    * ``slices``: the slice queue's ops (``tfps.task.graph.slicequeue.SliceOps``), or None (static shares).
    """

    train_op: Any
    global_step: Any
    global_step_read: Any
    loss: Any
    metrics: dict[str, Any]
    steps: Any
    steps_per_run: Any
    flag: Any
    raise_flag: Any
    board: Any
    done: list
    running_state: list = field(default_factory=list)
    reset_running: Any = None
    sync_hook: Any = None
    token_queue: Any = None
    close_tokens: Any = None
    release_tokens: Any = None
    backup_workers: bool = False
    sync_fetch: dict[str, Any] | None = None
    progressive: Any = None
    slices: Any = None
