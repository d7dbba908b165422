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
#: Every death of the task's earlier processes under this supervisor, oldest first, as JSON
#: ``[{"time": wall, "signal": N}, ...]`` (same origin). The task publishes it where the chief
#: reads it (a worker's board, a ps's own variable: tfps.task.monitor.board), so that the journal
#: holds every failure, also of a process killed again before it trained or while the chief
#: was away.
RESTART_DEATHS_ENV = "TFPS_RESTART_DEATHS"


def iso(wall: float) -> str:
    return dt.datetime.fromtimestamp(wall, dt.timezone.utc).isoformat(timespec="seconds")


def signal_cause(signum: int) -> str:
    try:
        return f"killed by {signal.Signals(signum).name}"
    except ValueError:
        return f"killed by signal {signum}"


def parse_deaths(text: str | bytes | None) -> list[dict]:
    """The deaths of ``RESTART_DEATHS_ENV`` (or a ledger read back from a ps): a list of
    ``{"time", "signal"}``; anything else reads as none."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    try:
        raw = json.loads(text) if text else []
    except ValueError:
        return []
    if not isinstance(raw, list):
        return []
    return [{"time": round(float(d["time"]), 3), "signal": int(d.get("signal") or 0)} for d in raw
            if isinstance(d, dict) and isinstance(d.get("time"), (int, float))]


def deaths_from_env() -> list[dict]:
    """The deaths of this task's earlier processes that its supervisor passed on."""
    return parse_deaths(os.environ.get(RESTART_DEATHS_ENV))


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
        self._known: set | None = None   # (task, time) of the deaths in the journal

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

    def resumed(self, step: int, how: str, lost: list[str] | None = None, wall: float | None = None) -> None:
        """Where this (restarted) chief attempt took training up: ``how`` is "joined" (the
        live variables of the ps) or "restored" (a checkpoint); ``lost``: the ps tasks that had
        lost their variables (the reason for a restore while the chief was away)."""
        rec = {"event": "resumed", "task": self.task, "attempt": self.attempt, "step": int(step),
               "how": how, "time": round(time.time() if wall is None else wall, 3)}
        if lost:
            rec["lost"] = list(lost)
        append(self.model_dir, rec)

    def recovered(self, lost: list[str], step: int, redone: int, how: str, wall: float | None = None) -> None:
        """The chief's session was created again after ``lost`` (ps tasks; empty when not known)
        came back without their variables: training resumed from ``step``, ``redone`` steps
        are trained again."""
        append(self.model_dir, {"event": "recovered", "lost": list(lost), "step": int(step),
                                "redone": max(int(redone), 0), "how": how,
                                "time": round(time.time() if wall is None else wall, 3)})

    def died(self, task: str, deaths: list[dict], step: int | None = None) -> int:
        """Record the deaths of ``task``'s processes (``parse_deaths``) the journal does not hold
        yet, each once whoever reports it; returns how many were new."""
        if not deaths:
            return 0
        if self._known is None:
            self._known = {(r["task"], round(float(r["time"]), 3)) for r in current(read(self.model_dir))
                           if r["event"] == "death"}
        new = 0
        for d in deaths:
            key = (task, round(float(d["time"]), 3))
            if key in self._known:
                continue
            self._known.add(key)
            rec = {"event": "death", "task": task, "time": key[1], "cause": signal_cause(d["signal"])
                   if d.get("signal") else "killed (signal unknown)"}
            if step is not None:
                rec["step"] = int(step)
            append(self.model_dir, rec)
            new += 1
        return new

    def restart(self, task: str, cause: str, wall: float, resumed_from: int | None, redone: int | None,
                how: str | None = None) -> None:
        """A failure of another task that the job recovered from, known without its supervisor's
        account (a worker started again by hand or by a container's restart policy)."""
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
        return restarts_of(current(read(self.model_dir)))


def _recoveries(records: list[dict], chief: str) -> list[dict]:
    """What took training up again after failures, oldest first: each chief attempt (its
    ``start`` and ``resumed``) and each ``recovered`` session. ``tasks``: whose failures it
    recovers from (None: some ps, not known which); ``until``: deaths before it are its."""
    resumed = {r["attempt"]: r for r in records if r["event"] == "resumed"}
    out = []
    for s in (r for r in records if r["event"] == "start" and r.get("attempt", 0) > 0):
        took = resumed.get(s["attempt"]) or {}
        redone = None
        if took.get("how") == "joined":
            redone = 0   # it took up the live variables: whatever its predecessor logged, nothing is lost
        elif took and "last_step" in s:
            redone = max(s["last_step"] - took["step"], 0)
        lost = list(took.get("lost") or ())
        out.append({"tasks": {chief, *lost}, "until": {chief: s["time"], **{p: took["time"] for p in lost}},
                    "time": s["time"], "step": took.get("step"), "how": took.get("how"), "redone": redone,
                    "cause": s.get("cause"), "lost": lost})
    for r in (r for r in records if r["event"] == "recovered"):
        lost = list(r.get("lost") or ())
        out.append({"tasks": set(lost) if lost else None, "until": {}, "time": r["time"], "step": r.get("step"),
                    "how": r.get("how"), "redone": r.get("redone"), "cause": None, "lost": lost})
    return sorted(out, key=lambda x: x["time"])


def _entry(task: str, wall: float, cause: str | None, **more) -> dict:
    return {"task": task, "time": wall, "cause": cause, **{k: v for k, v in more.items() if v is not None}}


LOST_PEER = "lost peer: the ps came back without its variables"


def restarts_of(records: list[dict]) -> list[dict]:
    """results.json's ``restarts`` from the current job's journal records: one entry per failure.

    * ``death``: a task process's death as its supervisor saw it (``tfps run --restarts``),
      every one, also of a process killed again before it trained or while the chief was away;
    * a chief attempt (``start`` and its ``resumed``) is the recovery from the chief's deaths
      before it and, when its first session found ps without their variables (``lost``),
      from those ps's deaths: then the chief restored because of them, and says so;
    * ``recovered``: the chief's session created again after ps lost their variables, the
      recovery from those ps's deaths before it;
    * ``restart``: a failure known without a supervisor's account (a worker started again by
      hand, say), as it was recorded. A recovery with no death of a task before it stands for
      that task's failure itself (no supervisor counted it).

    A recovery that covers several failures counts its redone steps once, at the first.
    """
    chief = next((r["task"] for r in records if r["event"] == "start"), "worker0")
    deaths = sorted((r for r in records if r["event"] == "death"), key=lambda r: r["time"])
    used: set[int] = set()
    out: list[dict] = []
    for rec in _recoveries(records, chief):
        mine: list[dict] = []
        for i, d in enumerate(deaths):
            task = d["task"]
            covered = task.startswith("ps") if rec["tasks"] is None else task in rec["tasks"]
            if i in used or not covered or d["time"] >= rec["until"].get(task, rec["time"]):
                continue
            used.add(i)
            mine.append(_entry(task, d["time"], d.get("cause")))
        # A task this recovery is for, but no supervisor told of its death: the recovery stands for it.
        told = {e["task"] for e in mine}
        if chief in (rec["tasks"] or ()) and chief not in told:
            mine.append(_entry(chief, rec["time"], rec["cause"] or "ended without a report (exit unknown)"))
        for p in (rec["lost"] or ([] if rec["tasks"] is not None or mine else ["a ps"])):
            if p not in told:
                mine.append(_entry(p, rec["time"], LOST_PEER))
        mine.sort(key=lambda e: e["time"])
        for n, e in enumerate(mine):
            e.update({k: v for k, v in (("resumed_from", rec["step"]), ("how", rec["how"])) if v is not None})
            if rec["redone"] is not None:
                e["steps_redone"] = rec["redone"] if n == 0 else 0
            if e["task"] == chief and rec["lost"]:
                e["note"] = f"restored because {', '.join(rec['lost'])} had lost the variables too"
        out += mine
    for i, d in enumerate(deaths):
        if i not in used:   # a worker rejoins the live variables; a ps or chief never taken up again
            lost_nothing = not d["task"].startswith("ps") and d["task"] != chief
            out.append(_entry(d["task"], d["time"], d.get("cause"), resumed_from=d.get("step") if lost_nothing
                              else None, steps_redone=0 if lost_nothing else None))
    for r in (r for r in records if r["event"] == "restart"):
        out.append(_entry(r["task"], r["time"], r.get("cause"), resumed_from=r.get("resumed_from"),
                          how=r.get("how"), steps_redone=r.get("redone")))
    out.sort(key=lambda e: e["time"])
    return [{**e, "time": iso(e["time"])} for e in out]
