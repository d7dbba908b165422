"""A worker task: train with MonitoredSession; the chief also checkpoints, exports, reports.

The end of the job is the point of this module (see DESIGN.md, "The job lifecycle"):

* Non-chief workers poll for the chief's initialisation every 0.5 s instead of the 30 s
  that ``MonitoredTrainingSession`` hard-codes, so they join about a second after the chief.
* SIGTERM requests a stop between steps; the chief then raises a cluster-wide stop flag
  (a variable on ps 0) that every worker reads every 0.25 s, so the whole job winds down.
* The chief's last checkpoint is written by ``CheckpointSaverHook.end``; the SavedModel is
  exported afterwards from the newest checkpoint in a fresh graph (``trainer.export``),
  then results.json, the notification, and only then the "done" tokens that let the ps exit.
* A startup watchdog ends a worker that has not trained a step within --startup_timeout
  (a ps that can never start, a port taken by something else): TensorFlow itself would
  wait for a missing task forever. On the chief it first reports the job failed.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import sys
import threading
import time
import traceback

from trainer import data as data_mod
from trainer import demo, keras_model, models, results
from trainer.config import RunConfig
from trainer.errors import ConfigError
from trainer.exitcodes import ExitCode
from trainer.lifecycle import StopSignal, cluster_spec, done_queue, session_config, stop_flag, write_health

log = logging.getLogger("tfps")

#: Non-chief workers check this often whether the chief has initialised the model.
JOIN_POLL_SECS = 0.5
#: How long a non-chief worker waits for the chief to initialise the model (TF's default).
CHIEF_WAIT_SECS = 7200
#: A worker reads the chief's stop flag (on ps 0) at most this often.
FLAG_READ_SECS = 0.25
#: Bound on sending tokens / flags at the end; the ps may already be gone.
END_RPC_TIMEOUT_MS = 10_000
#: After its done token the chief waits at most this long for the ps tasks to exit.
PS_EXIT_WAIT_SECS = 20.0


class JobSetup:
    """Data schema, model function and params, resolved and validated without a cluster."""

    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        train, evalg = cfg.train_data, cfg.eval_data
        if not train:
            train, evalg = demo.demo_globs(cfg.model)
            evalg = cfg.eval_data or evalg
        self.train_glob, self.eval_glob = train, evalg
        self.schema = data_mod.infer_schema(train, cfg.label_column, cfg.num_classes, "train_data")
        self.eval_schema = None
        if evalg:
            self.eval_schema = data_mod.infer_schema(evalg, cfg.label_column, self.schema.num_classes, "eval_data")
            if self.eval_schema.feature_shape != self.schema.feature_shape:
                raise ConfigError(f"eval examples have shape {list(self.eval_schema.feature_shape)}, training "
                                  f"examples {list(self.schema.feature_shape)}", "eval_data")
        if cfg.model in models.BUILTIN:
            models.check_shape(cfg.model, self.schema.feature_shape)
        self.model_fn = models.resolve(cfg.model)
        self.params = models.ModelParams(self.schema.feature_shape, self.schema.num_classes,
                                         tuple(cfg.hidden), cfg.learning_rate or 0.0, cfg.seed)
        if isinstance(self.model_fn, keras_model.KerasBuilder):   # a Keras model: checked against the data now
            self.model_fn = keras_model.bind(self.model_fn, self.schema, self.params, self.eval_schema)
        self.optimizer, self.learning_rate, self.optimizer_note = keras_model.choose_optimizer(cfg, self.model_fn)
        self.params = dataclasses.replace(self.params, learning_rate=self.learning_rate)

    def identity(self) -> dict:
        c = self.cfg
        return {"run_name": c.name, "model": c.model, "feature_shape": list(self.schema.feature_shape),
                "num_classes": self.schema.num_classes, "hidden_units": c.hidden_units}


def _optimizer(setup: JobSetup):
    import tensorflow as tf
    t = tf.compat.v1.train
    return {"sgd": t.GradientDescentOptimizer, "adam": t.AdamOptimizer,
            "adagrad": t.AdagradOptimizer}[setup.optimizer](setup.learning_rate)


def _hooks_module():
    """Hooks are classes deriving from a TensorFlow base class, so they are built lazily."""
    import numpy as np
    import tensorflow as tf
    v1 = tf.compat.v1

    class ProgressHook(v1.train.SessionRunHook):
        """Progress lines (step, loss, examples/s, ETA); the chief also keeps the history."""

        def __init__(self, job, fetches, every, batch_size, last_step, is_chief, model_dir, name):
            self.job, self.fetches, self.every = job, fetches, every
            self.batch_size, self.last_step, self.is_chief = batch_size, last_step, is_chief
            self.model_dir, self.name = model_dir, name
            self.local_steps = 0
            self.t_last = None
            self.step_last = None
            self.recent: list[dict] = []

        def before_run(self, run_context):
            return v1.train.SessionRunArgs(self.fetches)

        def after_run(self, run_context, run_values):
            out = run_values.results
            self.local_steps += 1
            now = time.monotonic()
            if self.local_steps == 1:
                self.job.first_step_at = time.time()
                self.job.watchdog.disarm()
                log.info("%s: first training step done %.2f s after start", self.name,
                         self.job.first_step_at - self.job.started_wall)
                self.t_last, self.step_last = now, int(out["global_step"])
            rec = {k: float(np.asarray(v)) for k, v in out.items() if k != "global_step"}
            rec["step"] = int(out["global_step"])
            self.recent = (self.recent + [rec])[-20:]
            self.job.last_seen_step = rec["step"]
            if not np.isfinite(rec["loss"]):
                raise FloatingPointError(f"loss is {rec['loss']} at global step {rec['step']}: training "
                                         "diverged; lower --learning_rate")
            if self.local_steps % self.every == 0:
                dt_ = max(now - self.t_last, 1e-6)
                ex_s = self.every * self.batch_size / dt_
                gs_s = (rec["step"] - self.step_last) / dt_
                eta = (self.last_step - rec["step"]) / gs_s if gs_s > 0 else float("nan")
                metrics = " ".join(f"{k} {v:.4f}" for k, v in rec.items() if k not in ("step",))
                log.info("%s: step %d/%d %s | %.0f examples/s | %.1f steps/s | ETA %.0f s", self.name,
                         rec["step"], self.last_step, metrics, ex_s, gs_s, max(eta, 0))
                self.t_last, self.step_last = now, rec["step"]
                if self.is_chief:
                    results.append_history(self.model_dir, {**rec, "time": round(time.time(), 3),
                                                            "examples_per_sec": round(ex_s, 1)})

        def summary(self) -> dict:
            if not self.recent:
                return {}
            keys = [k for k in self.recent[-1] if k != "step"]
            return {k: round(float(np.mean([r[k] for r in self.recent])), 6) for k in keys}

    class StopFlagHook(v1.train.SessionRunHook):
        """Turns SIGTERM on any worker, or the chief's cluster-wide stop flag, into request_stop.

        The flag lives on ps 0; reading it costs a round trip, so a worker reads it with
        at most one step per FLAG_READ_SECS instead of with every step.
        """

        def __init__(self, flag, raise_op, stop: StopSignal, is_chief: bool):
            self.flag, self.raise_op, self.stop, self.is_chief = flag, raise_op, stop, is_chief
            self.next_read = 0.0

        def before_run(self, run_context):
            now = time.monotonic()
            if now < self.next_read:
                return None
            self.next_read = now + FLAG_READ_SECS
            return v1.train.SessionRunArgs(self.flag)

        def after_run(self, run_context, run_values):
            if self.stop.requested:
                if self.is_chief:
                    run_context.session.run(self.raise_op)
                run_context.request_stop()
            elif run_values.results:
                log.warning("the chief asked every worker to stop")
                run_context.request_stop()

    class ReleaseSyncTokensHook(v1.train.SessionRunHook):
        """At the end, give blocked sync workers a token so they see the final step and stop."""

        def __init__(self, op):
            self.op = op

        def end(self, session):
            try:
                session.run(self.op, options=v1.RunOptions(timeout_in_ms=END_RPC_TIMEOUT_MS))
            except tf.errors.OpError as e:
                log.debug("releasing sync tokens failed: %s", e)

    class FastWorkerSessionCreator(v1.train.WorkerSessionCreator):
        def _get_session_manager(self):
            if self._session_manager is None:
                s = self._scaffold
                self._session_manager = v1.train.SessionManager(
                    local_init_op=s.local_init_op, ready_op=s.ready_op,
                    ready_for_local_init_op=s.ready_for_local_init_op,
                    graph=v1.get_default_graph(), recovery_wait_secs=JOIN_POLL_SECS)
            return self._session_manager

    return ProgressHook, StopFlagHook, ReleaseSyncTokensHook, FastWorkerSessionCreator


class StartupWatchdog:
    """Fail a worker that has not trained a step within ``--startup_timeout``.

    TensorFlow waits for every task of the session's device filters without a bound
    ("CreateSession still waiting for response from worker"), and a sync step waits for
    gradients of workers that never came up. Neither can be interrupted from Python, so
    when the time is up this thread says which tasks do not answer, lets the chief report
    the job failed (results.json and the failure message), and ends the process.
    """

    def __init__(self, job: "Job"):
        self.job = job
        self.done = threading.Event()
        self.deadline = 0.0
        self.thread = threading.Thread(target=self._watch, name="tfps-startup-watchdog", daemon=True)

    def start(self) -> "StartupWatchdog":
        self.extend()
        self.thread.start()
        return self

    def extend(self) -> None:
        """The cluster answered and is making progress (a non-chief waiting for the chief)."""
        self.deadline = time.monotonic() + self.job.cfg.startup_timeout

    def disarm(self) -> None:
        self.done.set()

    def _watch(self) -> None:
        while not self.done.wait(max(self.deadline - time.monotonic(), 0.0)):
            if time.monotonic() >= self.deadline:
                break
        else:
            return
        job, task = self.job, self.job.task
        silent = [f"{name} ({target}) {state}" for name, target, state in probe_tasks(task) if state != "answers"]
        where = ("; ".join(silent) if silent else
                 "every task answers, so one is stuck before its first step (see its log)")
        error = RuntimeError(
            f"{task.name} did not train a step within {job.cfg.startup_timeout:.0f} s of its start "
            f"(--startup_timeout): {where}. Check that every task of the cluster is running (its "
            "container or process, the image it runs), that nothing else listens on its port, and "
            "that the hosts reach each other; raise --startup_timeout if restoring the model takes longer.")
        print(f"tfps: error: {error}", file=sys.stderr, flush=True)
        code = ExitCode.TRAINING_FAILED
        try:
            if task.is_chief:
                job.report_untrained_failure(error, code, write_results=job.claimed)
        except Exception as e:  # noqa: BLE001 - the process ends whatever happens
            log.error("%s: could not report the failure: %s", task.name, e)
        finally:
            logging.shutdown()
            sys.stdout.flush()
            os._exit(int(code))


#: What a client sends first on an HTTP/2 (gRPC) connection, and an empty SETTINGS frame.
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def probe_task(target: str, timeout: float = 2.0) -> str:
    """"answers" if a gRPC server (a TF task) serves ``host:port``, else what is wrong there.

    A TF server answers the HTTP/2 preface with a SETTINGS frame; another program that
    holds the port (so the task could not bind it) accepts the connection and does not.
    """
    host, _, port = target.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(_H2_PREFACE)
            head = b""
            while len(head) < 9:
                chunk = s.recv(9 - len(head))
                if not chunk:
                    break
                head += chunk
    except ConnectionRefusedError:
        return "refuses connections (not running?)"
    except socket.timeout:
        return "accepts connections but is not a TensorFlow server (another program holds its port?)"
    except OSError as e:
        return f"does not answer ({e.strerror or type(e).__name__})"
    if len(head) == 9 and head[3] == 0x04:
        return "answers"
    return "accepts connections but is not a TensorFlow server (another program holds its port?)"


def probe_tasks(task, timeout: float = 2.0) -> list[tuple[str, str, str]]:
    """(name, host:port, state) of every other task of the cluster (see probe_task)."""
    return [(f"{job_name}{i}", target, probe_task(target, timeout))
            for job_name in ("ps", "worker") for i, target in enumerate(getattr(task.cluster, job_name))
            if f"{job_name}{i}" != task.name]


class Job:
    """One worker task from start to exit code."""

    def __init__(self, task, cfg: RunConfig, stop: StopSignal, started_wall: float | None = None):
        self.task, self.cfg, self.stop = task, cfg, stop
        self.started_wall = started_wall or time.time()
        self.started_iso = results.now_iso()
        self.first_step_at: float | None = None
        self.last_seen_step = 0
        self.setup: JobSetup | None = None
        self.claimed = False   # this chief owns model_dir (results.json may be written there)
        self.watchdog = StartupWatchdog(self)

    def report_untrained_failure(self, error: Exception, code: ExitCode, write_results: bool) -> None:
        """The chief's "failed" report for a job that never trained (bad input, a task that
        never started): results.json from the newest checkpoint and the message, or, when
        model_dir may not be written (another job's, or not claimed yet), the message only."""
        import tensorflow as tf
        from trainer import report
        reporter = report.Reporter(self.cfg, self.task, self.setup, self.started_iso, self.started_wall)
        if not write_results:
            reporter.notify_only("failed", int(code), error)
            return
        ckpt = tf.train.latest_checkpoint(self.cfg.model_dir)
        reporter.finished(
            status="failed", exit_code=int(code), step=int(ckpt.rsplit("-", 1)[1]) if ckpt else 0,
            checkpoint=ckpt, export_dir=None, train_summary={}, eval_metrics={}, error=error,
            times={"startup_s": round(time.time() - self.started_wall, 3), "training_s": 0.0, "final_save_s": 0.0})

    # ------------------------------------------------------------------ graph
    def build(self, setup: JobSetup):
        import tensorflow as tf
        v1 = tf.compat.v1
        cfg, task = self.cfg, self.task
        g = tf.Graph()
        ops = {}
        with g.as_default():
            v1.set_random_seed(cfg.seed)
            worker_device = f"/job:worker/task:{task.index}"
            with v1.device(v1.train.replica_device_setter(worker_device=worker_device,
                                                         cluster=cluster_spec(task))):
                global_step = v1.train.get_or_create_global_step()
                with v1.device(worker_device + "/cpu:0"):
                    ds = data_mod.make_dataset(setup.schema, cfg.label_column, cfg.batch_size,
                                               num_shards=task.num_workers, shard_index=task.index,
                                               train=True, seed=cfg.seed)
                    features, labels = v1.data.make_one_shot_iterator(ds).get_next()
                spec = setup.model_fn(features, labels, "train", setup.params)
                if spec.loss is None:
                    raise ConfigError(f"{cfg.model} returned no loss in train mode", "model")
                log.info("%s: %s", task.name, setup.optimizer_note)
                opt = _optimizer(setup)
                if cfg.sync_replicas:
                    opt = v1.train.SyncReplicasOptimizer(
                        opt, replicas_to_aggregate=cfg.replicas_to_aggregate or task.num_workers,
                        total_num_replicas=task.num_workers)
                with v1.control_dependencies(spec.update_ops):   # e.g. BatchNormalization's moving statistics
                    train_op = opt.minimize(spec.loss, global_step=global_step)
                ops["release_tokens"] = opt.get_init_tokens_op(task.num_workers) if cfg.sync_replicas else None
                ops["sync_hook"] = opt.make_session_run_hook(task.is_chief) if cfg.sync_replicas else None
            flag = stop_flag()
            ops["flag"], ops["raise_flag"] = flag, flag.assign(True)
            v1.summary.scalar("loss", spec.loss)
            for k, t in spec.metrics.items():
                v1.summary.scalar(k, t)
            ops["done"] = [done_queue(j, task.num_workers).enqueue(task.index) for j in range(task.num_ps)]
            ops.update(train_op=train_op, global_step=global_step, loss=spec.loss, metrics=spec.metrics)
        return g, ops

    # -------------------------------------------------------------- run
    def run(self) -> ExitCode:
        task, cfg = self.task, self.cfg
        import tensorflow as tf
        server = tf.distribute.Server(cluster_spec(task), job_name="worker", task_index=task.index,
                                      config=session_config(task, cfg), start=True)
        write_health(task)
        self.watchdog.start()
        try:
            return self._run(server)
        finally:
            self.watchdog.disarm()

    def _run(self, server) -> ExitCode:
        task, cfg = self.task, self.cfg
        try:
            # Bad input found here on the chief (data, model, a model_dir of another job)
            # must still end the whole job: the other tasks are already waiting for it.
            setup = self.setup = JobSetup(cfg)
            if task.is_chief:
                resuming = results.claim_model_dir(cfg.model_dir, setup.identity())
                self.claimed = True
                if resuming:
                    log.info("resuming from the newest checkpoint in %s", cfg.model_dir)
            graph, ops = self.build(setup)
        except ConfigError as e:
            print(f"tfps: error: {e}", file=sys.stderr, flush=True)
            return self._abort(server, e, ExitCode.BAD_CONFIG)
        except Exception as e:  # noqa: BLE001 - a model that raises still ends the job cleanly
            log.error("%s: building the training graph failed: %s: %s", task.name, type(e).__name__, e)
            return self._abort(server, e, ExitCode.TRAINING_FAILED)
        if task.is_chief:
            return self._run_chief(setup, server, graph, ops)
        return self._run_worker(server, graph, ops)

    def _session(self, server, graph, hooks):
        import tensorflow as tf
        v1 = tf.compat.v1
        cfg, task = self.cfg, self.task
        ProgressHook, StopFlagHook, ReleaseHook, FastCreator = _hooks_module()
        scaffold = v1.train.Scaffold(saver=v1.train.Saver(sharded=False, max_to_keep=5, save_relative_paths=True))
        progress = ProgressHook(self, {"global_step": ops_gs(graph), "loss": self.ops["loss"], **self.ops["metrics"]},
                                cfg.log_steps, cfg.batch_size, cfg.train_steps, task.is_chief, cfg.model_dir, task.name)
        all_hooks = [v1.train.StopAtStepHook(last_step=cfg.train_steps),
                     StopFlagHook(self.ops["flag"], self.ops["raise_flag"], self.stop, task.is_chief),
                     progress] + hooks
        if self.ops["sync_hook"] is not None:
            all_hooks.append(self.ops["sync_hook"])
        if task.is_chief:
            all_hooks += [
                v1.train.CheckpointSaverHook(cfg.model_dir, save_steps=cfg.checkpoint_every_steps,
                                             save_secs=cfg.checkpoint_secs, scaffold=scaffold),
                v1.train.SummarySaverHook(save_steps=cfg.summary_steps, output_dir=cfg.model_dir, scaffold=scaffold),
                v1.train.StepCounterHook(every_n_steps=cfg.summary_steps, output_dir=cfg.model_dir),
            ]
            if self.ops["release_tokens"] is not None:
                all_hooks.append(ReleaseHook(self.ops["release_tokens"]))
            creator = v1.train.ChiefSessionCreator(scaffold=scaffold, master=server.target,
                                                   config=session_config(task, cfg), checkpoint_dir=cfg.model_dir)
        else:
            creator = FastCreator(scaffold=scaffold, master=server.target, config=session_config(task, cfg))
        # stop_grace_period_secs only bounds joining queue-runner threads at close(); the
        # final checkpoint is written before that (CheckpointSaverHook.end) and the export
        # after it, so a short value cuts nothing and keeps a stuck sync queue from stalling.
        return v1.train.MonitoredSession(session_creator=creator, hooks=all_hooks, stop_grace_period_secs=3), progress

    def _train(self, server, graph):
        try:
            with graph.as_default():
                sess, progress = self._session(server, graph, [])
                with sess:
                    while not sess.should_stop():
                        sess.run(self.ops["train_op"])
            return progress
        finally:
            # A job restored at its last step trains none; its final save is not start-up.
            self.watchdog.disarm()

    def _end_rpc(self, server, graph, fetches, what: str) -> bool:
        import tensorflow as tf
        v1 = tf.compat.v1
        try:
            with v1.Session(server.target, graph=graph, config=session_config(self.task, self.cfg)) as s:
                s.run(fetches, options=v1.RunOptions(timeout_in_ms=END_RPC_TIMEOUT_MS))
            return True
        except tf.errors.OpError as e:
            log.warning("%s: could not %s: %s", self.task.name, what, e.message.splitlines()[0])
            return False

    def _send_done(self, server, graph) -> None:
        if self._end_rpc(server, graph, self.ops["done"], "tell the ps it is done"):
            log.info("%s: told %d ps task(s) it is done", self.task.name, self.task.num_ps)

    def _abort(self, server, error: Exception, code: ExitCode) -> ExitCode:
        """This task cannot train: report (chief), stop the other workers, let the ps go."""
        self.watchdog.disarm()
        import tensorflow as tf
        task = self.task
        graph = tf.Graph()
        with graph.as_default():
            flag = stop_flag()
            self.ops = {"done": [done_queue(j, task.num_workers).enqueue(task.index) for j in range(task.num_ps)]}
            raise_flag = flag.assign(True)
        if task.is_chief:
            # Bad input: model_dir may belong to another job, so only the message is sent.
            self.report_untrained_failure(error, code, write_results=code != ExitCode.BAD_CONFIG)
            self._end_rpc(server, graph, raise_flag, "ask the other workers to stop")
        self._send_done(server, graph)
        return code

    def _wait_for_chief(self, server, graph) -> bool:
        """Non-chief: poll every JOIN_POLL_SECS until the chief has initialised the model.

        Returns False when the chief gave up instead (it raised the stop flag before the
        model was ever ready, e.g. on bad input): then this worker must not wait for hours.
        """
        import tensorflow as tf
        v1 = tf.compat.v1
        with graph.as_default():
            ready = v1.report_uninitialized_variables(v1.global_variables())
        deadline = time.monotonic() + CHIEF_WAIT_SECS
        with v1.Session(server.target, graph=graph, config=session_config(self.task, self.cfg)) as s:
            while time.monotonic() < deadline and not self.stop.requested:
                try:
                    if len(s.run(ready)) == 0:
                        return True
                    self.watchdog.extend()   # the ps answered; the chief is still initialising
                except tf.errors.OpError:
                    pass
                try:
                    if s.run(self.ops["flag"]):
                        log.error("%s: the chief gave up before training started", self.task.name)
                        return False
                except tf.errors.OpError:
                    pass   # not set: the flag is uninitialised until someone writes it
                time.sleep(JOIN_POLL_SECS)
        return not self.stop.requested

    def _run_worker(self, server, graph, ops) -> ExitCode:
        self.ops = ops
        code = ExitCode.OK
        if not self._wait_for_chief(server, graph):
            if self.stop.requested:
                return ExitCode.STOPPED
            self._send_done(server, graph)
            return ExitCode.TRAINING_FAILED
        try:
            self._train(server, graph)
        except Exception as e:
            log.error("%s: training failed: %s: %s", self.task.name, type(e).__name__, e)
            code = ExitCode.TRAINING_FAILED
        if self.stop.requested:
            # Stopped by its own signal, not by the chief: this task is expected back (a
            # restart policy, an engine restart) or the ps is being stopped as well. A "done"
            # now would let the ps exit at the chief's end while this worker still trains;
            # without it the ps waits for it at most --sync_timeout after the chief.
            log.info("%s: stopped by a signal; not reporting done to the ps", self.task.name)
            return ExitCode.STOPPED if code == ExitCode.OK else code
        self._send_done(server, graph)
        return code

    def _run_chief(self, setup: JobSetup, server, graph, ops) -> ExitCode:
        import tensorflow as tf
        from trainer import export, report
        self.ops = ops
        cfg, task = self.cfg, self.task
        reporter = report.Reporter(cfg, task, setup, self.started_iso, self.started_wall)
        reporter.started()
        error = None
        progress = None
        t_train = time.time()
        try:
            progress = self._train(server, graph)
            status = "stopped" if self.stop.requested else "succeeded"
        except Exception as e:  # noqa: BLE001 - every failure must be reported
            error = e
            status = "failed"
            log.error("chief: training failed: %s: %s", type(e).__name__, e)
            self._end_rpc(server, graph, ops["raise_flag"], "ask the other workers to stop")
        t_save = time.time()
        ckpt = tf.train.latest_checkpoint(cfg.model_dir)
        ckpt_step = int(ckpt.rsplit("-", 1)[1]) if ckpt else 0
        step = max(ckpt_step, self.last_seen_step)
        export_dir = None
        eval_metrics = {}
        # A failed job keeps its checkpoints for a resume but exports nothing, unless the
        # checkpoint already reached the target (a ps lost after the last step, say).
        if ckpt and (error is None or ckpt_step >= cfg.train_steps):
            try:
                export_dir = export.export_saved_model(setup.model_fn, setup.params, ckpt, cfg.export_path,
                                                       ckpt_step)
                log.info("chief: exported the SavedModel of step %d to %s (%.1f s)", ckpt_step, export_dir,
                         time.time() - t_save)
                if setup.eval_schema is not None:
                    eval_metrics = export.evaluate(
                        setup.model_fn, setup.params, ckpt,
                        lambda: data_mod.make_dataset(setup.eval_schema, cfg.label_column, 256, train=False))
                    log.info("chief: evaluation of step %d: %s", ckpt_step, eval_metrics)
            except Exception as e:  # noqa: BLE001
                log.error("chief: final export failed: %s: %s", type(e).__name__, e)
                if error is None:
                    error, status = e, "failed"
        elif not ckpt and error is None:
            error, status = RuntimeError(f"no checkpoint was written to {cfg.model_dir}"), "failed"
        t_end = time.time()
        code = {"succeeded": ExitCode.OK, "stopped": ExitCode.STOPPED}.get(status, ExitCode.TRAINING_FAILED)
        reporter.finished(status=status, exit_code=int(code), step=step, checkpoint=ckpt, export_dir=export_dir,
                          train_summary=progress.summary() if progress else {}, eval_metrics=eval_metrics,
                          error=error, times={
                              "startup_s": round((self.first_step_at or t_train) - self.started_wall, 3),
                              "training_s": round(t_save - (self.first_step_at or t_train), 3),
                              "final_save_s": round(t_end - t_save, 3)})
        self._send_done(server, graph)
        self._wait_for_ps_exit()
        return code

    def _wait_for_ps_exit(self) -> None:
        """Exit last: give the ps tasks (which exit once every worker is done) a moment to go.

        An orchestrator that watches only the chief (``docker compose up --exit-code-from
        worker-0``, the Ansible play) stops whatever still runs when the chief exits; a
        worker finishing its last step a moment after the chief would then be stopped
        instead of ending by itself. Bounded, so a worker that never reports cannot hold
        the chief, and well inside the grace that follows a stop request.
        """
        deadline = time.monotonic() + PS_EXIT_WAIT_SECS
        for target in self.task.cluster.ps:
            host, _, port = target.rpartition(":")
            while time.monotonic() < deadline:
                try:
                    with socket.create_connection((host.strip("[]"), int(port)), timeout=1):
                        pass
                except OSError:
                    break   # refused or no longer resolvable: this ps has exited
                time.sleep(0.2)
            else:
                log.info("chief: ps at %s still runs %.0f s after the final save; exiting anyway",
                         target, PS_EXIT_WAIT_SECS)
                return


def ops_gs(graph):
    import tensorflow as tf
    return tf.compat.v1.train.get_global_step(graph)


def host_name() -> str:
    return os.environ.get("TFPS_HOST") or socket.gethostname()


def format_error(error: BaseException | None) -> dict | None:
    if error is None:
        return None
    tb = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    message = getattr(error, "message", None) or str(error)
    return {"type": type(error).__name__, "message": message.strip().splitlines()[0] if message else "",
            "traceback_tail": "\n".join(tb.strip().splitlines()[-15:])}
