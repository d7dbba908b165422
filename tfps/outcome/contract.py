"""results.json as a typed record: ``JobResult``, the one contract of how a job ended.

The chief writes it (tfps.outcome.report), ``tfps local`` adds what only it saw (tasks that
died while the job ran), and every reader goes through ``JobResult.load``: the launcher's
summary, the completion message, the Ansible role's filter plugin (which imports this
module on the controller, so it stays pure Python: no TensorFlow, no tfps.config).

The file keeps the keys it had before it had a schema (docs/how-to/results.md lists them); what is new
is added next to them: ``schema_version``, ``config`` (the settings the job trained with),
``versions`` and ``attempts``. A file from a newer schema, or one that is not a tfps record,
is refused with one ``ResultsError`` that says which file and why. Keys this version does not
know (written by a newer tfps of the same schema) are kept as they are (``extra``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import os
import re
import tempfile
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from tfps import __version__
from tfps.config.schema import MAX_FOLLOW_STEPS

#: The version of the record below. Raise it when a key changes its meaning or goes away
#: (adding keys does not need it: readers keep keys they do not know).
SCHEMA_VERSION = 1
#: Where an orchestrator tells the chief the id of the image it runs in (the Ansible role sets it).
IMAGE_ENV = "TFPS_IMAGE_ID"


class ResultsError(ValueError):
    """A results.json this tfps cannot read: not JSON, not a tfps record, or from a newer schema."""


def _optional(default: Any = None) -> Any:
    """A field left out of the file while it is None (``image``, ``error``, ...)."""
    return field(default=default, metadata={"omit_none": True})


def _extra() -> Any:
    """Keys of the file this version does not know: kept, and written back as they were."""
    return field(default_factory=dict, repr=False, metadata={"extra": True})


@dataclass
class Times:
    """Where the chief's time went: to its first step, training, the final save (seconds)."""

    startup_s: float | None = _optional()
    training_s: float | None = _optional()
    final_save_s: float | None = _optional()
    extra: dict[str, Any] = _extra()


@dataclass
class ErrorInfo:
    """The exception that ended the job: its type, first line and the end of its traceback."""

    type: str = ""
    message: str = ""
    traceback_tail: str = ""
    extra: dict[str, Any] = _extra()


@dataclass
class Restart:
    """A failure the job recovered from (tfps.outcome.journal.Story.restarts)."""

    task: str = ""
    time: str | None = None
    cause: str | None = None
    resumed_from: int | None = _optional()
    how: str | None = _optional()            # "joined" the live ps, or "restored" a checkpoint
    steps_redone: int | None = _optional()
    extra: dict[str, Any] = _extra()


@dataclass
class WorkerFigures:
    """One worker's share of the job: steps it trained, examples/s of its last process."""

    steps: int = 0
    examples_per_sec: float = 0.0
    extra: dict[str, Any] = _extra()


@dataclass
class Stall:
    """A stretch without progress (tfps.task.monitor.watch): who, from which step, since when."""

    task: str = ""
    last_step: int = 0
    since: str | None = None
    resumed_at: str | None = _optional()
    extra: dict[str, Any] = _extra()


@dataclass
class Progressive:
    """Progressive validation (tfps.task.monitor.progressive): each training batch scored by the model as
    it was before the batch trained it, over the job's last ``window`` examples (all workers'),
    as the chief last read them. Binary labels give ``auc``, ``log_loss`` and ``accuracy``; more
    classes ``log_loss`` and ``accuracy``; other models their own ``loss`` and ``metrics``."""

    window: int = 0                               # --progressive_window: the examples the figures cover at most
    examples: int = 0                             # the examples they cover (fewer early in a job)
    step: int | None = _optional()                # the global step they were read at
    auc: float | None = _optional()
    log_loss: float | None = _optional()
    accuracy: float | None = _optional()
    loss: float | None = _optional()              # a model without probabilities: its own loss, per example
    metrics: dict[str, float] | None = _optional()   # ... and its own per-batch metrics
    extra: dict[str, Any] = _extra()


@dataclass
class Versions:
    """What the job ran with: None for what is not installed (or not known)."""

    tfps: str | None = None
    python: str | None = None
    tensorflow: str | None = None
    tf_keras: str | None = None
    image: str | None = None        # the image id, when the orchestrator sets TFPS_IMAGE_ID
    extra: dict[str, Any] = _extra()

    @classmethod
    def current(cls) -> Versions:
        """The versions of this process, read from package metadata (nothing is imported)."""
        import platform

        return cls(tfps=__version__, python=platform.python_version(),
                   tensorflow=_installed("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tf-nightly"),
                   tf_keras=_installed("tf-keras", "tf_keras"), image=os.environ.get(IMAGE_ENV) or None)


def _installed(*dists: str) -> str | None:
    import importlib.metadata
    for d in dists:
        try:
            return importlib.metadata.version(d)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


@dataclass
class JobResult:
    """The record of one job in results.json (docs/how-to/results.md says what each field means)."""

    job: str
    status: str                                   # succeeded / failed / stopped
    schema_version: int = SCHEMA_VERSION
    exit_code: int | None = None
    # What ran, and where.
    model: str | None = None
    mode: str | None = None                       # sync / async
    task: str | None = None                       # the task that wrote it (the chief)
    host: str | None = None
    cluster: dict[str, list[str]] = field(default_factory=dict)
    train_steps: int | None = None
    batch_size: int | None = None
    train_data: str | None = None
    eval_data: str | None = None
    model_dir: str | None = None
    image: str | None = _optional()
    slurm_job: str | None = _optional()           # the Slurm job id ("1234", "1234 (requeued 1x)") under Slurm
    config: dict[str, Any] = field(default_factory=dict)   # every setting, optimizer and learning rate as used
    versions: Versions = field(default_factory=Versions)
    # When.
    started_at: str | None = None                 # the job's first start
    attempt_started_at: str | None = _optional()  # the start of the chief process that wrote it
    ended_at: str | None = None                   # when the chief wrote it
    duration_s: float | None = None
    times: Times = field(default_factory=Times)
    # How far, how well.
    global_step: int | None = None
    final_loss: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    eval_metrics: dict[str, float] = field(default_factory=dict)
    checkpoint: str | None = None
    export_dir: str | None = None
    export_complete: bool = False
    ended_by: str | None = _optional()            # "epochs": every worker read its data --epochs times first;
    #                                               "until", "follow_idle": a followed job's end (--follow)
    stream: dict[str, Any] | None = _optional()   # the slice queue: position, examples, partitions skipped
    progressive: Progressive | None = _optional()   # each batch scored before it trained: the last window's figures
    # The job's story.
    attempts: int | None = _optional()            # chief processes that ran this job (1: no restart)
    restarts: list[Restart] = field(default_factory=list)
    workers: dict[str, WorkerFigures] = field(default_factory=dict)
    stalls: list[Stall] = field(default_factory=list)
    resumed: list[str] = field(default_factory=list)
    ps_shares_mb: dict[str, float] = field(default_factory=dict)
    lost_tasks: list[str] = field(default_factory=list)
    task_exits: dict[str, str] = field(default_factory=dict)   # how each lost task ended (tfps local)
    error: ErrorInfo | None = _optional()
    extra: dict[str, Any] = _extra()

    # ------------------------------------------------------------------ writing
    def to_dict(self) -> dict[str, Any]:
        """The record as results.json holds it (plain JSON types)."""
        return _dump(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, default=str) + "\n"

    def save(self, path: str) -> str:
        """Write the record to ``path`` at once: a reader sees the old file or the new one, whole."""
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(self.to_json())
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        return path

    def add_lost_tasks(self, exits: dict[str, str]) -> JobResult:
        """Name tasks that died while the job ran, with how they ended (what a launcher saw)."""
        self.lost_tasks = sorted(set(self.lost_tasks) | set(exits))
        self.task_exits = {**self.task_exits, **exits}
        return self

    # ------------------------------------------------------------------ reading
    @classmethod
    def load(cls, path: str) -> JobResult:
        """The record in ``path``. A file that is not a tfps results.json (cut short, edited,
        another program's) or one of a newer schema raises ``ResultsError``; a missing file
        ``FileNotFoundError``."""
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
        except UnicodeDecodeError as e:
            raise ResultsError(f"{path} is not a tfps results.json: it is not text ({e.reason})") from None
        return cls.from_json(text, path)

    @classmethod
    def from_json(cls, text: str | bytes, source: str = "results.json") -> JobResult:
        try:
            data = json.loads(text)
        except ValueError as e:
            raise ResultsError(f"{source} is not a tfps results.json: it is not JSON ({e}); it was cut short "
                               "or changed by hand. The job's checkpoints and export are not affected") from None
        return cls.from_dict(data, source)

    @classmethod
    def from_dict(cls, data: Any, source: str = "results.json") -> JobResult:
        if not isinstance(data, dict):
            raise ResultsError(f"{source} is not a tfps results.json: it holds a JSON {type(data).__name__}, "
                               "not an object")
        version = data.get("schema_version", SCHEMA_VERSION)   # none: written before the schema, same keys
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise ResultsError(f"{source} is not a tfps results.json: schema_version is {version!r}, "
                               "not a whole number from 1")
        if version > SCHEMA_VERSION:
            raise ResultsError(f"{source} has schema_version {version}, newer than the {SCHEMA_VERSION} that "
                               f"tfps {__version__} reads; read it with the tfps that wrote it (or a newer one)")
        for key in ("job", "status"):
            if not isinstance(data.get(key), str):
                raise ResultsError(f"{source} is not a tfps results.json: it has no {key!r}")
        result = _load(cls, data, source)
        result.schema_version = SCHEMA_VERSION
        return result

    # ------------------------------------------------------------------ questions
    def written_since(self, start: float | str | None) -> bool:
        """Whether the chief wrote this record at or after ``start``: the start (epoch seconds,
        or an ISO 8601 time such as Docker's ``State.StartedAt``) of the run an orchestrator
        watches, so that results left in model_dir by an earlier run are not taken for its own.

        ``ended_at`` is the moment the chief wrote the file, in whole seconds; the chief's
        process started after its container or launcher did, on the same clock, so both are
        compared in whole seconds and nothing else is needed. An unknown ``start`` (no
        container) counts as written since.
        """
        begin = epoch(start)
        if begin is None:
            return True
        end = epoch(self.ended_at)
        return end is not None and end >= math.floor(begin)

    def summary_lines(self, **kwargs: Any) -> list[str]:
        """The human summary of the job (``summary_lines``)."""
        return summary_lines(self, **kwargs)


# ---------------------------------------------------------------------- summary

def _num(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _pairs(d: dict) -> str:
    return ", ".join(f"{k} {_num(v)}" for k, v in d.items())


_PHASES = {"startup_s": "start-up", "training_s": "training", "final_save_s": "final save"}


def _label(label: str, value: Any) -> str:
    return f"  {label:<10} {value}"


def progressive_line(p: Progressive | dict | None) -> str:
    """``progressive auc 0.7123 log_loss 0.4512 accuracy 0.81 over the last 100000 examples``
    ("" without figures): the summary's, the message's and the status line's words."""
    if p is None:
        return ""
    d = _dump(p) if isinstance(p, Progressive) else dict(p)
    numbers = {k: d[k] for k in ("auc", "log_loss", "accuracy", "loss") if isinstance(d.get(k), (int, float))}
    numbers.update({k: v for k, v in (d.get("metrics") or {}).items() if isinstance(v, (int, float))})
    if not numbers:
        return ""
    words = " ".join(f"{k} {v:.4f}" for k, v in numbers.items())
    examples, window = d.get("examples"), d.get("window")
    over = (f" over the last {examples} examples" if not window or (examples or 0) >= window
            else f" over {examples} examples (window {window})")
    return f"progressive {words}{over}"


def has_total(total: int) -> bool:
    """Whether a job has a last step to count towards (a followed job, ``--follow``, has none:
    no ETA, no percentage, no bar)."""
    return 0 < int(total) < MAX_FOLLOW_STEPS


def step_of(step: int, total: int) -> str:
    """``640/1000``; past the total (asynchronous workers that each finish a step they began
    just before it) ``1000/1000 +1``, never ``1001/1000``."""
    step, total = int(step), int(total)
    if total >= MAX_FOLLOW_STEPS:   # a followed job (--follow) has no total
        return str(step)
    return f"{step}/{total}" if step <= total or total <= 0 else f"{total}/{total} +{step - total}"


#: Why an asynchronous job's global step can end past --train_steps.
PAST_TOTAL_WHY = ("asynchronous workers each finish the step they began just before the job reached it; "
                  "the checkpoint and export hold step {step}")


def summary_lines(result: JobResult | None, *, job: str | None = None, status: str | None = None,
                  reason: str = "", host: str | None = None, results_path: str | None = None,
                  more: typing.Iterable[tuple[str, Any]] = (), tail: typing.Sequence[str] = (),
                  tail_title: str = "") -> list[str]:
    """The summary of a job that the launcher (``tfps local``) and the Ansible role print.

    ``result`` is None when the run left no results of its own; ``job`` and ``status`` then
    say what the orchestrator knows (they override the record's when given). ``reason`` is
    why the orchestrator judged the job failed; ``host`` prefixes the chief's paths
    (``host:/srv/...``) where they lie on another machine; ``more`` adds the orchestrator's
    own labelled lines (logs, tasks); ``tail`` the last lines of a log, under ``tail_title``.
    """
    job = job or (result.job if result else "?")
    status = status or (result.status if result else "failed")
    head = f"job {job} {status.upper()}"
    lines = [head]
    if result is not None and result.global_step is not None:
        lines[0] += f" at global step {step_of(result.global_step, result.train_steps)}"
        if result.ended_by == "epochs":
            epochs = (result.config or {}).get("epochs")
            lines[0] += f", after its {epochs} epoch(s)" if epochs else ", after its epochs"
        if result.train_steps and result.global_step > result.train_steps:
            lines.append(f"  {result.global_step - result.train_steps} step(s) past --train_steps "
                         f"{result.train_steps}: " + PAST_TOTAL_WHY.format(step=result.global_step))
    where = (lambda p: f"{host}:{p}") if host else str
    if result is not None:
        if result.final_loss is not None or result.metrics or result.eval_metrics:
            line = "  final loss " + ("-" if result.final_loss is None else _num(result.final_loss))
            if result.metrics:
                line += f"  metrics {_pairs(result.metrics)}"
            if result.eval_metrics:
                line += f"  eval {_pairs(result.eval_metrics)}"
            lines.append(line)
        if result.progressive is not None:
            line = progressive_line(result.progressive)
            if line:
                lines.append("  " + line)
        phases = [f"{name} {getattr(result.times, key)} s" for key, name in _PHASES.items()
                  if getattr(result.times, key) is not None]
        if phases:
            lines.append("  " + ", ".join(phases))
        if result.error is not None:
            lines.append(_label("error", f"{result.error.type}: {result.error.message}"))
    if reason:
        lines.append(_label("reason", reason))
    if result is not None:
        if result.restarts:
            lines.append(f"  recovered from {len(result.restarts)} failure(s): "
                         + "; ".join(f"{r.task} ({r.cause})" for r in result.restarts))
        if result.lost_tasks:
            lines.append(_label("lost tasks", ", ".join(
                f"{t} ({result.task_exits[t]})" if result.task_exits.get(t) else t for t in result.lost_tasks)))
        if result.checkpoint:
            lines.append(_label("checkpoint", where(result.checkpoint)))
        if result.export_dir:
            lines.append(_label("export", where(result.export_dir)
                                + (" (complete)" if result.export_complete else " (INCOMPLETE)")))
        if results_path:
            lines.append(_label("results", results_path))
    lines += [_label(label, value) for label, value in more]
    if tail:
        lines += ([tail_title] if tail_title else []) + list(tail)
    return lines


# ---------------------------------------------------------------------- the run an orchestrator watches

def run_outcome(results: JobResult | dict | str | bytes | None, *, chief_exit: int | None = None,
                oom_killed: bool = False, chief_started_at: float | str | None = None, script: bool = False,
                chief: str = "the chief", chief_host: str | None = None,
                results_file: str = "results.json") -> dict[str, Any]:
    """How a run of the job ended, as an orchestrator that watched the chief's process or
    container judges it: ``{status, fresh, results, chief_exit, reason}``.

    ``results`` is what model_dir holds (a record, its JSON text, or nothing); it counts
    (``fresh``) only if the chief of this run wrote it (``JobResult.written_since``
    ``chief_started_at``). A classic script (``script``) writes no results: its chief's
    exit code decides. Otherwise the fresh record's status decides, and without one the
    job failed; ``reason`` then says so, and the orchestrator sends the failure message
    the chief could not send. ``results`` in the answer is the fresh record as a dict ({}
    when there is none).
    """
    record, problem = None, ""
    if not script and results not in (None, "", b"", {}):
        try:
            record = (results if isinstance(results, JobResult) else
                      JobResult.from_dict(results, results_file) if isinstance(results, dict) else
                      JobResult.from_json(results, results_file))
        except ResultsError as e:
            problem = str(e)
    fresh = record is not None and record.written_since(chief_started_at)
    if script:
        status = "succeeded" if chief_exit == 0 else "failed"
    else:
        status = record.status if fresh and record is not None else "failed"
    reason = ""
    if not fresh and not (script and chief_exit == 0):
        reason = (f"the chief {chief}" + (f" on {chief_host}" if chief_host else "")
                  + f" exited with code {'?' if chief_exit is None else chief_exit}"
                  + (" (killed: out of memory)" if oom_killed else ""))
        if not script:
            reason += f" without writing {results_file}"
            if problem:
                reason += f" ({problem})"
            elif record is not None:
                reason += f" (the one there was written at {record.ended_at}, before this run)"
    return {"status": status, "fresh": fresh, "results": record.to_dict() if fresh and record else {},
            "chief_exit": chief_exit, "reason": reason}


# ---------------------------------------------------------------------- times

_ISO = re.compile(r"^(\d{4}-\d\d-\d\d)[T ](\d\d:\d\d:\d\d)(?:\.\d+)?(Z|[+-]\d\d:?\d\d)?$")


def epoch(value: float | str | None) -> float | None:
    """Epoch seconds of a number, or of an ISO 8601 time (Docker's nanoseconds and ``Z``
    included; without a zone, UTC); None when unknown."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    m = _ISO.match(str(value).strip())
    if not m:
        return None
    zone = m.group(3) or "+00:00"
    zone = "+00:00" if zone == "Z" else (zone if ":" in zone else zone[:3] + ":" + zone[3:])
    try:
        return dt.datetime.fromisoformat(f"{m.group(1)}T{m.group(2)}{zone}").timestamp()
    except (ValueError, OverflowError):
        return None


# ---------------------------------------------------------------------- (de)serialising

def _dump(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            if f.metadata.get("extra"):
                extra = v
            elif not (v is None and f.metadata.get("omit_none")):
                out[f.name] = _dump(v)
        return {**{k: _dump(v) for k, v in extra.items() if k not in out}, **out}
    if isinstance(value, dict):
        return {str(k): _dump(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_dump(v) for v in value]
    if type(value).__module__ == "numpy" and hasattr(value, "tolist"):
        return _dump(value.tolist())   # a NumPy number or array that reached the record
    if isinstance(value, float) and not math.isfinite(value):
        return None   # JSON has no NaN: a diverged loss is shown as missing
    return value


T = typing.TypeVar("T")


def parse(cls: type[T], data: dict, where: str = "results.json") -> T:
    """One part of the record (``Restart``, ``Stall``, ...) from its JSON form, checked as ``load`` checks."""
    return _convert(cls, data, where)


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _load(cls: type, data: dict, where: str) -> Any:
    hints, kwargs, known = _hints(cls), {}, set()
    extra_field = None
    for f in dataclasses.fields(cls):
        if f.metadata.get("extra"):
            extra_field = f.name
            continue
        known.add(f.name)
        if f.name in data:
            inner = f"{where}.{f.name}" if ": " in where else f"{where}: {f.name}"
            kwargs[f.name] = _convert(hints[f.name], data[f.name], inner)
    if extra_field:
        kwargs[extra_field] = {k: v for k, v in data.items() if k not in known}
    return cls(**kwargs)


def _bad(where: str, what: str, value: Any) -> ResultsError:
    return ResultsError(f"{where} is {json.dumps(value, default=str)[:80]}, not {what}: this is not a results.json "
                        "that tfps wrote (changed by hand?)")


def _convert(hint: Any, value: Any, where: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _convert(inner[0], value, where) if len(inner) == 1 else value
    if origin is list:
        if not isinstance(value, list):
            raise _bad(where, "a list", value)
        return [_convert(args[0], v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise _bad(where, "an object", value)
        return {k: _convert(args[1], v, f"{where}.{k}" if ": " in where else f"{where}: {k}")
                for k, v in value.items()}
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise _bad(where, "an object", value)
        return _load(hint, value, where)
    if hint is float:
        if value is None:   # a non-finite number, as _dump writes it
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _bad(where, "a number", value)
        return float(value)
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _bad(where, "a whole number", value)
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise _bad(where, "true or false", value)
        return value
    if hint is str:
        if not isinstance(value, str):
            raise _bad(where, "text", value)
        return value
    return value
