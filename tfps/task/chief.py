"""The chief worker (worker 0): trains like any worker, then saves, exports and reports.

The end of the job is the point of this module (docs/explanation/job-end.md): the
chief's last checkpoint is written by ``CheckpointSaverHook.end``; the SavedModel is
exported afterwards from the newest checkpoint in a fresh graph (tfps.task.output.export),
then results.json and the one completion message (tfps.outcome.report), and only
then the "done" tokens that let the ps exit. When it starts, the chief joins the live
variables of the ps if every ps still holds them (a restarted chief: ``joined the live
variables on the ps at step N``), else restores the newest checkpoint of its model_dir
(``restored checkpoint of step N``; tfps.task.runtime.rejoin). It keeps the job's story across
its restarts (tfps.outcome.journal) and watches the workers' progress while they train
(tfps.task.monitor.watch).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

from tfps import timeouts
from tfps.cluster import settings
from tfps.cluster.spec import split_target
from tfps.data import dataset as data_mod
from tfps.errors import ConfigError
from tfps.exitcodes import ExitCode
from tfps.notify import job_notifier
from tfps.outcome import journal, lock, report, results
from tfps.task.graph.traingraph import TrainGraph
from tfps.task.monitor.board import FIELDS, publish_hook
from tfps.task.monitor.watch import JobWatch, is_step_timeout, read_step
from tfps.task.output import export, versions
from tfps.task.output.checkpoint import checkpoint_step
from tfps.task.output.evaluations import Evaluations
from tfps.task.output.export import nonfinite_variables
from tfps.task.output.versions import Versions
from tfps.task.runtime import diskfull
from tfps.task.runtime.session import session_config
from tfps.task.runtime.watchdog import probe_tasks
from tfps.task.setup import JobSetup
from tfps.task.worker import Worker, WorkerFailed

log = logging.getLogger("tfps")



class EvaluationFailed(RuntimeError):
    """The final evaluation failed after a complete export: the job fails, the export stays."""


class Chief(Worker):
    """Worker 0 from start to exit code: it alone writes to model_dir and sends messages."""

    story: journal.Story | None = None   # the job's story (tfps.outcome.journal), once model_dir is claimed
    defined: dict | None = None   # the job's settings (tfps.cluster.settings), recorded once a session exists
    publisher = None                      # this chief's board hook (tfps.task.monitor.board), with the latest loss
    sessions = 0                          # sessions created so far (MonitoredSession recreates them)
    session_step: int | None = None       # the step the newest session started from
    _steps_at_session = 0                 # this process's steps when the newest session was created
    replace = False                       # --replace: go on with settings other than model_dir records

    ended_by_epochs = False               # --epochs: every worker read its data before --train_steps
    feeder = None                         # the slice queue's feeder (tfps.task.feeder), where it is used
    watch: JobWatch | None = None         # the watch of the workers' progress, while the job trains
    evaluations = None                    # evaluations of checkpoints while it trains (tfps.task.output.evaluations)
    versions = None                       # --export_every: versions written while it trains (tfps.task.output.versions)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._report_guard = threading.Lock()
        self.reported = False   # the job's one report (results.json and the end message) is made

    def claim_report(self) -> bool:
        """True for the first caller only: the job has one report, whoever sees its end first
        (the training loop's error, or the watchdog that finds a task lost at the same moment)."""
        with self._report_guard:
            if self.reported:
                return False
            self.reported = True
            return True

    def failure(self, error: Exception) -> Exception:
        """A full disk (a checkpoint's SaveV2, history.jsonl) is one line naming the disk and what
        it needs (tfps.task.runtime.diskfull), and what the failed save left in model_dir is removed:
        results.json needs the room."""
        error = super().failure(error)
        if self.cfg.sync_replicas and self.watch is not None and is_step_timeout(error):
            silent = [p for p in probe_tasks(self.task) if p[2] != "answers"]
            return self.watch.sync_timeout(error, self.highest_step(), self.cfg.sync_timeout, silent)
        if isinstance(error, diskfull.DiskFull) or not diskfull.is_disk_full(error):
            return error
        return self._disk_full(error)

    def _disk_full(self, error: Exception) -> diskfull.DiskFull:
        import tensorflow as tf
        cfg = self.cfg
        what = diskfull.what_was_written(error, self.highest_step())
        failed_step = diskfull.checkpoint_step_of(diskfull.written_path(error))
        if failed_step is not None:   # the job had reached the step of the checkpoint it could not write
            self.last_seen_step = max(self.last_seen_step, failed_step)
        need = None
        if what.startswith("the checkpoint"):
            try:   # as much as the previous checkpoint took, or the variables' bytes as placed
                need = diskfull.checkpoint_bytes(tf.train.latest_checkpoint(cfg.model_dir))
            except Exception:  # noqa: BLE001 - the estimate below
                need = 0
            if not need and getattr(self, "balancer", None) is not None:
                need = sum(self.balancer.shares_mb().values()) * 2**20
        full = diskfull.disk_full(error, cfg.model_dir, what, need)   # the free space before the clean-up
        removed = diskfull.remove_save_temporaries(cfg.model_dir)
        if removed:
            log.info("chief: removed what the failed save left in %s: %s", cfg.model_dir, ", ".join(sorted(removed)))
        return full

    def progressive_figures(self) -> dict | None:
        """The job's progressive validation as the watch last read it (at most
        ``timeouts.WATCH_POLL_SECS`` old): ``{"window", "examples", "step", "auc", "log_loss",
        "accuracy"}`` (or ``loss`` and ``metrics``), as results.json's ``progressive`` holds them;
        None before the first read, or with ``--progressive_window 0``. For what records the
        model's quality at a moment (an export's metadata)."""
        figures = self.watch.progressive if self.watch is not None else None
        return dict(figures) if figures else None

    def highest_step(self, *steps: int) -> int:
        """The highest global step this chief saw (a lost ps takes the job back to its checkpoint)."""
        return max([int(s or 0) for s in steps] + [self.last_seen_step]
                   + ([self.watch.job_step] if self.watch is not None else []))

    def report_untrained_failure(self, error: Exception, code: ExitCode, write_results: bool,
                                 lost_tasks: list[str] | None = None) -> bool:
        """The chief's "failed" report for a job that cannot go on training (bad input, a task
        that never started or died for good): results.json from the newest checkpoint, naming
        the ``lost_tasks``, and the message; or, when model_dir may not be written (another
        job's, or not claimed yet), the message only. Nothing (and False) when the job was
        reported already."""
        import tensorflow as tf
        if not self.claim_report():
            log.info("chief: the job was reported already; not reporting %s: %s", type(error).__name__, error)
            return False
        reporter = report.Reporter(self.cfg, self.task, self.setup, self.started_iso, self.started_wall,
                                   story=self.story, notifier=job_notifier(self.cfg))
        if not write_results:
            reporter.notify_only("failed", int(code), error)
            return True
        ckpt = tf.train.latest_checkpoint(self.cfg.model_dir)
        watched = {}
        if self.watch is not None:
            try:   # the workers' figures as the watch last read them (it is not stopped: it may hang on a lost ps)
                watched = self.watch.summary()
            except Exception as e:  # noqa: BLE001 - the report goes out without them
                log.warning("chief: no per-worker figures: %s", e)
        reporter.finished(
            status="failed", exit_code=int(code), step=self.highest_step(checkpoint_step(ckpt)),
            checkpoint=ckpt, export_dir=None, train_summary={}, eval_metrics={}, error=error,
            times={"startup_s": round((self.first_step_at or time.time()) - self.started_wall, 3),
                   "training_s": round(time.time() - self.first_step_at, 3) if self.first_step_at else 0.0,
                   "final_save_s": 0.0},
            lost_tasks=list(lost_tasks or ()), **watched)
        return True

    def _prepare(self, setup: JobSetup) -> None:
        """Claim model_dir before building anything: a directory of another job is refused,
        and so is one whose job has other settings unless ``--replace`` (tfps.cluster.settings).
        The job's settings are recorded there once its first session exists (``_on_session``):
        a start that fails before (a checkpoint that cannot be restored, a model that does not
        build) leaves the record of the job that was, and the next start is still checked
        against it."""
        cfg = self.cfg
        results.check_export_dir(cfg.export_path, cfg.model_dir)
        # One running job per model_dir, whatever started this chief (held until it exits).
        lock.acquire(cfg.model_dir, cfg.name, lock.chief_holder())
        self.defined = defined = settings.job_settings(cfg, self.task.num_ps, self.task.num_workers)
        replaced = settings.check(cfg.model_dir, defined, self.replace)
        resuming = results.claim_model_dir(cfg.model_dir, setup.identity())
        if replaced:
            log.info("chief: --replace: %s recorded other settings; going on from its checkpoint with %s",
                     cfg.model_dir, "; ".join(replaced))
        self.claimed = True
        self.story = journal.Story(cfg.model_dir, self.task.name)
        # Every death of this chief's earlier processes (its supervisor's account), also of one
        # killed before it claimed model_dir; then this attempt's start.
        self.story.died(self.task.name, journal.deaths_from_env())
        self.story.begin(self.started_wall, os.environ.get(journal.RESTART_CAUSE_ENV))
        if resuming:
            self._refuse_nonfinite_checkpoint()
            log.info("resuming from the newest checkpoint in %s", cfg.model_dir)

    def _refuse_nonfinite_checkpoint(self) -> None:
        """A diverged run's checkpoint is never restored silently: it would fail again at once."""
        import tensorflow as tf

        ckpt = tf.train.latest_checkpoint(self.cfg.model_dir)
        bad = nonfinite_variables(ckpt) if ckpt else []
        if bad:
            raise ConfigError(
                f"the newest checkpoint {ckpt} holds NaN or infinite values ({', '.join(bad[:3])}"
                f"{' ...' if len(bad) > 3 else ''}): an earlier run diverged there. Start fresh with a new "
                f"--model_dir, or remove {os.path.join(self.cfg.model_dir, 'checkpoint')} and the "
                "model.ckpt-* files to train from the start", "model_dir")

    def _role_hooks(self, server, scaffold) -> tuple[list, object]:
        import tensorflow as tf

        from tfps.task.runtime.hooks import CheckpointSaverHook, ReleaseSyncTokensHook  # lazy: imports TensorFlow
        from tfps.task.runtime.rejoin import LiveJoiningChiefSessionCreator  # lazy: imports TensorFlow
        v1 = tf.compat.v1
        cfg, task = self.cfg, self.task
        if self.setup is not None and self.setup.eval_schema is not None and self.evaluations is None:
            self.evaluations = Evaluations(self.setup, cfg)
        if self.setup is not None and cfg.export_cadence is not None and self.versions is None:
            self.versions = Versions(export.write_version(self.setup.model_fn, self.setup.params), cfg.export_path,
                                     cfg.export_cadence, cfg.keep_exports, cfg.model_dir,
                                     on_failing=self._exports_failing)
            # Each version records the job's progressive validation at its export.
            versions.set_provider("progressive", self.progressive_figures)
            versions.set_provider("progressive_auc", lambda: (self.progressive_figures() or {}).get("auc"))
        listeners = [x for x in (self.evaluations, self.versions) if x is not None]
        deltas = None
        if cfg.delta_checkpoint_secs:   # between full checkpoints, what changed (tfps.task.output.delta_hook)
            from tfps.task.output.delta_hook import DeltaCheckpointHook  # lazy: imports TensorFlow
            deltas = DeltaCheckpointHook(cfg.model_dir, cfg.delta_checkpoint_secs, task.name)
            listeners.append(deltas.listener)
        hooks = [
            CheckpointSaverHook(cfg.model_dir, save_steps=cfg.checkpoint_every_steps,
                                save_secs=cfg.checkpoint_secs, scaffold=scaffold,
                                session_step=lambda: self.session_step, listeners=listeners or None,
                                save_when=self.versions.due if self.versions is not None else None),
            v1.train.SummarySaverHook(save_steps=cfg.summary_steps, output_dir=cfg.model_dir, scaffold=scaffold),
            v1.train.StepCounterHook(every_n_steps=cfg.summary_steps, output_dir=cfg.model_dir),
        ] + ([deltas] if deltas is not None else [])
        if self.ops.release_tokens is not None:
            # Backup workers: a restarted chief (a later session or attempt) releases the
            # workers that wait for the step the old chief did not finish (steps.release_tokens).
            restarted = (lambda: self.sessions > 1 or (self.story is not None and self.story.attempt > 0))
            hooks.append(ReleaseSyncTokensHook(self.ops.release_tokens,
                                               at_start=restarted if self.ops.backup_workers else None))
        from tfps.task.graph.tables import DynamicTablesHook  # lazy: imports TensorFlow
        hooks.append(DynamicTablesHook(   # dynamic tables: eviction and their log line, off the step path
            self.ops.global_step_read, cfg.log_steps, task.name))
        self.publisher = publish_hook(self.ops.board, self, {"loss": self.ops.loss, **self.ops.metrics})
        hooks.append(self.publisher)
        creator = LiveJoiningChiefSessionCreator(scaffold=scaffold, master=server.target,
                                                 config=session_config(task, cfg), checkpoint_dir=cfg.model_dir,
                                                 global_step=self.ops.global_step,
                                                 token_queue=self.ops.token_queue, on_session=self._on_session,
                                                 answer_within=cfg.sync_timeout,
                                                 first_attempt=self.story is not None and self.story.attempt == 0)
        return hooks, creator

    def _exports_failing(self, text: str) -> None:
        """The one message of versions that keep failing (tfps.task.output.versions): the job goes on."""
        if self.watch is not None:
            reporter = self.watch.reporter
            reporter.send_event("exports_failing", {**reporter.base(), "status": "running",
                                                    "global_step": self.highest_step(), "error": text})

    def _after_its_data(self, server, graph) -> None:
        """--epochs: the chief read its data; its final save (as the session closes) waits until
        every other worker read its own too (their boards say so, tfps.task.monitor.board). The wait
        also ends when the job reaches --train_steps, when a worker failed (the watch raised the
        stop flag), at a stop signal, or when the workers still awaited made no step for
        --sync_timeout (gone: the job is saved without them)."""
        import tensorflow as tf

        v1 = tf.compat.v1
        cfg, ops = self.cfg, self.ops
        others = [i for i in range(self.task.num_workers) if i != self.task.index]
        done_field = FIELDS.index("data_done")
        options = v1.RunOptions(timeout_in_ms=timeouts.WATCH_READ_TIMEOUT_MS)
        moved: dict[int, tuple] = {}   # worker -> (its steps, when they last changed)
        gone: set[int] = set()
        if not others:
            self.ended_by_epochs = True
            return
        log.info("chief: waits for worker(s) %s to read their data before the final save",
                 ", ".join(str(i) for i in others))
        with v1.Session(server.target, graph=graph, config=session_config(self.task, cfg)) as sess:
            while True:
                self.watchdog.extend()   # waiting here is not a stall of the chief's steps
                now = time.monotonic()
                if self.stop.requested:
                    log.info("chief: stop requested while waiting for the workers' data; saving now")
                    return
                step = read_step(sess, ops.global_step, options)
                self.last_seen_step = max(self.last_seen_step, step)
                waiting = []
                boards = ops.board.read_all(sess, options)
                for i in others:
                    board = boards[i]
                    if board is not None and board[done_field] > 0:
                        continue
                    steps = None if board is None else int(board[0])
                    if i not in moved or moved[i][0] != steps:
                        moved[i] = (steps, now)
                    elif now - moved[i][1] > cfg.sync_timeout:
                        if i not in gone:
                            gone.add(i)
                            log.warning("chief: worker %d made no step for --sync_timeout (%.0f s) and has not "
                                        "read its data; the final save goes on without it", i, cfg.sync_timeout)
                        continue
                    waiting.append(i)
                if not waiting:
                    log.info("chief: every worker read its data %d time(s) (global step %d); final save",
                             cfg.epochs, step)
                    self.ended_by_epochs = True
                    return
                if step >= cfg.train_steps:
                    log.info("chief: the job reached --train_steps (%d) before every worker read its data",
                             cfg.train_steps)
                    return
                try:
                    if sess.run(ops.flag, options=options):
                        log.info("chief: the stop flag is raised (a worker failed?); saving now")
                        return
                except tf.errors.OpError:
                    pass   # never written: nobody asked to stop
                time.sleep(timeouts.EPOCHS_WAIT_POLL_SECS)

    def _on_session(self, how: str, step: int, lost: list[str]) -> None:
        """A session of this chief was created: the job's story learns where training resumed."""
        # The step the previous session reached: its last step, or where it started if it ran
        # none (lost again at once: what it had redone is not lost twice).
        reached = self.last_seen_step if self.local_steps > self._steps_at_session else (self.session_step or 0)
        self.sessions += 1
        self.session_step, self._steps_at_session = step, self.local_steps
        if self.sessions == 1:   # restored (or initialised): the job now runs with these settings
            settings.record(self.cfg.model_dir, self.defined)
            if self.story.attempt > 0:
                self.story.resumed(step, how, lost)
        elif how != "joined":
            # MonitoredSession recreated the session: a ps was lost, and it lost the variables.
            who = ", ".join(lost) or "a ps"
            log.warning("chief: %s lost its variables; training resumed from step %d", who, step)
            self.story.recovered(lost, step, reached - step, how)

    def _run_trained(self, setup: JobSetup, server, graph, ops: TrainGraph) -> ExitCode:
        import tensorflow as tf

        self.ops = ops
        cfg, task = self.cfg, self.task
        reporter = report.Reporter(cfg, task, setup, self.started_iso, self.started_wall, story=self.story,
                                   notifier=job_notifier(cfg))
        shares = self.balancer.shares_mb()
        log.info("chief: variables per ps task (MB, the optimizer's slots included): %s",
                 ", ".join(f"{k} {v:g}" for k, v in shares.items()))
        reporter.started()
        error = None
        progress = None
        t_train = time.time()
        watch = self.watch = JobWatch(self, server, graph, ops.board, ops.global_step, reporter)
        feeder = self._start_feeder(setup, server, graph)
        try:
            watch.start()
            progress = self._train(server, graph)
            status = "stopped" if self.stop.requested else "succeeded"
            if feeder is not None and feeder.join_end() is not None:
                error, status = feeder.error, "failed"
                log.error("chief: %s", report.error_line(error))
        except Exception as e:  # noqa: BLE001 - every failure must be reported
            error = self.failure(e)
            status = "failed"
            log.error("chief: training failed: %s: %s", type(error).__name__, report.error_line(error))
            self._end_rpc(server, graph, ops.raise_flag, "ask the other workers to stop")
        if feeder is not None:
            feeder.join_end()
            self.ended_by_epochs = feeder.ended_by == "epochs"
        # No progress or stall message may follow the final one.
        watch.stop(reporter.send_budget())
        if watch.failures and error is None:
            # A job succeeds only when every worker ended cleanly: a worker that failed (on its
            # shard of the data, say) fails the job, in its own words.
            error, status = WorkerFailed("; ".join(f"{name} failed: {why}" for name, why in
                                                   sorted(watch.failures.items()))), "failed"
        t_save = time.time()
        # The final save starts when the last step ends: it holds the final checkpoint
        # (written as the session closes) and the export.
        t_trained = min(self.trained_at or t_save, t_save)
        ckpt = tf.train.latest_checkpoint(cfg.model_dir)
        ckpt_step = checkpoint_step(ckpt)
        step = self.highest_step(ckpt_step)
        export_dir = None
        eval_metrics = {}
        if ckpt and error is None:
            bad = nonfinite_variables(ckpt)
            if bad:
                error, status = FloatingPointError(
                    f"the variables at step {ckpt_step} hold NaN or infinite values ({', '.join(bad[:3])}"
                    f"{' ...' if len(bad) > 3 else ''}): training diverged; check the data and lower "
                    "--learning_rate"), "failed"
                log.error("chief: %s", error)
        # A failed job keeps its checkpoints for a resume but exports nothing, unless the
        # checkpoint already reached the target (a ps lost after the last step, say).
        if ckpt and (error is None or (ckpt_step >= cfg.train_steps and not isinstance(error, FloatingPointError))):
            export_dir, eval_metrics, late = self._export_and_evaluate(setup, ckpt, ckpt_step, t_save)
            if late is not None and error is None:
                error, status = late, "failed"
        elif not ckpt and error is None:
            error, status = RuntimeError(f"no checkpoint was written to {cfg.model_dir}"), "failed"
        t_end = time.time()
        if ckpt and status != "failed" and step > ckpt_step:
            # Async workers may take a few more steps while the final save is written: the job's
            # state is its final checkpoint, so that is the step it reports.
            log.info("chief: global step %d went %d past the final checkpoint (step %d) while it was "
                     "written: asynchronous workers finishing their last steps; the checkpoint and "
                     "export hold step %d", step, step - ckpt_step, ckpt_step, ckpt_step)
            step = ckpt_step
        code = {"succeeded": ExitCode.OK, "stopped": self.stop.exit_code()}.get(status, ExitCode.TRAINING_FAILED)
        result = None
        if not self.claim_report():   # the watchdog reported the job (and ends this process)
            log.info("chief: the job was reported already; not reporting it %s again", status)
        else:
            result = reporter.finished(
                status=status, exit_code=int(code), step=step, checkpoint=ckpt,
                export_dir=export_dir, train_summary=progress.summary() if progress else {},
                eval_metrics=eval_metrics, error=error, **watch.summary(), ps_shares_mb=shares,
                times={"startup_s": round((self.first_step_at or t_train) - self.started_wall, 3),
                       "training_s": round(t_trained - (self.first_step_at or t_train), 3),
                       "final_save_s": round(t_end - t_trained, 3)}, defer_plots=True,
                ended_by=(self.feeder.ended_by if self.feeder is not None else
                          "epochs" if self.ended_by_epochs else None) if status == "succeeded" else None,
                stream=self.feeder.summary() if self.feeder is not None else None)
        watch.write_status(time.monotonic(), time.time(), phase=status, step=step)   # the status line's last state
        self._send_done(server, graph)
        if result is not None:   # while the ps exit: the plots hold no task back
            reporter.draw_plots(result, self.evaluations.finish() if self.evaluations is not None else [])
        self._wait_for_ps_exit()
        return code

    def _start_feeder(self, setup: JobSetup, server, graph):
        """The slice queue's feeder (tfps.task.feeder), when the job reads through the queue."""
        if self.ops.slices is None:
            return None
        from tfps.task.feeder import Feeder, make_source  # lazy: imports TensorFlow
        self.feeder = Feeder(self, server, graph, self.ops.slices,
                             make_source(self.cfg, setup.schema, self.task.num_workers))
        self.feeder.start()
        return self.feeder

    def skipped_partition(self, partition: str, why: str) -> None:
        """--skip_bad_partitions: one message per partition skipped (results.json lists them)."""
        if self.watch is not None:
            self.watch.send_note("progress", f"skipped the malformed partition {partition}: {why}")

    def stream_stalled(self, quiet: float, newest: str | None) -> None:
        """--follow: no new partition for --stall_timeout: one "stalled" message."""
        log.warning("chief: no new partition for %.0f s (--stall_timeout); the newest is %s", quiet, newest)
        if self.watch is not None:
            self.watch.send_note("stalled", f"no new partition for {quiet:.0f} s; the newest is {newest}")

    def _export_and_evaluate(self, setup: JobSetup, ckpt: str, ckpt_step: int, t_save: float):
        """The final SavedModel, then (with eval data) its evaluation: (export_dir, metrics, error).

        Each failure is said in its own words: an evaluation that fails (a model_fn that calls
        sys.exit in eval mode) leaves the export complete, and the log, results.json and the
        message all say so, instead of "final export failed" next to a complete export."""
        cfg = self.cfg
        try:
            if self.versions is not None:   # --export_every: the final export is the last version
                export_dir = self.versions.finish(ckpt, ckpt_step, wait=cfg.final_save_timeout / 2)
            else:
                export_dir = export.export_saved_model(setup.model_fn, setup.params, ckpt, cfg.export_path, ckpt_step)
        except Exception as e:  # noqa: BLE001
            if diskfull.is_disk_full(e):   # export_saved_model removed its half-written directory
                e = diskfull.disk_full(e, cfg.export_path, f"the SavedModel export of step {ckpt_step}",
                                       sum(self.balancer.variables_bytes().values()) or None, "export_dir")
            log.error("chief: final export failed: %s: %s", type(e).__name__, report.error_line(e))
            return None, {}, e
        log.info("chief: exported the SavedModel of step %d to %s (%.1f s)", ckpt_step, export_dir,
                 time.time() - t_save)
        if setup.eval_schema is None:
            return export_dir, {}, None
        try:
            eval_metrics = export.evaluate(
                setup.model_fn, setup.params, ckpt,
                lambda: data_mod.make_dataset(setup.eval_schema, cfg.label_column, 256, train=False))
        except Exception as e:  # noqa: BLE001
            failed = EvaluationFailed(f"the final evaluation of step {ckpt_step} failed, the SavedModel export is "
                                      f"complete: {report.error_line(e)}")
            failed.__cause__ = e
            log.error("chief: %s", failed)
            return export_dir, {}, failed
        log.info("chief: evaluation of step %d: %s", ckpt_step, eval_metrics)
        try:   # TensorBoard's "eval" run, next to the training scalars
            export.write_eval_summaries(cfg.model_dir, ckpt_step, eval_metrics)
        except Exception as e:  # noqa: BLE001 - the summaries are a view: never a failure
            log.warning("chief: the evaluation's TensorBoard summaries were not written: %s", e)
        return export_dir, eval_metrics, None

    def _wait_for_ps_exit(self) -> None:
        """Exit last: give the ps tasks (which exit once every worker is done) a moment to go.

        An orchestrator that watches only the chief (``docker compose up --exit-code-from
        worker0``, the Ansible play) stops whatever still runs when the chief exits; a
        worker finishing its last step a moment after the chief would then be stopped
        instead of ending by itself. Bounded, so a worker that never reports cannot hold
        the chief, and well inside the grace that follows a stop request.
        """
        deadline = time.monotonic() + timeouts.PS_EXIT_WAIT_SECS
        for target in self.task.cluster.ps:
            host, port = split_target(target, "ps_hosts", "ps address")
            while time.monotonic() < deadline:
                try:
                    with socket.create_connection((host, port), timeout=timeouts.PS_EXIT_CONNECT_SECS):
                        pass
                except OSError:
                    break   # refused or no longer resolvable: this ps has exited
                time.sleep(timeouts.PS_EXIT_POLL_SECS)
            else:
                log.info("chief: ps at %s still runs %.0f s after the final save; exiting anyway",
                         target, timeouts.PS_EXIT_WAIT_SECS)
                return
