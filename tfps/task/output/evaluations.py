"""Evaluation points while a job trains: the chief evaluates a checkpoint it has just saved,
at most once per ``EVERY_SECS``, in a thread of its own.

Keras evaluates on its validation data after every epoch; a parameter-server job has no
epochs, so the chief evaluates checkpoints (the same ``tfps.task.output.export.evaluate`` as the
final evaluation: a fresh local graph restored from the checkpoint file, no ps involved).
Each evaluation goes to TensorBoard's ``eval`` run at its step and becomes a point on
loss.png. At most one runs at a time, and only after ``EVERY_SECS`` since the previous one
started: a short job (a test's) evaluates only its final checkpoint, and a long one gets a
point every minute or so for the cost of one pass over the evaluation data. A checkpoint
that is gone before its evaluation reads it (``max_to_keep``) is skipped.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from tfps.task.output import export

log = logging.getLogger("tfps")

#: Seconds between the starts of two evaluations while the job trains.
EVERY_SECS = 60.0
#: Seconds the chief waits at its end for an evaluation still running.
JOIN_SECS = 30.0


class Evaluations:
    """A ``CheckpointSaverListener`` of the chief's CheckpointSaverHook (duck-typed: its
    ``begin``, ``before_save``, ``after_save`` and ``end``)."""

    def __init__(self, setup, cfg, every: float = EVERY_SECS):
        self.setup, self.cfg, self.every = setup, cfg, every
        self.points: list[dict] = []       # {"step": 400, "eval_loss": 0.3, ...}, oldest first
        self._last = time.monotonic()      # the first one a full interval after training starts
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # CheckpointSaverListener
    def begin(self):
        pass

    def before_save(self, session, global_step_value):
        pass

    def after_save(self, session, global_step_value):
        now = time.monotonic()
        if now - self._last < self.every or (self._thread is not None and self._thread.is_alive()):
            return
        step = int(global_step_value)
        path = os.path.join(self.cfg.model_dir, f"model.ckpt-{step}")
        if not os.path.exists(path + ".index"):
            return
        self._last = now
        self._thread = threading.Thread(target=self._evaluate, args=(path, step), name="tfps-eval", daemon=True)
        self._thread.start()

    def end(self, session, global_step_value):
        pass

    def _evaluate(self, path: str, step: int) -> None:
        from tfps.data import dataset as data_mod  # lazy: imports NumPy
        setup, cfg = self.setup, self.cfg
        try:
            metrics = export.evaluate(
                setup.model_fn, setup.params, path,
                lambda: data_mod.make_dataset(setup.eval_schema, cfg.label_column, 256, train=False))
            export.write_eval_summaries(cfg.model_dir, step, metrics)
        except Exception as e:  # noqa: BLE001 - a view of the job: never a failure
            log.info("chief: no evaluation of the checkpoint of step %d: %s", step, str(e).splitlines()[0])
            return
        log.info("chief: evaluation of step %d: %s", step, metrics)
        with self._lock:
            self.points.append({"step": step, **{f"eval_{k}": v for k, v in metrics.items()}})

    def finish(self) -> list[dict]:
        """The evaluations made while the job trained (one still running gets ``JOIN_SECS``)."""
        if self._thread is not None:
            self._thread.join(JOIN_SECS)
        with self._lock:
            return sorted(self.points, key=lambda r: r["step"])
