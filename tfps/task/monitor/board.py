"""The progress board: each worker's own progress, published on ps 0 for the chief to watch.

The global step says that the job advances, not that every worker does: in async mode a
frozen worker goes unnoticed while the others train on. So each worker writes a small
vector, its board, into a variable of its own on ps 0 (shared by name, like the stop
flag) about once a second, as part of a training step it runs anyway:

    [steps this process trained, the global step, when this process started, the signal
     that ended its predecessor (0: unknown or none), stale gradients dropped, 1 once it
     read its data --epochs times (0 before, and without --epochs), slices this process took
     from the slice queue (tfps.task.graph.slicequeue)]

The chief reads every board from a thread of its own (tfps.task.monitor.watch): stalls, restarts
of workers, per-worker figures. The variables are in no collection: never checkpointed,
never initialised by anyone but their writer (assigning initialises them), so a worker that
joins never resets another's board; a board nobody wrote yet cannot be read.

Next to the boards, one string per worker: why it failed (a worker that fails writes it
before it exits; the chief's watch reads it, and the job fails with that reason).

With the board, when the job scores its batches (tfps.task.monitor.progressive), the summary of the
worker's window of progressive scores, in a variable of its own on ps 0 that the chief's
watch sums into the job's window.

And one string per task, its ledger: the deaths of its earlier processes that its
``tfps run --restarts`` supervisor saw (``tfps.outcome.journal.RESTART_DEATHS_ENV``, JSON). A
worker writes its ledger on ps 0 as soon as ps 0 answers while it waits for the chief, and
again with its board (so it is there again after ps 0 came back); a ps writes its own on
itself as it starts (``write_ps_ledger``). The chief's watch reads them all and adds every
death to the job's story: a process killed again before it trained, or while the chief was
away, is a failure the job recovered from all the same.
"""

from __future__ import annotations

import os
import time

from tfps import timeouts
from tfps.outcome.journal import RESTART_DEATHS_ENV, RESTART_SIGNAL_ENV

FIELDS = ("local_steps", "global_step", "started", "restart_signal", "dropped_gradients", "data_done", "slices")


class Board:
    """The board variables of every worker and the ops to write this worker's, read anyone's."""

    def __init__(self, num_workers: int, index: int, global_step, num_ps: int = 1, progressive=None):
        """``progressive``: this worker's window summary (``progressive.Window.summarize``), or None."""
        import tensorflow as tf
        v1 = tf.compat.v1
        self.index = index
        # The global step field is at least the job's step as the write happens, read where
        # the step lives, with the write: a write needs no run of its own first.
        with v1.device(global_step.device):
            step = tf.cast(global_step.read_value() if hasattr(global_step, "read_value") else global_step,
                           tf.float64)
        with v1.device("/job:ps/task:0"):
            self.vars = [v1.get_variable(f"tfps_board_worker{i}", shape=[len(FIELDS)], dtype=tf.float64,
                                         initializer=v1.zeros_initializer(), trainable=False, collections=[])
                         for i in range(num_workers)]
            self.value = v1.placeholder(tf.float64, shape=[len(FIELDS)], name="tfps_board_value")
            value = tf.concat([self.value[:1], tf.maximum(self.value[1:2], tf.reshape(step, [1])), self.value[2:]], 0)
            board_write = self.vars[index].assign(value).op
            ledgers = [ledger_variable(f"worker{i}") for i in range(num_workers)]
            # The ledger also alone: a restarted worker writes it as soon as ps 0 answers, before
            # the chief's model is ready (tfps.task.runtime.hooks.wait_for_chief), and it may train no
            # step before the job ends.
            self.publish_ledger = ledgers[index].assign(own_ledger()).op
            self.publish = tf.group(board_write, self.publish_ledger)
            self.progressive_vars = [] if progressive is None else [
                v1.get_variable(f"tfps_progressive_worker{i}", shape=progressive.shape, dtype=tf.float64,
                                initializer=v1.zeros_initializer(), trainable=False, collections=[])
                for i in range(num_workers)]
            if progressive is not None:
                self.publish = tf.group(self.publish, self.progressive_vars[index].assign(progressive))
        # Every worker's window summary (tfps.task.monitor.progressive), read by the chief's watch.
        self.read_progressive = [_read(v) for v in self.progressive_vars]
        # Every task's ledger, by task name: the workers' on ps 0, each ps's on itself.
        self.read_ledgers = {f"worker{i}": _read(v) for i, v in enumerate(ledgers)}
        for j in range(num_ps):
            with v1.device(f"/job:ps/task:{j}"):
                self.read_ledgers[f"ps{j}"] = _read(ledger_variable(f"ps{j}"))
        self.read = [v.read_value() if hasattr(v, "read_value") else v.value() for v in self.vars]
        # Why a worker failed ("" until it does): written once by the worker as it fails,
        # read by the chief's watch, so the job fails with it whatever runs the tasks.
        with v1.device("/job:ps/task:0"):
            self.error_vars = [v1.get_variable(f"tfps_error_worker{i}", shape=[], dtype=tf.string,
                                               initializer=v1.constant_initializer(""), trainable=False,
                                               collections=[])
                               for i in range(num_workers)]
            self.error_value = v1.placeholder(tf.string, shape=[], name="tfps_error_value")
            self.publish_error = self.error_vars[index].assign(self.error_value).op
        self.read_errors = [v.read_value() if hasattr(v, "read_value") else v.value() for v in self.error_vars]

    def read_all(self, sess, options) -> list:
        """Every worker's board as floats, by worker index; None for one not written yet (or
        while ps 0 is away)."""
        import tensorflow as tf
        boards = []
        for read in self.read:
            try:
                boards.append([float(x) for x in sess.run(read, options=options)])
            except tf.errors.OpError:
                boards.append(None)
        return boards


def _read(v):
    return v.read_value() if hasattr(v, "read_value") else v.value()


def ledger_variable(task: str):
    """The string variable of ``task``'s ledger, shared by name on the device in scope; in no
    collection (never checkpointed or initialised by anyone but its writer)."""
    import tensorflow as tf
    v1 = tf.compat.v1
    return v1.get_variable(f"tfps_deaths_{task}", shape=[], dtype=tf.string,
                           initializer=v1.constant_initializer(""), trainable=False, collections=[])


def own_ledger() -> str:
    """This process's ledger: the deaths its supervisor passed on (``"[]"`` without one)."""
    return os.environ.get(RESTART_DEATHS_ENV) or "[]"


def ps_ledger_write(index: int):
    """The op with which a ps (tfps.task.ps) writes its ledger on itself as it starts (built in
    its own graph, run in its own session)."""
    import tensorflow as tf
    with tf.compat.v1.device(f"/job:ps/task:{index}"):
        return ledger_variable(f"ps{index}").assign(own_ledger()).op


def read_ledgers(board: Board, sess, options) -> dict[str, str]:
    """Every ledger that can be read now (not yet written, or its ps away: left out)."""
    import tensorflow as tf
    out = {}
    for name, read in getattr(board, "read_ledgers", {}).items():
        try:
            text = sess.run(read, options=options)
        except tf.errors.OpError:
            continue
        out[name] = text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)
    return out


def restart_signal() -> int:
    """The signal that killed this task's predecessor, when a supervisor said so (else 0)."""
    try:
        return int(os.environ.get(RESTART_SIGNAL_ENV, "0"))
    except ValueError:
        return 0


def publish_hook(board: Board, job, extra_fetches: dict | None = None):
    """A SessionRunHook that writes this worker's board at most every ``timeouts.BOARD_PUBLISH_SECS``.

    ``extra_fetches`` (the chief's loss and metrics) are fetched with the same steps, for
    the chief's progress messages: one step a second, never a step of its own.
    """
    import tensorflow as tf
    v1 = tf.compat.v1

    class BoardPublishHook(v1.train.SessionRunHook):
        def __init__(self):
            self.next_write = 0.0
            self.signal = restart_signal()
            self.latest: dict = {}

        def value(self) -> list:
            return [job.local_steps, job.last_seen_step, job.started_wall, self.signal,
                    getattr(job, "dropped_gradients", 0), 1.0 if getattr(job, "data_done", False) else 0.0,
                    getattr(job, "slices_taken", 0)]

        def write(self, session) -> None:
            """Write the board outside a training step (bounded; the ps may be gone)."""
            options = v1.RunOptions(timeout_in_ms=timeouts.BOARD_WRITE_TIMEOUT_MS)
            try:
                session.run(board.publish, feed_dict={board.value: self.value()}, options=options)
            except tf.errors.OpError:
                pass

        def after_create_session(self, session, coord):
            # With the session's first run, which starts at once: the write then costs no run
            # of its own before the first step. A worker restarted near the job's end may
            # train none; it writes as its session ends (``end``), and the chief still learns
            # of its restart (and its step).
            self.next_write = 0.0

        def before_run(self, run_context):
            now = time.monotonic()
            if now < self.next_write:
                return None
            self.next_write = now + timeouts.BOARD_PUBLISH_SECS
            return v1.train.SessionRunArgs({"publish": board.publish, **(extra_fetches or {})},
                                           feed_dict={board.value: self.value()})

        def end(self, session):
            self.write(session)   # the last figures, for the chief's final report

        def after_run(self, run_context, run_values):
            # The steps themselves are counted by ProgressHook (job.local_steps): an async
            # run is several steps (tfps.task.graph.steps).
            if run_values.results:
                self.latest = {k: v for k, v in run_values.results.items() if k != "publish"}

    return BoardPublishHook()
