"""The job's story across restarts: a small journal of attempts in the chief's model_dir.

A job may outlive several processes of its chief (``tfps run --restarts``, a container
restart policy, a person starting it again) and lose a ps or a worker on the way. Each
chief attempt appends a ``start`` record to ``tfps_attempts.jsonl`` when it claims the
model_dir; what it learns on the way (where it resumed from, a ps that lost its variables,
a worker that came back) is appended as it happens; the final report appends ``end``.
The records since the last ``end`` are the current job: its first start, its whole
duration and the failures it recovered from (``Story``).

Pure Python and plain files: the chief of every launcher (local processes, compose, the
Ansible role) keeps the same journal, since its model_dir survives its restarts.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import time

from tfps.outcome import results

JOURNAL = "tfps_attempts.jsonl"
#: Set by ``tfps run --restarts`` for the task it starts again: why the previous one ended.
RESTART_CAUSE_ENV = "TFPS_RESTART_CAUSE"
#: The number of the signal that killed the previous process (same origin).
RESTART_SIGNAL_ENV = "TFPS_RESTART_SIGNAL"


def iso(wall: float) -> str:
    return dt.datetime.fromtimestamp(wall, dt.timezone.utc).isoformat(timespec="seconds")


def signal_cause(signum: int) -> str:
    try:
        return f"killed by {signal.Signals(signum).name}"
    except ValueError:
        return f"killed by signal {signum}"


def read(model_dir: str) -> list[dict]:
    return [r for r in results.read_jsonl(os.path.join(model_dir, JOURNAL)) if isinstance(r, dict) and "event" in r]


def append(model_dir: str, record: dict) -> None:
    os.makedirs(model_dir, exist_ok=True)
    path = os.path.join(model_dir, JOURNAL)
    with open(path, "a+b") as fh:
        # A line cut by a kill mid-write ends without a newline: start a fresh one after it.
        cut = False
        if fh.seek(0, os.SEEK_END) > 0:
            fh.seek(-1, os.SEEK_END)
            cut = fh.read(1) != b"\n"
        fh.write((("\n" if cut else "") + json.dumps(record, sort_keys=True) + "\n").encode())
        fh.flush()


def current(records: list[dict]) -> list[dict]:
    """The records of the current job: those after the last ``end`` (a finished job's
    model_dir may be resumed by a new job, which starts its own story)."""
    last_end = max((i for i, r in enumerate(records) if r["event"] == "end"), default=-1)
    return records[last_end + 1:]


class Story:
    """The current job's story as the chief of this attempt knows it and adds to it."""

    def __init__(self, model_dir: str, task: str = "worker0"):
        self.model_dir, self.task = model_dir, task
        self.attempt = 0
        self.started_wall = time.time()

    # ------------------------------------------------------------------ writing
    def begin(self, started_wall: float, cause: str | None = None) -> Story:
        """Record this chief attempt's start; a previous attempt that never ended was lost."""
        records = current(read(self.model_dir))
        starts = [r for r in records if r["event"] == "start"]
        self.attempt = len(starts)
        rec = {"event": "start", "task": self.task, "attempt": self.attempt, "time": round(started_wall, 3)}
        if starts:
            prev = starts[-1]["time"]
            rec["cause"] = cause or "ended without a report (exit unknown)"
            steps = [h["step"] for h in results.read_history(self.model_dir)
                     if isinstance(h.get("time"), (int, float)) and h["time"] >= prev and "step" in h]
            if steps:
                rec["last_step"] = max(steps)
        append(self.model_dir, rec)
        self.started_wall = started_wall
        return self

    def resumed(self, step: int, how: str) -> None:
        """Where this (restarted) chief attempt took training up: ``how`` is "joined" (the
        live variables of the ps) or "restored" (a checkpoint)."""
        append(self.model_dir, {"event": "resumed", "task": self.task, "attempt": self.attempt, "step": int(step),
                                "how": how, "time": round(time.time(), 3)})

    def restart(self, task: str, cause: str, wall: float, resumed_from: int | None, redone: int | None,
                how: str | None = None) -> None:
        """A failure of another task that the job recovered from (a ps, a worker)."""
        rec = {"event": "restart", "task": task, "cause": cause, "time": round(wall, 3)}
        if how:
            rec["how"] = how
        if resumed_from is not None:
            rec["resumed_from"] = int(resumed_from)
        if redone is not None:
            rec["redone"] = max(int(redone), 0)
        append(self.model_dir, rec)

    def end(self, status: str) -> None:
        append(self.model_dir, {"event": "end", "task": self.task, "status": status, "time": round(time.time(), 3)})

    # ------------------------------------------------------------------ reading
    def first_start(self) -> float:
        starts = [r["time"] for r in current(read(self.model_dir)) if r["event"] == "start"]
        return min(starts) if starts else self.started_wall

    def restarts(self) -> list[dict]:
        """One entry per failure the job recovered from, oldest first (results.json's ``restarts``)."""
        records = current(read(self.model_dir))
        resumed = {r["attempt"]: r for r in records if r["event"] == "resumed"}
        out = []
        for r in records:
            if r["event"] == "start" and r.get("attempt", 0) > 0:
                entry = {"task": r["task"], "time": iso(r["time"]), "cause": r.get("cause")}
                took_up = resumed.get(r["attempt"])
                if took_up is not None:
                    entry["resumed_from"] = took_up["step"]
                    entry["how"] = took_up["how"]
                    if took_up["how"] == "joined":
                        # It took up the live variables: no step was lost, whatever the
                        # predecessor had logged before it died.
                        entry["steps_redone"] = 0
                    elif "last_step" in r:
                        entry["steps_redone"] = max(r["last_step"] - took_up["step"], 0)
                out.append(entry)
            elif r["event"] == "restart":
                entry = {"task": r["task"], "time": iso(r["time"]), "cause": r.get("cause")}
                if "resumed_from" in r:
                    entry["resumed_from"] = r["resumed_from"]
                if "how" in r:
                    entry["how"] = r["how"]
                if "redone" in r:
                    entry["steps_redone"] = r["redone"]
                out.append(entry)
        return out
