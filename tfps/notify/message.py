"""The text of a completion message: its subject line and plain-text body.

Pure formatting of a job's results (no apprise, no I/O), so the same text goes to email,
chat and webhooks, and the subject alone tells success from failure.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from tfps.outcome.contract import PAST_TOTAL_WHY, JobResult, progressive_line, step_of

TRACEBACK_LINES = 30
TRACEBACK_CHARS = 4000


def _num(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _pairs(d: Any) -> str:
    if not isinstance(d, Mapping) or not d:
        return ""
    return ", ".join(f"{k} {_num(v)}" for k, v in d.items())


def _seconds(value: Any) -> str:
    try:
        s = float(value)
    except (TypeError, ValueError):
        return str(value)
    if s < 60:
        return f"{s:.1f} s"
    m, sec = divmod(int(round(s)), 60)
    h, m = divmod(m, 60)
    return f"{h} h {m} min {sec} s" if h else f"{m} min {sec} s"


def _parse_time(value: Any) -> dt.datetime | None:
    try:
        return dt.datetime.fromisoformat(str(value))
    except (TypeError, ValueError):
        return None


def _time(value: Any) -> str:
    t = _parse_time(value)
    if t is None:
        return str(value)
    if t.tzinfo is not None and t.utcoffset() == dt.timedelta(0):
        return t.strftime("%Y-%m-%d %H:%M:%S UTC")
    return t.strftime("%Y-%m-%d %H:%M:%S %z").strip()


def _cluster(cluster: Any) -> str:
    if not isinstance(cluster, Mapping):
        return ""
    parts = []
    for job, hosts in cluster.items():
        if isinstance(hosts, Mapping):  # {index: host} form of a sparse cluster
            hosts = list(hosts.values())
        if isinstance(hosts, (list, tuple)):
            parts.append(f"{job} {', '.join(str(h) for h in hosts)}")
    return "; ".join(parts)


def _short_error(error: Any, limit: int = 100) -> str:
    if not isinstance(error, Mapping):
        return str(error or "")[:limit]
    text = str(error.get("message") or error.get("type") or "").strip()
    text = text.splitlines()[0] if text else ""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _title(event: str, r: Mapping[str, Any]) -> str:
    job = r.get("job") or "?"
    step = r.get("global_step")
    at = f" at step {step}" if step is not None else ""
    if event == "succeeded":
        return f"[tfps] ✔ job {job} succeeded{at}"
    if event == "failed":
        why = _short_error(r.get("error"))
        return f"[tfps] ✘ job {job} FAILED{at}" + (f": {why}" if why else "")
    if event == "stopped":
        return f"[tfps] job {job} stopped{at}"
    if event == "progress":
        total = r.get("train_steps")
        known = isinstance(step, int) and isinstance(total, int) and total
        of = f" {step_of(step, total)}" if known else at.replace(" at step", "")
        pct = f" ({100 * min(step, total) / total:.0f}%)" if known else ""
        return f"[tfps] job {job} progress: step{of}{pct}"
    if event == "stalled":
        names = ", ".join(str(s.get("task")) for s in r.get("stalled") or () if isinstance(s, Mapping))
        return f"[tfps] ⚠ job {job} stalled" + (f": {names}" if names else "")
    if event == "exports_failing":
        return f"[tfps] ⚠ job {job}: versions fail to export{at}"
    if event == "started":
        cluster = r.get("cluster") if isinstance(r.get("cluster"), Mapping) else {}
        sizes = ", ".join(f"{len(v)} {k}{'s' if len(v) != 1 and not k.endswith('s') else ''}"
                          for k, v in cluster.items() if isinstance(v, (list, tuple, Mapping)))
        mode = r.get("mode")
        detail = ", ".join(x for x in (sizes, f"{mode} updates" if mode else "") if x)
        return f"[tfps] job {job} started" + (f" ({detail})" if detail else "")
    return f"[tfps] job {job} {event}{at}"


_SUMMARY = {
    "succeeded": "Training finished.",
    "failed": "Training failed.",
    "stopped": "Training was stopped before its last step.",
    "started": "Training started.",
    "progress": "Training is running.",
    "stalled": "Part of the job makes no progress (the job goes on; a stall never fails it).",
    "exports_failing": "The versions of --export_every keep failing to export (training goes on).",
}


def _restart(x: Mapping[str, Any]) -> str:
    """One failure the job recovered from, on one line."""
    parts = [str(x.get("task") or "?")]
    if x.get("cause"):
        parts.append(str(x["cause"]))
    if x.get("time"):
        parts.append(f"at {_time(x['time'])}")
    line = ", ".join(parts)
    if x.get("resumed_from") is not None:
        how = {"joined": " (the live state on the ps)", "restored": " (a checkpoint)"}.get(x.get("how"), "")
        line += f"; resumed from step {x['resumed_from']}{how}"
    if x.get("steps_redone") is not None:
        line += f", {x['steps_redone']} step(s) redone"
    if x.get("note"):
        line += f" ({x['note']})"
    return line


def _story(event: str, r: Mapping[str, Any]) -> list[str]:
    """The lines about stalls, resumptions and restarts (none for a clean run)."""
    lines: list[str] = []
    stalled = [s for s in r.get("stalled") or () if isinstance(s, Mapping)]
    if stalled:
        limit = r.get("stall_timeout")
        lines.append("No progress" + (f" for {_seconds(limit)}" if limit else "") + ":")
        lines += [f"  - {s.get('task')}: last at global step {s.get('last_step')}, since {_time(s.get('since'))}"
                  for s in stalled]
    resumed = [str(x) for x in r.get("resumed") or ()]
    if resumed:
        lines.append("Progress resumed:")
        lines += [f"  - {x}" for x in resumed]
    restarts = [x for x in r.get("restarts") or () if isinstance(x, Mapping)]
    if restarts:
        n = len(restarts)
        lines.append(f"Recovered from {n} failure{'s' if n != 1 else ''}:")
        lines += [f"  - {_restart(x)}" for x in restarts]
    return lines


def format_message(event: str, results: JobResult | Mapping[str, Any]) -> tuple[str, str]:
    """The (title, body) of the message for ``event``, in plain text.

    ``results`` is the job's record (``JobResult``, as results.json holds it: the end
    messages) or, for the messages during the job, its head with the figures of the moment.
    Every key of ``results`` may be missing except ``job`` and ``status``; missing
    values are left out rather than shown as None. Keys used: job, status, exit_code,
    model, mode, started_at, ended_at, duration_s, global_step, train_steps, final_loss,
    metrics, eval_metrics, times, checkpoint, export_dir, export_complete, model_dir,
    cluster, task, host, error {type, message, traceback_tail}; during the job loss,
    examples_per_sec, eta_s, progressive {window, examples, auc, log_loss, ...} (also at the
    end), workers {name: {steps, examples_per_sec}}, stalled [{task,
    last_step, since}], stall_timeout, resumed [lines], note (a line of the stream's); restarts [{task, time, cause,
    resumed_from, how, steps_redone}].
    """
    if isinstance(results, JobResult):
        results = results.to_dict()
    r = results if isinstance(results, Mapping) else {}
    title = _title(event, r)
    rows: list[tuple[str, str]] = []

    def row(label: str, value: Any) -> None:
        if value is not None and value != "" and value != {}:
            rows.append((label, str(value)))

    error = r.get("error")
    if error and not isinstance(error, Mapping):
        error = {"message": str(error)}
    summary = _SUMMARY.get(event, f"Job {event}.")
    if event == "succeeded" and r.get("export_complete") is True:
        summary += " The model is exported."
    elif event == "succeeded" and r.get("export_complete") is False:
        summary += " The export is INCOMPLETE."
    elif event == "failed" and error:
        summary += " The error and the end of its traceback are below." if error.get("traceback_tail") else \
            " The error is below."

    status = r.get("status") or event
    if r.get("exit_code") is not None:
        status = f"{status} (exit code {r['exit_code']})"
    row("job", r.get("job"))
    row("status", status)
    if error:
        err = ": ".join(str(x) for x in (error.get("type"), error.get("message")) if x)
        row("error", err)
    model = ", ".join(x for x in (str(r.get("model") or ""), f"{r['mode']} updates" if r.get("mode") else "") if x)
    row("model", model)
    row("started", _time(r["started_at"]) if r.get("started_at") else None)
    row("ended", _time(r["ended_at"]) if r.get("ended_at") else None)
    duration = r.get("duration_s")
    if duration is None:
        t0, t1 = _parse_time(r.get("started_at")), _parse_time(r.get("ended_at"))
        if t0 and t1 and (t0.tzinfo is None) == (t1.tzinfo is None):
            duration = (t1 - t0).total_seconds()
    times = r.get("times") if isinstance(r.get("times"), Mapping) else {}
    phases = ", ".join(f"{k.removesuffix('_s').replace('_', ' ')} {_seconds(v)}" for k, v in times.items())
    if duration is not None:
        row("duration", _seconds(duration) + (f" ({phases})" if phases else ""))
    elif phases:
        row("times", phases)
    step, total = r.get("global_step"), r.get("train_steps")
    if step is not None:
        row("global step", (f"{step} of {total}" if step <= total else f"{step}, {step - total} past {total}: "
                            + PAST_TOTAL_WHY.format(step=step)) if isinstance(step, int) and isinstance(total, int)
            and total else step)
    elif total:
        row("train steps", total)
    row("final loss", _num(r["final_loss"]) if r.get("final_loss") is not None else None)
    row("loss", _num(r["loss"]) if r.get("loss") is not None else None)
    row("note", r.get("note"))
    row("examples/s", _num(r["examples_per_sec"]) if r.get("examples_per_sec") is not None else None)
    row("ETA", _seconds(r["eta_s"]) if r.get("eta_s") is not None else None)
    row("metrics", _pairs(r.get("metrics")))
    if isinstance(r.get("progressive"), Mapping):   # each batch scored before it trained
        row("progressive", progressive_line(r["progressive"]).removeprefix("progressive "))
    row("eval", _pairs(r.get("eval_metrics")))
    row("checkpoint", r.get("checkpoint"))
    if r.get("export_dir"):
        state = {True: " (complete)", False: " (INCOMPLETE: no completion marker)"}.get(r.get("export_complete"), "")
        row("export", f"{r['export_dir']}{state}")
    row("model dir", r.get("model_dir"))
    workers = r.get("workers") if isinstance(r.get("workers"), Mapping) else {}
    row("workers", "; ".join(f"{name} {w.get('steps')} steps, {_num(w.get('examples_per_sec'))} examples/s"
                             for name, w in workers.items() if isinstance(w, Mapping)))
    config = r.get("config") if isinstance(r.get("config"), Mapping) else {}
    changed = config.get("changed") if isinstance(config.get("changed"), Mapping) else {}
    row("settings", ", ".join(f"{k} {_pairs(v) if isinstance(v, Mapping) else v}" for k, v in changed.items()))
    row("hosts", _cluster(r.get("cluster")))
    row("image", r.get("image"))
    row("Slurm job", r.get("slurm_job"))
    where = " on ".join(str(x) for x in (r.get("task"), r.get("host")) if x)
    row("sent by", where)

    width = max(len(label) for label, _ in rows) + 2 if rows else 0
    story = _story(event, r)
    if r.get("restarts") and event in ("succeeded", "stopped"):
        n = len(r["restarts"])
        summary += f" The job recovered from {n} failure{'s' if n != 1 else ''}."
    lines = [summary, ""] + [f"{label.ljust(width)}{value}" for label, value in rows]
    if story:
        lines += [""] + story
    tail = str(error.get("traceback_tail") or "").rstrip() if error else ""
    if tail:
        tail_lines = tail.splitlines()[-TRACEBACK_LINES:]
        tail = "\n".join(tail_lines)[-TRACEBACK_CHARS:]
        lines += ["", "Traceback (last lines):"] + ["  " + line for line in tail.splitlines()]
    return title, "\n".join(lines) + "\n"
