"""The chief's report of a job: results.json, the plots (loss.png, metrics.png) and the one notification.

Exactly one completion message per job: the chief sends it after the final save. If the
chief dies without one, the orchestrator (``tfps local``, Ansible) sends the failure
message instead, using ``tfps.notify.orphan_failure``. Notification URLs live only in the
Notifier, which the chief hands to ``Reporter`` (tfps.notify sits above this package and
is never imported here); nothing here writes them anywhere.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import socket
import time
import traceback

from tfps.errors import disk_full_line, is_disk_full
from tfps.outcome import journal, plot, results
from tfps.outcome.contract import IMAGE_ENV, ErrorInfo, JobResult, Restart, ResultsError, Times, Versions, parse

log = logging.getLogger("tfps")


def host_name() -> str:
    """The host a task runs on, as people know it (``TFPS_HOST`` set by the orchestrator)."""
    return os.environ.get("TFPS_HOST") or socket.gethostname()


def image_id() -> str | None:
    """The id of the image the task runs in (``TFPS_IMAGE_ID`` set by the orchestrator), or None."""
    return os.environ.get(IMAGE_ENV) or None


def slurm_job() -> str | None:
    """The Slurm job this task runs in (``SLURM_JOB_ID``, and how often Slurm requeued it), or None."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return None
    restarts = os.environ.get("SLURM_RESTART_COUNT", "0")
    return job if restarts in ("", "0") else f"{job} (requeued {restarts}x)"


def format_error(error: BaseException | None) -> ErrorInfo | None:
    """An exception as results.json and the message show it: type, first line, traceback tail."""
    if error is None:
        return None
    tb = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return ErrorInfo(type=type(error).__name__, message=error_line(error),
                     traceback_tail="\n".join(tb.strip().splitlines()[-15:]))


#: TensorFlow's lines around the real message of an error raised while a graph runs.
_TF_NOISE = re.compile(r"^(Graph execution error:|Detected at node |Detected unsupported operations|File \"|"
                       r"\[\[|Original stack trace|Node: |\d+ root error\(s\) found|\d+ successful operations|"
                       r"\d+ derived errors ignored|=+$|Additional GRPC error information|:UNKNOWN:|Recorded at "
                       r"|Aborting RPC|Executing non-communication op)")
#: What TensorFlow puts before the real message on its line: "(0) ", a status code
#: ("INVALID_ARGUMENT: "), the task that raised it ("From /job:ps/replica:0/task:0:").
_TF_CODES = ("CANCELLED|UNKNOWN|INVALID_ARGUMENT|DEADLINE_EXCEEDED|NOT_FOUND|ALREADY_EXISTS|PERMISSION_DENIED|"
             "RESOURCE_EXHAUSTED|FAILED_PRECONDITION|ABORTED|OUT_OF_RANGE|UNIMPLEMENTED|INTERNAL|UNAVAILABLE|"
             "DATA_LOSS|UNAUTHENTICATED")
_TF_ERROR_PREFIX = re.compile(rf"^(?:\(\d+\) )?(?:(?:{_TF_CODES}): )?")
_TF_FROM = re.compile(r"^From /job:(\w+)/replica:\d+/task:(\d+):\s*")
_TF_NODE_SUFFIX = re.compile(r"\s*\[\[\{\{node ([^}]*)\}\}\]\]\s*$")
_TF_NODE_LINE = re.compile(r"^\[\[\{\{node ([^}]*)\}\}\]\]")


def _is_tensorflow_text(first: str) -> bool:
    return (first.startswith("Graph execution error") or bool(re.match(r"^\d+ root error\(s\) found", first))
            or _TF_ERROR_PREFIX.match(first).end() > 0 or bool(_TF_FROM.match(first)))


def _origin(lines: list[str]) -> str | None:
    """The task an error came from: a worker relays a ps's error ("From /job:worker/...", then
    "From /job:ps/..."), so a ps named anywhere is the origin."""
    tasks = [m.group(1) + m.group(2) for m in (_TF_FROM.match(_TF_ERROR_PREFIX.sub("", ln)) for ln in lines) if m]
    return next((t for t in tasks if t.startswith("ps")), tasks[0] if tasks else None)


def _cause(lines: list[str]) -> tuple[str, str | None, str | None]:
    """(the real message, the task that raised it, the node named after it) of TensorFlow's lines."""
    task = _origin(lines)
    for i, ln in enumerate(lines):
        if _TF_NOISE.match(ln) or ln.startswith("in "):
            continue
        ln = _TF_ERROR_PREFIX.sub("", ln)
        m = _TF_FROM.match(ln)
        if m:
            ln = ln[m.end():]
        node = _TF_NODE_SUFFIX.search(ln)
        ln = _TF_NODE_SUFFIX.sub("", ln).strip()
        if not ln:
            continue
        if node is None and i + 1 < len(lines):
            node = _TF_NODE_LINE.match(lines[i + 1])
        return ln, task, node.group(1) if node else None
    return "", task, None


def error_line(error: BaseException) -> str:
    """The first meaningful line of an exception, for results.json, the summary and the message.

    An error raised while a graph runs (a TensorFlow ``OpError`` from ``session.run``) begins
    with "Graph execution error:", then the Python frames where the failing op was defined;
    the real message comes after the ``Node: '...'`` line, often behind a status code and the
    task that raised it ("INVALID_ARGUMENT: From /job:ps/replica:0/task:0:" on a line of its
    own: what results.json once said of an out-of-range ``tf.gather``). That line is kept,
    with the op that raised it, the op's inputs and the ps it ran on named:
    ``indices[3] = 99 is not in [0, 10) (op 'Gather' of type ResourceGather, inputs 'table',
    'Const', on ps0)``.
    """
    message = (getattr(error, "message", None) or str(error) or "").strip()
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    if not lines:
        return ""
    if not _is_tensorflow_text(lines[0]):
        return lines[0]
    node = None
    for ln in lines:
        m = re.match(r"^(?:Node: |Detected at node )'([^']+)'", ln)
        if m:
            node = node or m.group(1)
    text, task, named = _cause(lines)
    node_def = getattr(error, "node_def", None)
    # Where the op was placed names the task that ran it; which "From /job:..." lines the
    # message carries varies from run to run (the relaying worker's, the ps's, or both).
    placed = re.search(r"/job:(\w+)(?:/replica:\d+)?/task:(\d+)", str(getattr(node_def, "device", "") or ""))
    task = placed.group(1) + placed.group(2) if placed else task
    name = getattr(node_def, "name", "") or node or named
    where = ""
    if name:
        op_type = getattr(node_def, "op", "")
        inputs = [i for i in getattr(node_def, "input", []) if not str(i).startswith("^")]
        where = (f"op '{name}'" + (f" of type {op_type}" if op_type and op_type != name else "")
                 + (f", input{'s' if len(inputs) > 1 else ''} {', '.join(repr(str(i)) for i in inputs[:3])}"
                    + (" ..." if len(inputs) > 3 else "") if inputs else ""))
    if task:
        where = f"{where}, on {task}" if where else f"on {task}"
    if not text:
        return f"TensorFlow raised at {where}" if where else lines[0]
    return f"{text} ({where})" if where else text


def job_config(cfg, setup=None) -> dict:
    """results.json's ``config``: every setting of the job as the chief ran it.

    All of RunConfig's fields except the notification URLs (they hold passwords), with
    what the chief resolved in place of a default: the optimizer and learning rate as used
    (a flag, the Keras model's compile(), or tfps's default; ``optimizer_note`` says
    which), the export directory, the number of classes and the examples' shape."""
    config = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "notify"}
    # What the user changed: the settings that differ from tfps's defaults (for the message).
    defaults = dataclasses.asdict(type(cfg)())
    config["changed"] = {k: v for k, v in config.items()
                         if k not in ("notify_config", "model_dir", "export_dir", "run_name") and v != defaults.get(k)}
    config.update(run_name=cfg.name, export_dir=cfg.export_path, model_dir=os.path.abspath(cfg.model_dir),
                  checkpoint_every_steps=cfg.checkpoint_every_steps)
    if setup is not None:
        config.update(optimizer=setup.optimizer, learning_rate=setup.learning_rate,
                      optimizer_note=setup.optimizer_note, num_classes=setup.schema.num_classes,
                      feature_shape=list(setup.schema.feature_shape), train_data=setup.train_glob,
                      eval_data=setup.eval_glob)
    return config


#: The keys of a record that name the job: the head of every message (started, progress).
HEAD_KEYS = ("job", "model", "mode", "task", "host", "cluster", "train_steps", "batch_size", "train_data",
             "eval_data", "model_dir", "started_at", "image", "slurm_job")


class Reporter:
    """The chief's report of one job: the "started" message, then results.json and the end message.

    ``notifier``: what sends the messages (``tfps.notify.job_notifier``), or None for none."""

    def __init__(self, cfg, task, setup, started_iso: str, started_wall: float, story=None, notifier=None):
        self.cfg, self.task, self.setup = cfg, task, setup
        self.started_iso, self.started_wall = started_iso, started_wall
        self.story = story   # tfps.outcome.journal.Story: the job's first start and its restarts
        if story is not None:
            self.started_wall = story.first_start()
            self.started_iso = journal.iso(self.started_wall)
        self.notifier = notifier
        self.versions = Versions.current()
        self.plotted = False

    def record(self, status: str, **fields) -> JobResult:
        """A JobResult of this job with ``status``: its head (what ran, where, since when) and ``fields``."""
        cfg, task = self.cfg, self.task
        return JobResult(
            job=cfg.name, status=status, model=cfg.model, mode="sync" if cfg.sync_replicas else "async",
            task=task.name, host=host_name(), cluster=task.cluster.as_dict(),
            train_steps=cfg.train_steps, batch_size=cfg.batch_size,
            train_data=self.setup.train_glob if self.setup else cfg.train_data,
            eval_data=self.setup.eval_glob if self.setup else cfg.eval_data,
            model_dir=os.path.abspath(cfg.model_dir), started_at=self.started_iso, image=image_id(),
            slurm_job=slurm_job(),
            config=job_config(cfg, self.setup), versions=self.versions, **fields)

    def base(self) -> dict:
        """The head of every message during the job (started, progress, stalled)."""
        head = self.record("running").to_dict()
        return {k: head[k] for k in HEAD_KEYS if k in head}

    def started(self) -> None:
        if self.story is not None and self.story.attempt > 0:
            return   # a restarted chief: the job started once, and said so then
        if self.cfg.notify_started and self.notifier is not None and self.notifier.enabled:
            self.notifier.send("started", {**self.base(), "status": "started"})

    def notify_only(self, status: str, exit_code: int, error: BaseException) -> None:
        """The message for a job that ended before it had anything to write (bad input)."""
        res = self.record(status, exit_code=exit_code, ended_at=results.now_iso(),
                          duration_s=round(time.time() - self.started_wall, 3), global_step=0,
                          error=format_error(error))
        if self.notifier is not None and self.notifier.enabled:
            self.notifier.send(status, res)

    def send_event(self, event: str, res: dict) -> None:
        """A message during the job (progress, stalled): from the chief's watch thread."""
        if self.notifier is not None and self.notifier.enabled:
            self.notifier.send(event, res)

    def send_budget(self) -> float:
        """Seconds one message may take at most (the Notifier's bound), plus a margin."""
        return (self.notifier.timeout if self.notifier is not None else 0.0) + 5.0

    def finished(self, *, status, exit_code, step, checkpoint, export_dir, train_summary, eval_metrics,
                 error, times, workers=None, stalls=(), resumed=(), ps_shares_mb=None,
                 lost_tasks=(), defer_plots=False, ended_by=None, progressive=None, stream=None) -> JobResult:
        """Write results.json (the one writer of the chief's record), draw the plots and send the
        end message. ``defer_plots``: when no message needs them, the caller draws the plots
        later (``draw_plots``: matplotlib takes seconds, which the ps need not wait for)."""
        ended = time.time()
        summary = dict(train_summary or {})
        final_loss = summary.pop("loss", None)
        res = self.record(
            status, exit_code=exit_code, ended_at=results.now_iso(), duration_s=round(ended - self.started_wall, 3),
            global_step=step, final_loss=final_loss, metrics=summary, eval_metrics=dict(eval_metrics or {}),
            times=Times(**times), checkpoint=checkpoint, export_dir=export_dir,
            export_complete=bool(export_dir and results.export_complete(export_dir)),
            workers=dict(workers or {}), stalls=list(stalls), resumed=list(resumed),
            ps_shares_mb=dict(ps_shares_mb or {}), lost_tasks=list(lost_tasks), error=format_error(error),
            ended_by=ended_by, progressive=progressive, stream=stream)
        if self.story is not None:
            res.restarts = [parse(Restart, r, "restarts") for r in self.story.restarts()]
            res.attempt_started_at = journal.iso(self.story.started_wall)
            res.attempts = self.story.attempt + 1
        path = os.path.join(self.cfg.model_dir, results.RESULTS)
        try:
            res.save(path)
        except OSError as e:
            # A full disk (or a lost mount): the message needs no disk and still goes out,
            # with the job's outcome in its text.
            log.error("chief: job %s %s at step %d, but %s", res.job, status, step, _unwritable(path, e))
            if self.notify(res):
                log.info("chief: %s", results.SENT_WITHOUT_RESULTS)
            return res
        if self.story is not None:
            try:
                self.story.end(status)   # the next run in this model_dir tells a story of its own
            except OSError as e:
                log.warning("chief: the job's story in %s could not be ended: %s", self.cfg.model_dir,
                            e.strerror or e)
        after = f" after its {self.cfg.epochs} epoch(s)" if ended_by == "epochs" else ""
        log.info("chief: job %s %s at step %d%s; results in %s", res.job, status, step, after, path)
        try:
            res = JobResult.load(path)   # the message tells what the file says
        except (OSError, ResultsError) as e:
            log.error("chief: cannot read back %s: %s", path, e)
        if not defer_plots or (self.notifier is not None and self.notifier.enabled):
            self.draw_plots(res)
        self.notify(res)
        return res

    def draw_plots(self, res: JobResult, earlier: list[dict] | tuple = ()) -> list[str]:
        """loss.png (and metrics.png) in model_dir, for every job: the whole job's curves and
        the final evaluation at its step (tfps.outcome.plot); ``earlier`` evaluations
        (``{"step": 400, "eval_loss": 0.3}``) are drawn as points too. Drawn once, again only
        for new points. Never raises."""
        if self.plotted and not earlier:
            return []
        self.plotted = True
        try:
            return plot.draw_plots(self.cfg.model_dir, results.read_history(self.cfg.model_dir) + list(earlier),
                              dict(res.eval_metrics or {}), res.global_step)
        except Exception as e:  # noqa: BLE001 - a plot never costs a report
            log.warning("chief: no loss plot: %s", e)
            return []

    def notify(self, res: JobResult) -> bool:
        """Send the end message; whether a service was configured to take it."""
        if self.notifier is None or not self.notifier.enabled:
            return False
        attachments = [os.path.join(self.cfg.model_dir, results.RESULTS)]
        png = os.path.join(self.cfg.model_dir, "loss.png")
        if os.path.exists(png) and os.path.getmtime(png) >= self.started_wall:   # drawn by ``draw_plots`` for this job
            attachments.append(png)
        self.notifier.send(res.status, res, attachments)
        return True


def _unwritable(path: str, error: OSError) -> str:
    """Why results.json was not written, in one clause (a full disk names the disk and its room)."""
    if is_disk_full(error):
        return f"{path} could not be written: " + disk_full_line(
            os.path.dirname(path), "results.json", None, "model_dir")
    return f"{path} could not be written: {error.strerror or error}"
