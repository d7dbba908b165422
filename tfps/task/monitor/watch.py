"""The chief's watch over a running job: stalls, progress messages, workers that came back.

A thread of the chief reads every worker's board on ps 0 (tfps.task.monitor.board) every
``POLL_SECS`` with a session of its own, so that nothing here ever waits inside a training
step. From what it reads it

* sends one "stalled" message when a worker, or the whole job, has made no progress for
  ``--stall_timeout`` seconds (one per stall), and says in the next message when it resumed;
* sends a "progress" message at most every ``--notify_every`` seconds;
* adds every death of a task's process to the job's story (tfps.outcome.journal): each
  task's ledger (tfps.task.monitor.board) holds the deaths its ``tfps run --restarts`` supervisor
  saw; a worker started again without one (by hand, by a restart policy) is noticed by its
  board naming a new start;
* keeps per-worker figures (steps trained, examples/s) for results.json;
* sums the workers' windows of progressive scores (tfps.task.monitor.progressive) into the job's:
  ``progressive``, shown on the status line and in the progress messages, written as the
  TensorBoard run ``progressive`` (at most every --summary_steps global steps) and, as the
  last read leaves it, into results.json.

Messages are sent from this thread (bounded in time by the Notifier), never from the
training loop; the chief stops the thread before its final message, so that no progress
message follows the final one. A stall never fails the job: ``--sync_timeout`` and
``--startup_timeout`` bound failures.
"""

from __future__ import annotations

import logging
import threading
import time

from tfps import timeouts
from tfps.cluster.spec import WORKER, task_name
from tfps.errors import error_chain
from tfps.outcome import journal, results
from tfps.outcome.contract import Progressive, Stall, WorkerFigures, has_total, parse
from tfps.task.monitor import progressive as progressive_mod
from tfps.task.monitor.board import read_ledgers
from tfps.task.runtime.session import session_config

log = logging.getLogger("tfps")

#: Seconds between two reads of the boards, and the bound on one read (tfps.timeouts).
POLL_SECS = timeouts.WATCH_POLL_SECS
READ_TIMEOUT_MS = timeouts.WATCH_READ_TIMEOUT_MS
#: The global steps/s behind the ETA are measured over this many seconds.
RATE_WINDOW_SECS = 60.0


def read_step(sess, step_tensor, options) -> int:
    """The global step, 0 while it cannot be read (its ps away)."""
    import tensorflow as tf
    try:
        return int(sess.run(step_tensor, options=options))
    except tf.errors.OpError:
        return 0


class _RenewedSession:
    """A session of the watch that notes when a read failed for another reason than a variable
    not written yet (FailedPrecondition): a ps gone or started again. The watch then opens a
    new one."""

    def __init__(self, sess):
        self.sess, self.stale = sess, False

    def __enter__(self) -> _RenewedSession:
        return self

    def __exit__(self, *exc) -> None:
        self.sess.close()

    def run(self, *args, **kwargs):
        import tensorflow as tf
        try:
            return self.sess.run(*args, **kwargs)
        except tf.errors.FailedPreconditionError:
            raise
        except tf.errors.OpError:
            self.stale = True
            raise


class _WatchedWorker:
    """What the chief knows of one worker's progress."""

    def __init__(self, name: str):
        self.name = name
        self.started: float | None = None       # start (wall) of its current process
        self.steps_before = 0                    # steps of its earlier processes
        self.local_steps = 0
        self.global_step = 0
        self.dropped_before = 0                  # stale gradients of its earlier processes
        self.dropped = 0                         # ... and of its current one
        self.changed_at = time.monotonic()       # the chief's clock: when its steps last moved
        self.changed_wall = time.time()
        self.rate_from: tuple[float, int] | None = None
        self.rate = 0.0                          # steps/s of its current process
        self.stalled_since: float | None = None  # wall time, while a stall is open

    @property
    def steps(self) -> int:
        return self.steps_before + self.local_steps


def sync_wait_line(workers: list, now: float) -> str:
    """Who a sync step that never ended waited for, from the boards as last read.

    A worker that sent its gradients for the step the job stands at has reached that global
    step on its board; one whose board stands lower did not send them. When every board
    stands at the same step (boards are written about once a second, so a fast step can
    hide who is behind), each worker is named with when its steps last moved."""
    seen = [w for w in workers if w.started is not None]
    if not seen:
        return "no worker has reported a step yet"
    top = max(w.global_step for w in seen)
    behind = sorted((w for w in seen if w.global_step < top), key=lambda w: (w.global_step, w.name))
    if behind:
        return "the gradients of " + ", ".join(
            f"{w.name} (its last step at global step {w.global_step}, {max(now - w.changed_at, 0):.0f} s ago)"
            for w in behind) + " did not arrive"
    return "last seen: " + ", ".join(
        f"{w.name} at global step {w.global_step}, {max(now - w.changed_at, 0):.0f} s ago"
        for w in sorted(seen, key=lambda w: (w.changed_at, w.name)))


def is_step_timeout(error: BaseException | None) -> bool:
    """Whether ``error`` is a step that ran past ``operation_timeout_in_ms`` (--sync_timeout)."""
    import tensorflow as tf

    return any(isinstance(e, tf.errors.DeadlineExceededError) for e in error_chain(error))


class SyncTimeout(RuntimeError):
    """A sync step that waited past --sync_timeout, naming the workers it waited for."""


class JobWatch:
    """The chief's watch thread (see the module docstring)."""

    def __init__(self, chief, server, graph, board, global_step, reporter):
        self.chief, self.server, self.graph, self.board = chief, server, graph, board
        self.step_tensor = global_step
        self.reporter = reporter
        cfg = chief.cfg
        self.stall_timeout = cfg.stall_timeout
        self.notify_every = cfg.notify_every
        self.batch_size, self.train_steps = cfg.batch_size, cfg.train_steps
        self.sync = cfg.sync_replicas
        self.workers = [_WatchedWorker(task_name(WORKER, i)) for i in range(chief.task.num_workers)]
        self.job_step, self.job_changed_at, self.job_changed_wall = 0, time.monotonic(), time.time()
        self.job_stalled_since: float | None = None
        self.stalls: list[dict] = []      # every stall, for results.json
        self.pending: list[str] = []      # "resumed" lines for the next message
        self.last_progress = time.monotonic()
        self.samples: list[tuple[float, int]] = []   # (time, global step) of the last RATE_WINDOW_SECS
        self.failures: dict[str, str] = {}   # worker -> why it failed (its own words, from the board)
        self.progressive: dict | None = None  # the job's window of progressive scores, as last read
        self.progressive_run = progressive_mod.SummaryRun(cfg.model_dir)
        self.summary_steps = cfg.summary_steps
        self.progressive_written: int | None = None   # the global step of the run's last point
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tfps-watch", daemon=True)

    def sync_timeout(self, error: BaseException, step: int, timeout: float, silent: list | None = None) -> SyncTimeout:
        """``error`` (a sync step past ``operation_timeout_in_ms``) as one line that names the
        workers whose gradients did not arrive, or when each was last seen; ``silent``, the
        tasks that do not answer (``watchdog.probe_tasks``), come first: the likely cause."""
        lost = "; ".join(f"{name} ({target}) {state}" for name, target, state in silent or [])
        timed_out = SyncTimeout(
            f"no sync step ended within --sync_timeout ({timeout:.0f} s) at global step {step}: "
            f"{lost + '; ' if lost else ''}{sync_wait_line(self.workers, time.monotonic())}. A worker that "
            "sends no gradients holds every step: read its log, or give --backup_workers so that a step "
            "goes on without the slowest")
        timed_out.__cause__ = error   # TensorFlow's own words stay in results.json's traceback_tail
        return timed_out

    # ------------------------------------------------------------------ control
    def start(self) -> JobWatch:
        self._thread.start()
        return self

    def stop(self, timeout: float) -> None:
        """End the thread; a message being sent finishes first (the Notifier bounds it)."""
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        import tensorflow as tf

        v1 = tf.compat.v1
        options = v1.RunOptions(timeout_in_ms=READ_TIMEOUT_MS)
        try:
            # A session whose ps was started again fails every read of it from then on: the
            # watch opens a new one (it was blind to every restart after the first lost ps).
            while not self._stop.is_set():
                with _RenewedSession(v1.Session(self.server.target, graph=self.graph,
                                                config=session_config(self.chief.task, self.chief.cfg))) as sess:
                    while not sess.stale and not self._stop.wait(POLL_SECS):
                        step = self._read_step(sess, options)
                        self._read_progressive(sess, options, step)
                        self.observe(self._read(sess, options), time.monotonic(), time.time(), step)
                        self._read_ledgers(sess, options)
                        if self._read_failures(sess, options):
                            self._stop_the_job(sess, options)
                    if sess.stale:
                        log.debug("chief: the watch opens a new session (a ps it read was started again?)")
            # The final figures: the boards as the workers' last steps left them.
            with _RenewedSession(v1.Session(self.server.target, graph=self.graph,
                                            config=session_config(self.chief.task, self.chief.cfg))) as sess:
                self._update_all(self._read(sess, options), time.monotonic(), time.time())
                self._read_progressive(sess, options, max([self.job_step] + [w.global_step for w in self.workers]),
                                       final=True)
                self._read_failures(sess, options)
                self._read_ledgers(sess, options)
            self.write_status(time.monotonic(), time.time(), phase="final save")
        except Exception as e:  # noqa: BLE001 - the watch never ends the job
            log.warning("chief: the job watch stopped: %s: %s", type(e).__name__, e)
        finally:
            self.progressive_run.close()

    def _read(self, sess, options) -> list:
        return self.board.read_all(sess, options)

    def _read_progressive(self, sess, options, step: int, final: bool = False) -> None:
        """The job's window: every worker's summary on ps 0 (one not written yet, or while ps 0 is
        away, is left out), summed; a point of the TensorBoard run every --summary_steps steps."""
        import tensorflow as tf
        window = getattr(getattr(self.chief, "ops", None), "progressive", None)
        reads = getattr(self.board, "read_progressive", None)
        if window is None or not reads:
            return
        vectors = []
        for read in reads:
            try:
                vectors.append(sess.run(read, options=options))
            except tf.errors.OpError:
                continue
        figures = window.figures(vectors)
        if not figures or not figures.get("examples"):
            return
        self.progressive = {**figures, "step": int(step)}
        due = self.progressive_written is None or step >= self.progressive_written + self.summary_steps
        if (due or final) and step != self.progressive_written:
            try:
                self.progressive_run.write(step, figures)
                self.progressive_written = step
            except Exception as e:  # noqa: BLE001 - the summaries are a view: never a failure
                log.debug("chief: the progressive TensorBoard run was not written: %s", e)

    def _read_ledgers(self, sess, options) -> None:
        """Every task's deaths into the job's story (each once, tfps.outcome.journal.Story.died)."""
        for name, text in read_ledgers(self.board, sess, options).items():
            deaths = journal.parse_deaths(text)
            if deaths and name != self.chief.task.name:   # the chief's own: from its environment
                new = self.chief.story.died(name, deaths, self.job_step)
                if new:
                    log.warning("chief: %s: %d process(es) of it died (%s); the job goes on", name, new,
                                journal.signal_cause(deaths[-1]["signal"]))

    def _read_failures(self, sess, options) -> bool:
        """Read why workers failed (tfps.task.monitor.board); True when one failed since the last look."""
        import tensorflow as tf
        new = False
        for w, read in zip(self.workers, getattr(self.board, "read_errors", [])):
            if w.name == self.chief.task.name or w.name in self.failures:
                continue
            try:
                text = sess.run(read, options=options)
            except tf.errors.OpError:
                continue   # not written: the worker has not failed (or ps 0 is away)
            text = text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)
            if text:
                self.failures[w.name] = text
                log.error("chief: %s failed: %s; the job fails", w.name, text)
                new = True
        return new

    def _stop_the_job(self, sess, options) -> None:
        """A worker failed: every worker stops (the chief's stop flag), the chief saves and reports."""
        import tensorflow as tf
        raise_flag = getattr(getattr(self.chief, "ops", None), "raise_flag", None)
        if raise_flag is None:
            return
        try:
            sess.run(raise_flag, options=options)
        except tf.errors.OpError as e:
            log.warning("chief: could not ask the workers to stop: %s", e.message.splitlines()[0] if e.message else e)

    def _read_step(self, sess, options) -> int:
        return read_step(sess, self.step_tensor, options)

    # ------------------------------------------------------------------ one look
    def _update_all(self, boards: list, now: float, wall: float) -> None:
        for w, b in zip(self.workers, boards):
            if b is not None:
                self._update(w, b, now, wall)

    def observe(self, boards: list, now: float, wall: float, global_step: int = 0) -> None:
        self._update_all(boards, now, wall)
        step = max([global_step, self.chief.last_seen_step] + [w.global_step for w in self.workers])
        if step != self.job_step or not any(w.started is not None for w in self.workers):
            # Before the first board the job is starting (--startup_timeout bounds that), not stalled.
            self.job_step, self.job_changed_at, self.job_changed_wall = step, now, wall
        self.samples = [x for x in self.samples if now - x[0] <= RATE_WINDOW_SECS][-100:] + [(now, step)]
        feeder = getattr(self.chief, "feeder", None)
        if feeder is not None and feeder.caught_up:
            # A followed job that trained every partition waits for the next: not a stall of its
            # tasks (the feeder tells when no partition came for --stall_timeout).
            self.job_changed_at, self.job_changed_wall = now, wall
            for w in self.workers:
                if w.stalled_since is None:
                    w.changed_at, w.changed_wall = now, wall
        self._check_stalls(now, wall)
        self.write_status(now, wall)
        if self.notify_every and now - self.last_progress >= self.notify_every:
            self.last_progress = now
            self._send("progress", self.progress(now, wall))

    def _update(self, w: _WatchedWorker, b: list, now: float, wall: float) -> None:
        local_steps, global_step, started, sig = int(b[0]), int(b[1]), b[2], int(b[3])
        dropped = int(b[4]) if len(b) > 4 else 0
        if w.started is not None and abs(started - w.started) > 1e-3:
            # A new process of this worker: its predecessor failed and it came back (the
            # chief's own restarts are in the journal: its first look finds its predecessor's board).
            w.steps_before += w.local_steps
            w.dropped_before += w.dropped
            w.local_steps, w.rate_from, w.dropped = 0, None, 0
            if w.name != self.chief.task.name and not sig:
                # Without a supervisor's account (its ledger tells the rest): started again by
                # hand, or by a container's restart policy.
                cause = "restarted (cause unknown)"
                log.warning("chief: %s was started again (%s); it rejoined at global step %d", w.name, cause,
                            global_step)
                self.chief.story.restart(w.name, cause, started, global_step, 0)
        w.started = started
        w.dropped = max(w.dropped, dropped)
        if local_steps != w.local_steps or w.rate_from is None:
            if w.rate_from is None:
                w.rate_from = (now, local_steps)
            elif now > w.rate_from[0]:
                w.rate = (local_steps - w.rate_from[1]) / (now - w.rate_from[0])
            w.local_steps, w.global_step = local_steps, max(global_step, w.global_step)
            w.changed_at, w.changed_wall = now, wall
            if w.stalled_since is not None:
                self._resumed(w.name, w.stalled_since, wall, w.global_step)
                w.stalled_since = None

    def _resumed(self, name: str, since: float, wall: float, step: int) -> None:
        line = f"{name} resumed at step {step} after {wall - since:.0f} s without progress"
        log.info("chief: %s", line)
        self.pending.append(line)
        for s in self.stalls:
            if s["task"] == name and s.get("resumed_at") is None:
                s["resumed_at"] = journal.iso(wall)

    def _check_stalls(self, now: float, wall: float) -> None:
        if not self.stall_timeout or self.job_step >= self.train_steps or self.chief.stop.requested:
            return
        new = []
        for w in self.workers:
            if w.started is not None and w.stalled_since is None and now - w.changed_at >= self.stall_timeout:
                w.stalled_since = w.changed_wall
                new.append({"task": w.name, "last_step": w.global_step, "since": journal.iso(w.changed_wall)})
        if self.job_stalled_since is None and now - self.job_changed_at >= self.stall_timeout:
            self.job_stalled_since = self.job_changed_wall
            new.append({"task": "the job", "last_step": self.job_step, "since": journal.iso(self.job_changed_wall)})
        elif self.job_stalled_since is not None and now - self.job_changed_at < self.stall_timeout:
            self._resumed("the job", self.job_stalled_since, wall, self.job_step)
            self.job_stalled_since = None
        if new:
            self.stalls += new
            names = ", ".join(f"{s['task']} (at step {s['last_step']} since {s['since']})" for s in new)
            log.warning("chief: no progress for %.0f s (--stall_timeout): %s", self.stall_timeout, names)
            self._send("stalled", {**self.progress(now, wall), "stalled": new,
                                   "stall_timeout": self.stall_timeout})

    # ------------------------------------------------------------------ figures
    def per_worker(self) -> dict:
        """results.json's ``workers``: steps trained and examples/s of each worker."""
        return {w.name: {"steps": w.steps, "examples_per_sec": round(w.rate * self.batch_size, 1),
                         **({"dropped_gradients": w.dropped_before + w.dropped} if self.sync else {})}
                for w in self.workers if w.started is not None}

    def progress(self, now: float, wall: float) -> dict:
        res = {**self.reporter.base(), "status": "running", "global_step": self.job_step,
               "started_at": journal.iso(self.chief.story.first_start()),
               "duration_s": round(wall - self.chief.story.first_start(), 3)}
        publisher = self.chief.publisher   # created with the chief's session
        latest = dict(publisher.latest) if publisher is not None else {}
        loss = latest.pop("loss", None)
        if loss is not None:
            res["loss"] = float(loss)
        res["metrics"] = {k: float(v) for k, v in latest.items()}
        res["examples_per_sec"] = round(sum(w.rate for w in self.workers) * self.batch_size, 1)
        t0, s0 = self.samples[0] if self.samples else (now, self.job_step)
        if now > t0 and self.job_step > s0 and has_total(self.train_steps):
            rate = (self.job_step - s0) / (now - t0)
            res["eta_s"] = round(max(self.train_steps - self.job_step, 0) / rate, 1)
        res["workers"] = self.per_worker()
        if self.progressive:
            res["progressive"] = dict(self.progressive)
        stalled = [w.name for w in self.workers if w.stalled_since is not None]
        if stalled:
            res["stalled_tasks"] = stalled
        return res

    def status(self, now: float, wall: float, phase: str = "training") -> dict:
        """The job as it runs, for status.json (``tfps local``'s status line): the global step,
        the chief's smoothed loss and running metrics, the total examples/s, the ETA, and each
        worker's examples/s and how long since its steps last moved (``idle_s``)."""
        publisher = self.chief.publisher
        latest = dict(publisher.latest) if publisher is not None else {}
        latest.pop("loss", None)
        out = {"time": round(wall, 3), "phase": phase, "step": int(self.job_step), "train_steps": self.train_steps,
               "metrics": {k: float(v) for k, v in latest.items()},
               "examples_per_sec": round(sum(w.rate for w in self.workers) * self.batch_size, 1),
               "workers": {w.name: {"steps": w.steps, "global_step": w.global_step,
                                    "idle_s": round(max(now - w.changed_at, 0.0), 1),
                                    "examples_per_sec": round(w.rate * self.batch_size, 1)}
                           for w in self.workers if w.started is not None}}
        smoothed = getattr(self.chief, "smoothed_loss", None)
        if smoothed is not None:
            out["loss"] = float(smoothed)
        if self.progressive:
            out["progressive"] = dict(self.progressive)
        t0, s0 = self.samples[0] if self.samples else (now, self.job_step)
        if now > t0 and self.job_step > s0 and has_total(self.train_steps):   # a followed job has no ETA
            out["eta_s"] = round(max(self.train_steps - self.job_step, 0) / ((self.job_step - s0) / (now - t0)), 1)
        return out

    def write_status(self, now: float, wall: float, phase: str = "training", step: int | None = None) -> None:
        """status.json; ``step``: the job's final step as reported (its checkpoint's)."""
        try:
            if step is None:
                self.job_step = max([self.job_step, self.chief.last_seen_step] + [w.global_step for w in self.workers])
            status = self.status(now, wall, phase)
            if step is not None:
                status.update(step=int(step), eta_s=0.0)
            results.write_status(self.chief.cfg.model_dir, status)
        except Exception as e:  # noqa: BLE001 - the status line is a view: never a failure of the job
            log.debug("chief: status.json not written: %s", e)

    def summary(self) -> dict:
        """What the final report adds (``Reporter.finished``'s keywords): per-worker figures,
        the stalls, resumptions not yet told."""
        return {"workers": {name: parse(WorkerFigures, w, f"workers.{name}") for name, w in self.per_worker().items()},
                "stalls": [parse(Stall, s, "stalls") for s in self.stalls],
                "resumed": self.take_pending(),
                "progressive": parse(Progressive, self.progressive, "progressive") if self.progressive else None}

    def take_pending(self) -> list[str]:
        out, self.pending = self.pending, []
        return out

    def send_note(self, event: str, line: str) -> None:
        """A message of the job's figures and one line (the stream's: a partition skipped, late)."""
        res = self.progress(time.monotonic(), time.time())
        res["note"] = line
        self._send(event, res)

    def _send(self, event: str, res: dict) -> None:
        lines = self.take_pending()
        if lines:
            res["resumed"] = lines
        self.reporter.send_event(event, res)
