"""The SessionRunHooks and session creators of a worker's MonitoredSession.

They derive from TensorFlow classes, so this module imports TensorFlow at the top: import
it only where a graph is built (tfps.task.worker, tfps.task.chief), never from the
CLI or a launcher.

* ``ProgressHook``: progress lines, NaN detection, the chief's history.jsonl.
* ``StopFlagHook``: SIGTERM or the chief's cluster-wide stop flag -> request_stop.
* ``ReleaseSyncTokensHook``: lets blocked sync workers see the final step.
* ``CheckpointSaverHook``: the chief's checkpoints; its first save follows the first step.
* ``FastWorkerSessionCreator``: non-chief workers join about a second after the chief.
* ``RestoreLoggingChiefSessionCreator``: the chief's ``restored checkpoint of step N`` line.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import tensorflow as tf

from tfps import compat, timeouts
from tfps.config.schema import MAX_FOLLOW_STEPS
from tfps.outcome import results
from tfps.outcome.contract import progressive_line, step_of
from tfps.task.output.checkpoint import checkpoint_step, glob_free_dir
from tfps.task.runtime.signals import StopSignal

v1 = tf.compat.v1
log = logging.getLogger("tfps")


#: The weight of each run's loss in the smoothed loss (an exponential moving average).
LOSS_SMOOTHING = 0.1


class ProgressHook(v1.train.SessionRunHook):
    """Progress lines (step, loss, metrics, examples/s, ETA); the chief also keeps the history.

    The loss and per-batch metrics are those of the run's last step. A model's stateful
    metrics (a Keras model's compiled ``AUC``, ``Precision``, ``Recall``, ...; ``auc`` of the
    built-in binary ``wide_deep``) are running values: over every batch this worker trained
    since its previous progress line, as Keras shows them over an epoch so far. ``reset``
    (the op that sets their variables back to zero, on this worker) is run after each line,
    so each line covers the ``every`` steps before it. The chief's history records carry the
    running value at their step (over the chief's batches since its last line).

    ``progressive`` (a ``tfps.task.monitor.progressive.Window``): each line ends with this worker's window of
    progressive scores (its last examples, each scored before it trained), read with a run
    of its own on this worker (no ps) when the line is due.
    """

    def __init__(self, job, fetches, every, batch_size, last_step, is_chief, model_dir, name, reset=None,
                 progressive=None):
        self.job, self.fetches, self.every, self.reset = job, fetches, every, reset
        self.progressive = progressive
        self.batch_size, self.last_step, self.is_chief = batch_size, last_step, is_chief
        self.model_dir, self.name = model_dir, name
        self.local_steps = 0
        self.t_last = None
        self.step_last = None
        self.local_last = 0
        self.recent: list[dict] = []
        self.examples_s = 0.0     # of the last progress line
        self.history_step: int | None = None   # global step of the chief's last history record
        self.dropped = 0                       # sync: this process's gradients that arrived stale
        self.sums: dict[str, float] = {}       # the chief's losses and metrics since its last history record
        self.counts: dict[str, int] = {}

    def before_run(self, run_context):
        return v1.train.SessionRunArgs(self.fetches)

    def after_run(self, run_context, run_values):
        out = dict(run_values.results)
        steps = int(out.pop("steps", 1))   # an async run is several steps (tfps.task.graph.steps)
        if "stale" in out:
            # Sync: how many of this run's gradients surely arrived stale (the global step, read
            # before a gradient reached its accumulator, was already past the step it carried:
            # SyncReplicasOptimizer's accumulator dropped it). A lower bound: the step may also
            # move on between that read and the gradient's arrival.
            stale = int(out.pop("stale"))
            if stale:
                self.dropped += stale
                self.job.dropped_gradients = self.dropped
        if steps == 0:
            return
        before, self.local_steps = self.local_steps, self.local_steps + steps
        now = time.monotonic()
        self.job.watchdog.progress()   # the next step is bounded by --sync_timeout
        if before == 0:
            self.job.first_step_at = time.time()
            log.info("%s: first training step done %.2f s after start", self.name,
                     self.job.first_step_at - self.job.started_wall)
            self.t_last, self.step_last, self.local_last = now, int(out["global_step"]), self.local_steps
        rec = {k: float(np.asarray(v)) for k, v in out.items() if k != "global_step"}
        rec["step"] = int(out["global_step"])
        self.recent = (self.recent + [rec])[-20:]
        self.job.last_seen_step, self.job.local_steps = rec["step"], self.local_steps
        for k, v in rec.items():   # the history's means since its previous record (the chief's runs)
            if k != "step" and np.isfinite(v):
                self.sums[k] = self.sums.get(k, 0.0) + v
                self.counts[k] = self.counts.get(k, 0) + 1
        if np.isfinite(rec["loss"]):   # the status line's loss: smoothed over this worker's runs
            smoothed = getattr(self.job, "smoothed_loss", None)
            self.job.smoothed_loss = rec["loss"] if smoothed is None else smoothed + LOSS_SMOOTHING * (
                rec["loss"] - smoothed)
        if not np.isfinite(rec["loss"]):
            raise FloatingPointError(f"loss is {rec['loss']} at global step {rec['step']}: training "
                                     "diverged; lower --learning_rate")
        if self.local_steps // self.every > before // self.every:
            dt_ = max(now - self.t_last, 1e-6)
            ex_s = (self.local_steps - self.local_last) * self.batch_size / dt_
            gs_s = (rec["step"] - self.step_last) / dt_
            eta = (self.last_step - rec["step"]) / gs_s if gs_s > 0 else float("nan")
            metrics = " ".join(f"{k} {v:.4f}" for k, v in rec.items() if k not in ("step",))
            dropped = f" | {self.dropped} stale gradient(s) dropped" if self.dropped else ""
            scored = self._progressive(run_context.session)
            log.info("%s: step %s %s | %.0f examples/s | %.1f steps/s%s%s%s", self.name,
                     step_of(rec["step"], self.last_step), metrics, ex_s, gs_s,
                     f" | ETA {max(eta, 0):.0f} s" if self.last_step < MAX_FOLLOW_STEPS else "", dropped,
                     f" | {scored}" if scored else "")
            self.t_last, self.step_last, self.local_last = now, rec["step"], self.local_steps
            self.examples_s = ex_s
            if self.reset is not None:   # the next line's running metrics start afresh
                run_context.session.run(self.reset)
        # The history follows the job's global step, not the chief's own steps: the other
        # workers may train most of a short job (the chief also checkpoints, and may join late).
        if self.is_chief and rec["step"] > 0 and (self.history_step is None
                                                  or rec["step"] // self.every > self.history_step // self.every):
            self.history_step = rec["step"]
            mean = {k: round(self.sums[k] / n, 6) for k, n in self.counts.items() if n}
            self.sums, self.counts = {}, {}
            results.append_history(self.model_dir, {**rec, "time": round(time.time(), 3),
                                                    "examples_per_sec": round(self.examples_s, 1), "mean": mean})

    def _progressive(self, session) -> str:
        """This worker's progressive figures as a line's words ("" without them)."""
        if self.progressive is None or self.progressive.summarize() is None:
            return ""
        self.job.progressive_own = self.progressive.figures(session.run(self.progressive.summarize()), own=True)
        return progressive_line(self.job.progressive_own)

    def summary(self) -> dict:
        """The job's final loss and metrics: the mean of this worker's last runs (up to 20), of
        those in the second half of the job so far. The chief may have run only a few steps of a
        short async job (the other workers trained the rest): its first runs, at a loss the job
        has long left, do not count."""
        if not self.recent:
            return {}
        late = [r for r in self.recent if r["step"] >= self.recent[-1]["step"] / 2]
        keys = [k for k in late[-1] if k != "step"]
        return {k: round(float(np.mean([r[k] for r in late])), 6) for k in keys}

class StopFlagHook(v1.train.SessionRunHook):
    """Turns SIGTERM on any worker, or the chief's cluster-wide stop flag, into request_stop.

    The flag lives on ps 0; reading it costs a round trip, so a worker reads it with
    at most one step per ``timeouts.FLAG_READ_SECS`` instead of with every step.
    """

    def __init__(self, flag, raise_op, stop: StopSignal, is_chief: bool):
        self.flag, self.raise_op, self.stop, self.is_chief = flag, raise_op, stop, is_chief
        self.next_read = 0.0

    def before_run(self, run_context):
        now = time.monotonic()
        if now < self.next_read:
            return None
        self.next_read = now + timeouts.FLAG_READ_SECS
        return v1.train.SessionRunArgs(self.flag)

    def after_run(self, run_context, run_values):
        if self.stop.requested:
            if self.is_chief:
                run_context.session.run(self.raise_op)
            run_context.request_stop()
        elif run_values.results:
            log.warning("the chief asked every worker to stop")
            run_context.request_stop()


class CheckpointSaverHook(v1.train.CheckpointSaverHook):
    """TensorFlow's CheckpointSaverHook, whose first save waits for the first training step.

    The original writes graph.pbtxt, the meta graph and a checkpoint of the starting step
    as the session is created, before the first step: on the chief that is most of a
    second of start-up that every worker waits for. Here the same writes follow the first
    run (a checkpoint of that step instead of the one before it), or the session's end if
    it runs no step. Later saves are as before.
    """

    _initial_pending = False
    _start_step = 0

    def __init__(self, *args, session_step=None, save_when=None, **kw):
        """``session_step()``: the step the session just created starts from, when its
        creator knows it (then no run of its own reads it), else None. ``save_when(step)``:
        True when a save is due besides the periodic ones (a version of --export_every,
        tfps.task.output.versions); the periodic saves then count from it."""
        super().__init__(*args, **kw)
        self._session_step = session_step
        self._save_when = save_when

    def after_create_session(self, session, coord):
        self._initial_pending = True
        known = self._session_step() if self._session_step is not None else None
        self._start_step = (int(session.run(v1.train.get_global_step(session.graph))) if known is None
                            else known)

    def _initial_save(self, session) -> None:
        self._initial_pending = False
        super().after_create_session(session, None)
        # Periodic saves count from the session's first step, as before: every N steps
        # from there (a job with --checkpoint_steps 100 started at 0 saves at 100, 200, ...).
        compat.checkpoint_saver_timer(self).update_last_triggered_step(self._start_step)

    def after_run(self, run_context, run_values):
        if self._initial_pending:
            self._initial_save(run_context.session)
            return
        timer = compat.checkpoint_saver_timer(self)
        last = timer.last_triggered_step()
        super().after_run(run_context, run_values)
        if self._save_when is None or timer.last_triggered_step() != last or not self._save_when(run_values.results):
            return
        step = int(run_context.session.run(compat.checkpoint_saver_global_step(self)))
        timer.update_last_triggered_step(step)
        if compat.checkpoint_saver_save(self, run_context.session, step):
            run_context.request_stop()

    def end(self, session):
        if self._initial_pending:
            self._initial_save(session)
        super().end(session)


class ReleaseSyncTokensHook(v1.train.SessionRunHook):
    """At the end, give blocked sync workers a token so they see the final step and stop.

    ``at_start`` (backup workers, ``tfps.task.graph.steps.release_tokens``): a callable that says
    whether a new session of the chief gives them one too (a restarted chief)."""

    def __init__(self, op, at_start=None):
        self.op, self.at_start = op, at_start

    def after_create_session(self, session, coord):
        if self.at_start is not None and self.at_start():
            self._release(session)

    def end(self, session):
        self._release(session)

    def _release(self, session):
        try:
            session.run(self.op, options=v1.RunOptions(timeout_in_ms=timeouts.END_RPC_TIMEOUT_MS))
        except tf.errors.OpError as e:
            log.debug("releasing sync tokens failed: %s", e)

class JobOver(Exception):
    """A worker's session could not be created again, and the job has reached its last step."""


class _JobAwareSessionManager(v1.train.SessionManager):
    """TensorFlow's session manager, whose wait for a ready model ends once the job is over.

    A worker whose session MonitoredSession recreates near the job's end (a peer went away)
    would otherwise wait for a chief that has finished and gone: ``job_over()`` (the global
    step at train_steps for a while, tfps.task.worker) ends the wait with ``JobOver``.
    """

    def __init__(self, job_over, **kw):
        super().__init__(**kw)
        self._job_over = job_over

    def wait_for_session(self, master, config=None, max_wait_secs=float("inf")):
        deadline = time.monotonic() + max_wait_secs
        while True:
            chunk = min(timeouts.SYNC_END_POLL_SECS, max(deadline - time.monotonic(), 0.0))
            try:
                return super().wait_for_session(master, config=config, max_wait_secs=chunk)
            except tf.errors.DeadlineExceededError:
                if self._job_over():
                    raise JobOver() from None
                if time.monotonic() >= deadline:
                    raise


class PeerRestarted(Exception):
    """A ps that the waiting session used was started again: that session fails every run
    from now on (TensorFlow's ``AbortedError``, "was probably restarted"); a new one works."""


class ChiefWaitEnded(Exception):
    """A non-chief's wait for the chief ended without a ready model: ``why`` is ``"gave up"``
    (the chief raised the stop flag before the model was ever ready) or ``"stopped"`` (this
    worker was asked to stop while it waited)."""

    def __init__(self, why: str):
        super().__init__(why)
        self.why = why


def wait_for_chief(session, ready, then=None, *, flag, stopped, job_over, answered=lambda: None,
                   publish=None) -> None:
    """Poll ``ready`` every JOIN_POLL_SECS in ``session`` until the chief has initialised the model.

    The wait of a non-chief worker (``tfps.task.worker``), which may last as long as the
    chief's start or restore. It ends with:

    * ``ChiefWaitEnded("gave up")`` when ``flag`` (the chief's stop flag, read every
      GIVE_UP_POLL_SECS) is raised, ``ChiefWaitEnded("stopped")`` when ``stopped()``;
    * ``JobOver`` when ``job_over()`` says the job has reached its last step (a worker
      restarted near the end: the chief that would initialise is done and gone);
    * ``PeerRestarted`` when a ps was started again under the session (every later run of
      it fails with ``AbortedError``): the caller opens a new session and waits again. A
      worker restarted mid-job waited here for good after a ps restart while the job
      trained on (issue 51's chaos job).

    ``answered()`` is called whenever the ps answered (the startup watchdog's extension);
    ``publish`` (this worker's ledger, tfps.task.monitor.board) is run once the ps answers, so that
    the chief learns of this worker's restart before it ever trains. ``then``, the check
    that follows the wait, is run once while waiting, so that it is set up too. Returns on
    ready, or after CHIEF_WAIT_SECS (the caller then waits as TensorFlow does).
    """
    deadline = time.monotonic() + timeouts.CHIEF_WAIT_SECS
    flag_due = 0.0
    while time.monotonic() < deadline:
        if stopped():
            raise ChiefWaitEnded("stopped")
        if job_over():
            raise JobOver()
        try:
            if len(session.run(ready)) == 0:
                return
            answered()   # the ps answered; the chief is still initialising
            if publish is not None:
                session.run(publish)
                publish = None
                log.debug("the ps answered; waiting for the chief to initialise the model")
            if then is not None:
                then, warm = None, then
                session.run(warm)
        except tf.errors.AbortedError as e:
            raise PeerRestarted(e.message.splitlines()[0] if e.message else "aborted") from None
        except tf.errors.OpError:
            pass
        if time.monotonic() >= flag_due:   # the give-up is rare: read less often
            flag_due = time.monotonic() + timeouts.GIVE_UP_POLL_SECS
            try:
                if session.run(flag):
                    raise ChiefWaitEnded("gave up")
            except tf.errors.AbortedError as e:
                raise PeerRestarted(e.message.splitlines()[0] if e.message else "aborted") from None
            except tf.errors.OpError:
                pass   # not set: the flag is uninitialised until someone writes it
        time.sleep(timeouts.JOIN_POLL_SECS)


class FastWorkerSessionCreator(v1.train.WorkerSessionCreator):
    """A non-chief's session creator that polls for the chief's initialisation every
    ``timeouts.JOIN_POLL_SECS`` instead of the 30 s TensorFlow hard-codes.

    Its first session waits with ``wait_for_chief(session, ready_for_local_init_op,
    ready_op)`` (the worker's own wait, which may give up) in the session it returns, and
    runs the local initialisation there: both readiness checks are set up while the chief
    still initialises, not after it is done, in a new session. A recreated session (a
    ps was lost) waits the way TensorFlow does, every JOIN_POLL_SECS (the session manager
    it is given before TensorFlow's ``create_session`` would make its own).
    """

    def __init__(self, *args, wait_for_chief=None, job_over=None, **kw):
        super().__init__(*args, **kw)
        self._wait_for_chief = wait_for_chief
        self._job_over = job_over or (lambda: False)

    def _create_waiting_as_tensorflow(self):
        """TensorFlow's ``create_session``, with a session manager that polls every JOIN_POLL_SECS."""
        if compat.session_creator_session_manager(self) is None:
            s = compat.session_creator_scaffold(self).finalize()
            compat.set_session_creator_session_manager(self, _JobAwareSessionManager(
                self._job_over, local_init_op=s.local_init_op, ready_op=s.ready_op,
                ready_for_local_init_op=s.ready_for_local_init_op,
                graph=v1.get_default_graph(), recovery_wait_secs=timeouts.JOIN_POLL_SECS,
                local_init_feed_dict=s.local_init_feed_dict))
        return super().create_session()

    def create_session(self):
        wait, self._wait_for_chief = self._wait_for_chief, None
        if wait is None:
            return self._create_waiting_as_tensorflow()
        s = compat.session_creator_scaffold(self).finalize()
        while True:
            session = v1.Session(compat.session_creator_master(self), graph=v1.get_default_graph(),
                                 config=compat.session_creator_config(self))
            try:
                wait(session, s.ready_for_local_init_op, s.ready_op)
                if s.local_init_op is not None:
                    session.run(s.local_init_op, feed_dict=s.local_init_feed_dict)
                if s.ready_op is None or np.asarray(session.run(s.ready_op)).size == 0:
                    return session
            except PeerRestarted as e:   # this session is dead for good: wait in a new one
                session.close()
                log.info("a ps was started again while this worker waited for the chief (%s); waiting in a "
                         "new session", e)
                time.sleep(timeouts.JOIN_POLL_SECS)
                continue
            except tf.errors.OpError as e:
                log.debug("joining in the waiting session failed: %s", e.message.splitlines()[0])
            except BaseException:
                session.close()
                raise
            session.close()   # not ready after all (the chief restarted meanwhile): wait as TensorFlow does
            return self._create_waiting_as_tensorflow()


class RestoreLoggingChiefSessionCreator(v1.train.ChiefSessionCreator):
    """TensorFlow's chief session creator that says which checkpoint it restored.

    The chief restores the newest checkpoint when it starts and again whenever
    MonitoredSession recreates its session (a ps was lost and restarted: the chief
    repopulates it). Each time it logs ``restored checkpoint of step N from PATH``: the
    line people, tests and tools read, since TensorFlow's own "Restoring parameters from"
    is INFO chatter that tfps keeps out of the console.
    """

    def __init__(self, *args, checkpoint_dir=None, **kw):
        # TensorFlow's restore globs the checkpoint's path: a model_dir named exp[lr=0.01] is
        # given to it under a plain name (tfps.task.output.checkpoint.glob_free_dir).
        super().__init__(*args, checkpoint_dir=glob_free_dir(checkpoint_dir) if checkpoint_dir else None, **kw)
        self.tfps_checkpoint_dir = checkpoint_dir

    def create_session(self):
        checkpoint_dir = self.tfps_checkpoint_dir
        checkpoint = tf.train.latest_checkpoint(checkpoint_dir) if checkpoint_dir else None
        session = super().create_session()
        if checkpoint:
            log.info("restored checkpoint of step %d from %s", checkpoint_step(checkpoint), checkpoint)
        return session
