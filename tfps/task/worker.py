"""A worker task: build the graph, train under MonitoredSession, tell the ps it is done.

``Worker`` is a non-chief worker and the base of ``tfps.task.chief.Chief``, which adds
checkpoints, the export and the report. What matters here is how a worker joins and
leaves:

* Non-chief workers poll for the chief's initialisation every ``timeouts.JOIN_POLL_SECS``
  instead of the 30 s that ``MonitoredTrainingSession`` hard-codes, so they join about a
  second after the chief.
* SIGTERM requests a stop between steps; the chief then raises a cluster-wide stop flag
  (a variable on ps 0) that every worker reads every ``timeouts.FLAG_READ_SECS``, so the
  whole job winds down.
* A worker that cannot train (bad input, a model that raises) still sends its "done"
  token, so the ps is not left waiting; a startup watchdog ends a worker that has not
  trained a step within ``--startup_timeout`` (tfps.task.runtime.watchdog).
"""

from __future__ import annotations

import logging
import sys
import threading
import time

from tfps import timeouts
from tfps.config import RunConfig, replicas_per_step
from tfps.data import dataset as data_mod
from tfps.errors import ConfigError
from tfps.exitcodes import ExitCode
from tfps.outcome import results
from tfps.outcome.report import error_line
from tfps.task.graph import slicequeue
from tfps.task.graph.traingraph import TrainGraph
from tfps.task.monitor.board import publish_hook
from tfps.task.output.checkpoint import glob_free_checkpoint as glob_free
from tfps.task.runtime import datafault
from tfps.task.runtime.donequeue import done_queue, stop_flag
from tfps.task.runtime.health import write_health
from tfps.task.runtime.session import session_config, start_server
from tfps.task.runtime.signals import StopSignal, abandon_rpc, left_in_tensorflow, rpc_abandoned
from tfps.task.runtime.watchdog import StartupWatchdog
from tfps.task.setup import JobSetup

log = logging.getLogger("tfps")


class WorkerFailed(RuntimeError):
    """A worker other than the chief failed (its reason, from the board on ps 0): the job fails."""


class ChiefGaveUp(Exception):
    """A non-chief stopped waiting for the chief: the chief gave up, or a stop was asked for."""


class Worker:
    """One non-chief worker task from start to exit code (the base of ``Chief``)."""

    def __init__(self, task, cfg: RunConfig, stop: StopSignal, started_wall: float | None = None):
        self.task, self.cfg, self.stop = task, cfg, stop
        self.started_wall = started_wall or time.time()
        self.started_iso = results.now_iso()
        self.first_step_at: float | None = None
        self.trained_at: float | None = None   # when the last step of this task ended
        self.job_over = False   # non-chief: the global step has stood at train_steps for a while
        self.last_seen_step = 0
        self.local_steps = 0                  # steps this process trained (ProgressHook counts them)
        self.epoch_steps: int | None = None   # --epochs: the steps of this worker's passes over its data
        self.data_done = False                # --epochs: it read its data that many times (tfps.task.monitor.board)
        self.slices_taken = 0                 # slices this process took from the slice queue (tfps.task.monitor.board)
        self.input_over = False               # the training loop ended: the slice queue's input ends too
        self.slice_input = None               # the slice queue's input generator (tfps.task.graph.slicequeue)
        self.setup: JobSetup | None = None
        self.ops: TrainGraph | None = None    # the training graph's parts, once built
        self.claimed = False   # this chief owns model_dir (results.json may be written there)
        self.watchdog = StartupWatchdog(self)
        self.end_watch: threading.Thread | None = None   # non-chief: the watch for the job's end

    # ------------------------------------------------------------ what the chief overrides
    def report_untrained_failure(self, error: Exception, code: ExitCode, write_results: bool,
                                 lost_tasks: list[str] | None = None) -> None:
        """Only the chief reports a job (``Chief.report_untrained_failure``); a worker has nothing to say."""

    def _prepare(self, setup: JobSetup) -> None:
        """Before the graph is built (the chief claims model_dir here)."""

    def _role_hooks(self, server, scaffold) -> tuple[list, object]:
        """(extra hooks, session creator) of this task's MonitoredSession."""
        from tfps.task.runtime.hooks import FastWorkerSessionCreator  # lazy: imports TensorFlow
        return [publish_hook(self.ops.board, self)], FastWorkerSessionCreator(
            scaffold=scaffold, master=server.target, config=session_config(self.task, self.cfg),
            wait_for_chief=self._wait_for_chief, job_over=lambda: self.job_over)

    def _run_trained(self, setup: JobSetup, server, graph, ops: TrainGraph) -> ExitCode:
        return self._run_worker(server, graph, ops)

    def failure(self, error: Exception) -> Exception:
        """The error a training failure is reported with: a non-finite value in the data the
        pre-check did not reach becomes a ``DataFault`` naming the file, the line and the
        column (tfps.task.runtime.datafault); anything else stays as it is."""
        if self.setup is None or not datafault.is_nonfinite_data_error(error):
            return error
        try:
            where = datafault.locate_nonfinite(self.setup.schema, self.task.num_workers, self.task.index)
        except Exception as e:  # noqa: BLE001 - the report goes out with TensorFlow's words then
            log.warning("%s: could not find the non-finite value: %s", self.task.name, e)
            where = None
        if where is None:
            return error
        fault = datafault.DataFault(where)
        fault.__cause__ = error
        return fault

    def _publish_failure(self, server, graph, error: Exception) -> None:
        """Tell the chief why this worker failed (tfps.task.monitor.board): the job fails with it."""
        board = self.ops.board if self.ops is not None else None
        if board is None:
            return
        text = f"{type(error).__name__}: {error_line(error)}"
        self._end_rpc(server, graph, board.publish_error, "tell the chief why it failed",
                      feed_dict={board.error_value: text})

    # ------------------------------------------------------------------ graph
    def build(self, setup: JobSetup):
        """The training graph (tfps.task.graph.build_train_graph): K steps per run
        (tfps.task.graph.steps), also in sync training, unless a sync model has sparse gradients
        (then one sync step per run, tfps.task.graph.syncagg): that is found while the loop is
        built, and the graph is built again."""
        from tfps.task.graph import syncagg  # lazy: imports TensorFlow
        if self.cfg.sync_replicas:
            try:
                return self._graph(setup, loop=True)
            except syncagg.NotLoopable as e:
                log.info("%s: sync: one step per run (%s)", self.task.name, e)
        return self._graph(setup, loop=False)

    def _graph(self, setup: JobSetup, loop: bool) -> tuple[object, TrainGraph]:
        from tfps.task.graph import Devices, build_train_graph  # lazy: imports TensorFlow
        cfg, task = self.cfg, self.task
        if cfg.epochs and setup.input_split != "queue":
            examples = data_mod.count_examples(setup.schema, cfg.label_column, num_shards=task.num_workers,
                                               shard_index=task.index)
            per_pass = -(-examples // cfg.batch_size)
            self.epoch_steps = per_pass * cfg.epochs
            log.info("%s: --epochs %d: reads its %d training examples %d time(s), %d step(s) a pass, %d in all; "
                     "then it is done", task.name, cfg.epochs, examples, cfg.epochs, per_pass, self.epoch_steps)
        mode = "async"
        if cfg.sync_replicas:
            mode = "backup" if replicas_per_step(cfg, task.num_workers) < task.num_workers else "sync"
        devices = Devices.of(task)
        self.balancer = devices.balancer
        return build_train_graph(setup, mode, devices, loop=loop,
                                 queue_input=lambda graph, slices: self._queue_input(setup, graph, slices))

    def _queue_input(self, setup: JobSetup, graph, slices):
        """The slice queue's dataset (tfps.task.graph.slicequeue); its generator is ``self.slice_input``."""
        ds, self.slice_input = slicequeue.worker_input(self, setup, graph, slices)
        return ds

    # -------------------------------------------------------------- run
    def run(self) -> ExitCode:
        task, cfg = self.task, self.cfg
        _quiet_cancelled_queue_runners()
        server = self.server = start_server(task, cfg)
        write_health(task)
        self.watchdog.start()
        try:
            return self._run(server)
        finally:
            self.watchdog.disarm()
            # After the end RPCs: a watch left in TensorFlow makes the process end without
            # the interpreter's shutdown (tfps.task.entry), which it could abort.
            if self.end_watch is not None:
                left_in_tensorflow(self.end_watch, timeouts.END_WATCH_JOIN_SECS)

    def _run(self, server) -> ExitCode:
        task, cfg = self.task, self.cfg
        try:
            # Bad input found here on the chief (data, model, a model_dir of another job)
            # must still end the whole job: the other tasks are already waiting for it.
            setup = self.setup = JobSetup(cfg, shard=(task.num_workers, task.index), evaluates=task.is_chief)
            setup.check_batch_fits(task.neighbours()[1])
            self._prepare(setup)
            graph, ops = self.build(setup)
        except ConfigError as e:
            print(f"tfps: error: {e}", file=sys.stderr, flush=True)
            return self._abort(server, e, ExitCode.BAD_CONFIG)
        except Exception as e:  # noqa: BLE001 - a model that raises still ends the job cleanly
            log.error("%s: building the training graph failed: %s: %s", task.name, type(e).__name__, e)
            return self._abort(server, e, ExitCode.TRAINING_FAILED)
        return self._run_trained(setup, server, graph, ops)

    def _session(self, server, graph, hooks):
        import tensorflow as tf

        from tfps.task.graph import steps as steps_mod  # lazy: imports TensorFlow
        from tfps.task.runtime.hooks import ProgressHook, StopFlagHook  # lazy: imports TensorFlow
        v1 = tf.compat.v1
        cfg, task = self.cfg, self.task
        from tfps.layers import table_restore  # lazy: imports TensorFlow
        newest = glob_free(tf.train.latest_checkpoint(cfg.model_dir) or "") if task.is_chief else ""   # restored
        scaffold = v1.train.Scaffold(saver=table_restore.job_saver(graph, newest))
        ops = self.ops
        steps = {} if ops.steps is None else {"steps": ops.steps}
        if ops.sync_fetch:   # sync: which gradients arrived stale
            steps.update(ops.sync_fetch)
        progress = ProgressHook(self, {"global_step": ops.global_step_read, "loss": ops.loss,
                                       **ops.metrics, **steps},
                                cfg.log_steps, cfg.batch_size, cfg.train_steps, task.is_chief, cfg.model_dir, task.name,
                                reset=ops.reset_running, progressive=ops.progressive)
        all_hooks = [v1.train.StopAtStepHook(last_step=cfg.train_steps),
                     StopFlagHook(ops.flag, ops.raise_flag, self.stop, task.is_chief),
                     progress] + hooks
        if ops.steps_per_run is not None:
            all_hooks.append(steps_mod.StepsPerRunHook(ops.steps_per_run, cfg.log_steps, steps=ops.steps,
                                                       budget=self.epoch_steps, on_done=self._read_its_data))
        if ops.sync_hook is not None:
            all_hooks.append(ops.sync_hook)
        role_hooks, creator = self._role_hooks(server, scaffold)
        all_hooks += role_hooks
        return v1.train.MonitoredSession(session_creator=creator, hooks=all_hooks,
                                         stop_grace_period_secs=timeouts.SESSION_CLOSE_GRACE_SECS), progress

    def _train(self, server, graph):
        from tfps.task.runtime.hooks import JobOver  # lazy: imports TensorFlow
        ended = threading.Event()
        if not self.task.is_chief:
            self.end_watch = threading.Thread(target=self._watch_for_the_jobs_end, args=(server, graph, ended),
                                              name="tfps-job-end", daemon=True)
            self.end_watch.start()
        progress = None
        # The slice queue: a run may wait for the next slice (the other workers' last ones, a
        # followed job's next partition) longer than --sync_timeout, the session's bound of an
        # operation; a lost task is found by the watchdog (tfps.task.runtime.watchdog) instead.
        options = None if self.ops.slices is None else slicequeue.run_options()
        try:
            with graph.as_default():
                sess, progress = self._session(server, graph, [])
                with sess:
                    try:
                        while not sess.should_stop():
                            sess.run(self.ops.train_op, options=options)
                    finally:
                        # The slice queue's input ends before the session closes: closing waits
                        # for the input's generator, which would wait for the next slice.
                        self.input_over = True
                        if self.slice_input is not None and not self.slice_input.idle(
                                slicequeue.DEQUEUE_WAIT_MS / 1000 + 5):
                            log.warning("%s: the slice queue's input did not end", self.task.name)
                    if self.data_done:
                        self._after_its_data(server, graph)
                    # Training ends with the last step; closing the session (the final
                    # checkpoint, the teardown of the session) is part of the final save.
                    self.trained_at = time.time()
            return progress
        except JobOver:
            log.info("%s: the job reached its last step while this worker's session was being created "
                     "again; nothing is left to train", self.task.name)
            self.trained_at = time.time()
            return progress
        finally:
            ended.set()
            if self.slice_input is not None:   # after the training session closed
                self.slice_input.close()
            # A job restored at its last step trains none; its final save is not start-up.
            self.watchdog.disarm()

    def _read_its_data(self, steps: int) -> None:
        """--epochs: this worker read its share of the data that many times (StepsPerRunHook)."""
        self.data_done = True
        log.info("%s: read its training data %d time(s) (%d step(s)) at global step %d; done",
                 self.task.name, self.cfg.epochs, steps, self.last_seen_step)

    def _after_its_data(self, server, graph) -> None:
        """--epochs, once this worker's data is read, before its session closes: nothing for a
        worker (the chief waits for the others there before its final save)."""

    def _watch_for_the_jobs_end(self, server, graph, ended: threading.Event) -> None:
        """Non-chief: end a wait that nobody will answer once the job is over.

        When the global step has stood at ``train_steps`` for ``SYNC_END_GRACE_SECS`` and
        this worker's training loop has not ended, the chief has made the last step and may
        be gone. Two waits would never end then: a sync step's wait for a token (the chief's
        end releases the waiting workers, but one restarted mid-job has been seen to leave
        one waiting), which closing the token queue ends (what the chief's queue runner does
        at its end: the step ends with OutOfRange, which ends MonitoredSession's loop
        cleanly); and a session being created again after a peer went away, which waits
        for a ready model (``job_over`` makes it give up: tfps.task.runtime.hooks.JobOver).
        """
        import tensorflow as tf
        v1 = tf.compat.v1
        reached_at = None
        closed = False
        session = None
        options = v1.RunOptions(timeout_in_ms=timeouts.WATCH_READ_TIMEOUT_MS)
        try:
            while not ended.wait(timeouts.SYNC_END_POLL_SECS):
                try:
                    if session is None:
                        session = v1.Session(server.target, graph=graph, config=session_config(self.task, self.cfg))
                    step = int(session.run(self.ops.global_step, options=options))
                except tf.errors.OpError as e:
                    # a ps restarting, not initialised yet, or this session gone stale: a new one next time
                    log.debug("%s: sync end watch: %s", self.task.name, e.message.splitlines()[0] if e.message else e)
                    if session is not None:
                        session.close()
                    session = None
                    continue
                if step < self.cfg.train_steps:
                    reached_at = None
                    continue
                reached_at = reached_at or time.monotonic()
                if time.monotonic() - reached_at < timeouts.SYNC_END_GRACE_SECS or ended.is_set():
                    continue
                self.job_over = True   # a session being created again gives up (tfps.task.runtime.hooks.JobOver)
                if not closed and self.ops.close_tokens is not None:
                    closed = True
                    log.info("%s: the job reached step %d and this worker has not ended; closing the sync "
                             "token queue ends a wait for a token", self.task.name, step)
                    session.run(self.ops.close_tokens, options=options)
        except Exception as e:  # noqa: BLE001 - a helper thread: the training loop decides the outcome
            log.warning("%s: the watch for the job's end stopped: %s: %s", self.task.name, type(e).__name__, e)
        finally:
            if session is not None:
                session.close()

    def _end_rpc(self, server, graph, fetches, what: str, feed_dict: dict | None = None) -> bool:
        """One last RPC to the ps (a done token, the stop flag), bounded as a whole.

        The ps may be gone already. The run has its own timeout, but TensorFlow waits for
        the session's tasks without a bound when the session is created, so the call runs
        in a thread that is abandoned after END_RPC_BOUND_SECS; the process then ends
        without waiting for it (signals.abandon_rpc).
        """
        if rpc_abandoned():   # an earlier one found no ps: do not wait again
            log.warning("%s: did not %s: no ps answered before", self.task.name, what)
            return False
        import tensorflow as tf
        v1 = tf.compat.v1
        outcome: list = []

        def call():
            try:
                with v1.Session(server.target, graph=graph, config=session_config(self.task, self.cfg)) as s:
                    s.run(fetches, feed_dict=feed_dict,
                          options=v1.RunOptions(timeout_in_ms=timeouts.END_RPC_TIMEOUT_MS))
                outcome.append(None)
            except tf.errors.OpError as e:
                outcome.append(e.message.splitlines()[0] if e.message else type(e).__name__)

        thread = threading.Thread(target=call, name="tfps-end-rpc", daemon=True)
        thread.start()
        thread.join(timeouts.END_RPC_BOUND_SECS)
        if not outcome:
            abandon_rpc()
            log.warning("%s: could not %s: no ps answered within %.0f s", self.task.name, what,
                        timeouts.END_RPC_BOUND_SECS)
            return False
        if outcome[0] is not None:
            log.warning("%s: could not %s: %s", self.task.name, what, outcome[0])
            return False
        return True

    def _send_done(self, server, graph, done: list | None = None) -> None:
        """Tell every ps this worker is done (``done``: the enqueue ops, else the training graph's)."""
        if self._end_rpc(server, graph, self.ops.done if done is None else done, "tell the ps it is done"):
            log.info("%s: told %d ps task(s) it is done", self.task.name, self.task.num_ps)

    def _abort(self, server, error: Exception, code: ExitCode) -> ExitCode:
        """This task cannot train: report (chief), stop the other workers, let the ps go."""
        self.watchdog.disarm()
        import tensorflow as tf
        task = self.task
        graph = tf.Graph()
        with graph.as_default():
            flag = stop_flag()
            done = [done_queue(j, task.num_workers).enqueue(task.index) for j in range(task.num_ps)]
            raise_flag = flag.assign(True)
        if task.is_chief:
            # Bad input: model_dir may belong to another job, so only the message is sent.
            self.report_untrained_failure(error, code, write_results=code != ExitCode.BAD_CONFIG)
            self._end_rpc(server, graph, raise_flag, "ask the other workers to stop")
        self._send_done(server, graph, done)
        return code

    def _wait_for_chief(self, session, ready, then=None) -> None:
        """Non-chief: wait until the chief has initialised the model (tfps.task.runtime.hooks.wait_for_chief),
        in the session this worker then trains in (``FastWorkerSessionCreator``): once the chief
        is done, that check costs nothing new to set up. Raises ``ChiefGaveUp`` when the chief gave
        up instead (it raised the stop flag before the model was ever ready, e.g. on bad input),
        so that this worker does not wait for hours, or when this worker is asked to stop while
        it waits; ``JobOver`` when the job reached its last step meanwhile."""
        from tfps.task.runtime.hooks import ChiefWaitEnded, wait_for_chief  # lazy: imports TensorFlow
        try:
            wait_for_chief(session, ready, then, flag=self.ops.flag, stopped=lambda: self.stop.requested,
                           job_over=lambda: self.job_over, answered=self.watchdog.extend,
                           publish=self.ops.board.publish_ledger if self.ops.board is not None else None)
        except ChiefWaitEnded as e:
            if e.why == "gave up":
                log.error("%s: the chief gave up before training started", self.task.name)
            raise ChiefGaveUp() from None

    def _run_worker(self, server, graph, ops: TrainGraph) -> ExitCode:
        self.ops = ops
        code = ExitCode.OK
        try:
            self._train(server, graph)
        except ChiefGaveUp:
            if self.stop.requested:
                return self.stop.exit_code()
            self._send_done(server, graph)
            return ExitCode.TRAINING_FAILED
        except Exception as e:
            error = self.failure(e)
            log.error("%s: training failed: %s: %s", self.task.name, type(error).__name__, error_line(error))
            code = ExitCode.TRAINING_FAILED
            self._publish_failure(server, graph, error)
        if self.stop.requested:
            # Stopped by its own signal, not by the chief: this task is expected back (a
            # restart policy, an engine restart) or the ps is being stopped as well. A "done"
            # now would let the ps exit at the chief's end while this worker still trains;
            # without it the ps waits for it at most timeouts.ps_wait_after_chief after the chief.
            log.info("%s: stopped by a signal; not reporting done to the ps", self.task.name)
            return self.stop.exit_code() if code == ExitCode.OK else code
        self._send_done(server, graph)
        return code


def _quiet_cancelled_queue_runners() -> None:
    """A sync chief's token queue runner (a TensorFlow QueueRunner thread) whose enqueue is
    cancelled as the session closes at the job's end raises CancelledError once its
    coordinator has been joined, and Python prints the thread's traceback: expected at that
    moment, so it goes to the debug log instead. Every other thread's error is printed as before."""
    previous = threading.excepthook
    if getattr(previous, "tfps_quiet", False):
        return

    def hook(args):
        if (args.thread is not None and args.thread.name.startswith("QueueRunnerThread")
                and type(args.exc_value).__name__ == "CancelledError"):
            log.debug("%s ended as the session closed: %s", args.thread.name, args.exc_value)
            return
        previous(args)
    hook.tfps_quiet = True
    threading.excepthook = hook
