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
  trained a step within ``--startup_timeout`` (tfps.task.watchdog).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time

from tfps import compat, models, timeouts
from tfps import data as data_mod
from tfps.config import RunConfig, replicas_per_step
from tfps.errors import ConfigError
from tfps.exitcodes import ExitCode
from tfps.models import keras_model, modelspec
from tfps.outcome import results
from tfps.outcome.report import error_line
from tfps.task import datafault, optimizers, placement, progressive, slicequeue
from tfps.task.board import Board, publish_hook
from tfps.task.checkpoint import glob_free_checkpoint as glob_free
from tfps.task.lifecycle import (
    StopSignal,
    abandon_rpc,
    cluster_spec,
    done_queue,
    left_in_tensorflow,
    rpc_abandoned,
    session_config,
    start_server,
    stop_flag,
    write_health,
)
from tfps.task.setup import JobSetup, optimizer_options
from tfps.task.traingraph import TrainGraph
from tfps.task.watchdog import StartupWatchdog

log = logging.getLogger("tfps")


def _optimizer(setup: JobSetup):
    """The optimizer the setup chose (an explicit flag, else a Keras model's compile(), else the default)."""
    return optimizers.make(setup.optimizer, setup.learning_rate, optimizer_options(setup.cfg, setup.model_fn))


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
        self.data_done = False                # --epochs: it read its data that many times (tfps.task.board)
        self.slices_taken = 0                 # slices this process took from the slice queue (tfps.task.board)
        self.input_over = False               # the training loop ended: the slice queue's input ends too
        self.slice_input = None               # the slice queue's input generator (tfps.task.slicequeue)
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
        from tfps.task.hooks import FastWorkerSessionCreator  # lazy: imports TensorFlow
        return [publish_hook(self.ops.board, self)], FastWorkerSessionCreator(
            scaffold=scaffold, master=server.target, config=session_config(self.task, self.cfg),
            wait_for_chief=self._wait_for_chief, job_over=lambda: self.job_over)

    def _run_trained(self, setup: JobSetup, server, graph, ops: TrainGraph) -> ExitCode:
        return self._run_worker(server, graph, ops)

    def failure(self, error: Exception) -> Exception:
        """The error a training failure is reported with: a non-finite value in the data the
        pre-check did not reach becomes a ``DataFault`` naming the file, the line and the
        column (tfps.task.datafault); anything else stays as it is."""
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
        """Tell the chief why this worker failed (tfps.task.board): the job fails with it."""
        board = self.ops.board if self.ops is not None else None
        if board is None:
            return
        text = f"{type(error).__name__}: {error_line(error)}"
        self._end_rpc(server, graph, board.publish_error, "tell the chief why it failed",
                      feed_dict={board.error_value: text})

    # ------------------------------------------------------------------ graph
    def build(self, setup: JobSetup):
        """The training graph: K steps per run (tfps.task.steps), also in sync training,
        unless a sync model has sparse gradients (then one sync step per run,
        tfps.task.syncagg): that is found while the loop is built, and the graph is built again."""
        from tfps.task import syncagg  # lazy: imports TensorFlow
        if self.cfg.sync_replicas:
            try:
                return self._build(setup, sync_loop=True)
            except syncagg.NotLoopable as e:
                log.info("%s: sync: one step per run (%s)", self.task.name, e)
        return self._build(setup, sync_loop=False)

    def _build(self, setup: JobSetup, sync_loop: bool) -> tuple[object, TrainGraph]:
        import tensorflow as tf

        from tfps.layers import dynamic_embedding  # lazy: imports TensorFlow
        from tfps.task import steps as steps_mod  # lazy: imports TensorFlow
        from tfps.task import syncagg  # lazy: imports TensorFlow
        v1 = tf.compat.v1
        cfg, task = self.cfg, self.task
        queued = setup.input_split == "queue"
        if cfg.epochs and not queued:
            examples = data_mod.count_examples(setup.schema, cfg.label_column, num_shards=task.num_workers,
                                               shard_index=task.index)
            per_pass = -(-examples // cfg.batch_size)
            self.epoch_steps = per_pass * cfg.epochs
            log.info("%s: --epochs %d: reads its %d training examples %d time(s), %d step(s) a pass, %d in all; "
                     "then it is done", task.name, cfg.epochs, examples, cfg.epochs, per_pass, self.epoch_steps)
        g = tf.Graph()
        running_state: list = []   # the running metrics' variables (set as the step is built)
        with g.as_default():
            v1.set_random_seed(cfg.seed)
            worker_device = f"/job:worker/task:{task.index}"
            slices = slicequeue.SliceOps(task.index) if queued else None   # on ps 0, outside the byte balance
            self.balancer = placement.ByteBalancer(task.num_ps)
            with v1.device(placement.device_setter(task, cluster_spec(task), self.balancer)):
                global_step = v1.train.get_or_create_global_step()
                # The global step as the hooks (StopAtStepHook, checkpoints, progress lines) fetch
                # it with every run: one read on its ps and one transfer (see share_global_step_read).
                with v1.device(global_step.device):
                    step_value = global_step.read_value()
                # One sync step per run: this read travels with the step's packed reads (made there).
                if not cfg.sync_replicas or sync_loop:
                    with v1.device(worker_device + "/cpu:0"):
                        step_read = tf.identity(step_value, name="global_step_read")
                with v1.device(worker_device + "/cpu:0"):
                    if cfg.train_data and cfg.train_data.startswith(data_mod.LIST_PREFIX):
                        own = data_mod.shard_files(setup.schema.files, task.num_workers, task.index)
                        log.info("%s: reads %d of the %d listed training files: %s", task.name, len(own),
                                 len(setup.schema.files), " ".join(os.path.basename(f) for f in own))
                    if queued:
                        ds, self.slice_input = slicequeue.worker_input(self, setup, g, slices)
                    else:
                        ds = data_mod.make_dataset(setup.schema, cfg.label_column, cfg.batch_size,
                                                   num_shards=task.num_workers, shard_index=task.index,
                                                   train=True, seed=cfg.seed, epochs=cfg.epochs)
                    batches = v1.data.make_one_shot_iterator(ds)
                log.info("%s: %s", task.name, setup.optimizer_note)
                opt = _optimizer(setup)
                backup, agg = False, None
                if cfg.sync_replicas:
                    per_step = replicas_per_step(cfg, task.num_workers)
                    backup = per_step < task.num_workers
                    if backup:
                        log.info("%s: sync: each step aggregates %d of %d gradients; the %d slowest are dropped "
                                 "(backup workers)", task.name, per_step, task.num_workers,
                                 task.num_workers - per_step)
                    agg = syncagg.SyncAggregation(opt, global_step, per_step, task.num_workers,
                                                  worker_device + "/cpu:0")

                window = progressive.Window(cfg.progressive_window, task.num_workers, worker_device + "/cpu:0")

                def step(local_step=None, now=None):
                    """One step; sync in a loop: ``local_step`` (the token before) and ``now``
                    (the global step read on its ps before the step's variables)."""
                    with v1.device(worker_device + "/cpu:0"):
                        features, labels, *slice_of = batches.get_next()
                    # The variables of each ps as one tensor (tfps.task.steps.PackedReads). Sync:
                    # with the global step's read (the dropped count's comparison); backup workers:
                    # the variables are read after it, and it travels alone.
                    sync_value = now if now is not None else step_value if cfg.sync_replicas else None
                    reads = steps_mod.PackedReads(worker_device + "/cpu:0", step_value=sync_value, wait_for_step=backup,
                                                  pack=not isinstance(setup.model_fn, keras_model.KerasModelFn))
                    with placement.partitioned(task.num_ps, cfg.partition_mb, keras=models.may_use_keras(cfg.model)), \
                            modelspec.on_worker(worker_device + "/cpu:0"), \
                            dynamic_embedding.shard_devices([f"/job:ps/task:{i}" for i in range(task.num_ps)]):
                        spec = reads.build(lambda f, lb: setup.model_fn(f, lb, "train", setup.params), features, labels)
                    read = None if sync_value is None else reads.step_read(
                        "global_step_at_step" if now is not None else "global_step_read")
                    if spec.loss is None:
                        raise ConfigError(f"{cfg.model} returned no loss in train mode", "model")
                    running = modelspec.running_metrics(spec, g, task.index, cfg.model)
                    running_state[:] = [v for _, _, variables in spec.streaming.values() for v in variables]
                    # The progress lines' running metrics: updated with the step, read after it.
                    metrics = {**{k: result for k, (_, result) in running.items()},
                               **{k: t for k, t in spec.metrics.items() if k not in running}}
                    extra = ()
                    with v1.control_dependencies(spec.update_ops):   # e.g. BatchNormalization's moving statistics
                        if local_step is not None:
                            sync = syncagg.sync_loop_step(agg, spec.loss, local_step, read,
                                                          fresh_from=read if backup else None,
                                                          last_step=cfg.train_steps)
                            train, extra = sync.train, (sync.token, sync.stale)
                        elif cfg.sync_replicas:
                            # The global step as this run starts (read before its gradients reach an
                            # accumulator: the hooks' own read, no transfer of its own), and the token
                            # the run takes at its end: the step of the next gradient. A gradient whose
                            # step is behind the first is stale: the accumulator drops it.
                            # With backup workers the gradient carries the later of its token and
                            # that read (syncagg.SyncAggregation.send: tokens pile up while a
                            # worker is frozen), and the step is read again as it reaches the ps.
                            sync = syncagg.apply_sync_packed(
                                agg, spec.loss, after=read, fresh_from=read if backup else None,
                                last_step=cfg.train_steps)
                            train = sync.train
                            sync_fetch["step_read"] = read
                            sync_fetch["stale"] = tf.cast(sync.sent_step < sync.arrived_at, tf.int32)
                        else:
                            train = steps_mod.apply_packed(opt, spec.loss, global_step, worker_device + "/cpu:0")
                    if running:
                        train = tf.group(train, *[update for update, _ in running.values()])
                    train = window.attach(train, spec, labels, cfg.batch_size)   # scored before its update
                    if slices is not None:   # after the update: count the examples, mark a slice done
                        with v1.control_dependencies([train]):
                            train = slices.step_updates(*slice_of, tf.shape(labels)[0])
                    return (train, spec.loss, metrics, *extra)

                def sync_step(local_step):
                    # Each step reads the global step before its variables: the dropped count's
                    # comparison, and with backup workers the step its gradient is fresh for.
                    with v1.device(global_step.device):
                        now = global_step.read_value()
                    return step(local_step, now)

                sync_fetch: dict = {}
                if cfg.sync_replicas and sync_loop:   # several sync steps per session.run
                    train_op, steps, loss, metrics, steps_per_run, stale = syncagg.sync_step_loop(
                        sync_step, agg, cfg.train_steps)
                    sync_fetch["stale"] = stale
                elif cfg.sync_replicas:
                    # Backup workers: a step's variable reads come after its global step read.
                    # Plain sync: the global step's read travels with the packed reads (one step
                    # per run, so the hooks' read and the step's reads are those of the same run).
                    train_op, loss, metrics = step()
                    step_read = sync_fetch.pop("step_read")
                    steps = steps_per_run = None
                else:   # several steps per session.run (tfps.task.steps)
                    train_op, steps, loss, metrics, steps_per_run = steps_mod.step_loop(
                        step, global_step, cfg.train_steps)
                compat.share_global_step_read(g, step_read)
                release_tokens = sync_hook = close_tokens = None
                if cfg.sync_replicas:
                    release_tokens = syncagg.release_tokens(agg.token_queue, global_step, task.num_workers,
                                                            ahead=1 if backup else 0, marked=sync_loop)
                    sync_hook = agg.hook(task.is_chief)
                    close_tokens = None if task.is_chief else agg.token_queue.close()
            # Reset by ProgressHook after each progress line: running values since the last line.
            reset_running = (v1.variables_initializer(running_state, name="reset_running_metrics")
                             if running_state else None)
            flag = stop_flag()
            raise_flag = flag.assign(True)
            board = Board(task.num_workers, task.index, global_step, task.num_ps, window.summarize())
            v1.summary.scalar("loss", loss)
            for k, t in metrics.items():
                v1.summary.scalar(k, t)
            done = [done_queue(j, task.num_workers).enqueue(task.index) for j in range(task.num_ps)]
            ops = TrainGraph(train_op=train_op, global_step=global_step, global_step_read=step_read, loss=loss,
                             metrics=metrics, steps=steps, steps_per_run=steps_per_run, flag=flag,
                             raise_flag=raise_flag, board=board, done=done, running_state=list(running_state),
                             reset_running=reset_running, sync_hook=sync_hook,
                             token_queue=agg.token_queue if agg is not None else None, close_tokens=close_tokens,
                             release_tokens=release_tokens, backup_workers=backup, sync_fetch=sync_fetch or None,
                             progressive=window if window.kind else None, slices=slices)
        return g, ops

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

        from tfps.task import steps as steps_mod  # lazy: imports TensorFlow
        from tfps.task.hooks import ProgressHook, StopFlagHook  # lazy: imports TensorFlow
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
        from tfps.task.hooks import JobOver  # lazy: imports TensorFlow
        ended = threading.Event()
        if not self.task.is_chief:
            self.end_watch = threading.Thread(target=self._watch_for_the_jobs_end, args=(server, graph, ended),
                                              name="tfps-job-end", daemon=True)
            self.end_watch.start()
        progress = None
        # The slice queue: a run may wait for the next slice (the other workers' last ones, a
        # followed job's next partition) longer than --sync_timeout, the session's bound of an
        # operation; a lost task is found by the watchdog (tfps.task.watchdog) instead.
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
        for a ready model (``job_over`` makes it give up: tfps.task.hooks.JobOver).
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
                self.job_over = True   # a session being created again gives up (tfps.task.hooks.JobOver)
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
        without waiting for it (lifecycle.abandon_rpc).
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
        """Non-chief: wait until the chief has initialised the model (tfps.task.hooks.wait_for_chief),
        in the session this worker then trains in (``FastWorkerSessionCreator``): once the chief
        is done, that check costs nothing new to set up. Raises ``ChiefGaveUp`` when the chief gave
        up instead (it raised the stop flag before the model was ever ready, e.g. on bad input),
        so that this worker does not wait for hours, or when this worker is asked to stop while
        it waits; ``JobOver`` when the job reached its last step meanwhile."""
        from tfps.task.hooks import ChiefWaitEnded, wait_for_chief  # lazy: imports TensorFlow
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
