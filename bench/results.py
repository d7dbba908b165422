"""The bench's results file: one JSON object a line, appended as each figure is measured.

A bench that is killed or times out leaves every figure measured so far; ``bench/run.py
--report FILE`` makes the tables from it again. Records (``type``):

- ``start``: the run's command, machine, date, settings (one per bench invocation);
- ``run``: one measured run of one side of one figure: ``section``, ``figure``, ``side``,
  ``outcome`` (``ok``; ``hung``: a baseline that stalled, counted, not retried; ``failed``;
  ``cut``: ended by the section's budget), ``value`` (the figure, None unless ok), ``data``
  (what else the run measured), ``load1`` (the 1-minute load average as it ended);
- ``info``: what a section measures on (its data, steps), for its report;
- ``section``: a section's end: ``status`` ``done``, ``budget`` (ran out of its budget),
  or ``failed``, with ``elapsed_s``.

Pure Python (no TensorFlow): the report and its unit tests read it anywhere.
"""

from __future__ import annotations

import json
import os
import time

OK, HUNG, FAILED, CUT = "ok", "hung", "failed", "cut"


class ResultsFile:
    """Appends records to ``path``, one line each, flushed and fsynced as written."""

    def __init__(self, path: str):
        self.path = path
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

    def add(self, record: dict) -> dict:
        record = {"t": round(time.time(), 3), **record}
        line = json.dumps(record, default=str, separators=(",", ":"))
        with open(self.path, "a") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        return record

    def run(self, section: str, figure: str, side: str, outcome: str, value: float | None = None,
            data: dict | None = None, why: str = "", derived: bool = False) -> dict:
        """Record one run (see the module's docstring) and print its line. ``derived``: a
        second figure of a run already recorded (not a start of its own)."""
        rec = {"type": "run", "section": section, "figure": figure, "side": side, "outcome": outcome,
               "value": value if outcome == OK else None, "load1": round(os.getloadavg()[0], 2)}
        if derived:
            rec["derived"] = True
        if data:
            rec["data"] = data
        if why:
            rec["why"] = why[:2000]
        rec = self.add(rec)
        print(run_line(rec), flush=True)
        return rec


def run_line(rec: dict) -> str:
    """One run as the bench prints it when it ends."""
    v = rec.get("value")
    what = f"{v:.4g}" if isinstance(v, (int, float)) else rec["outcome"].upper()
    why = f" ({rec['why'].splitlines()[0][:200]})" if rec.get("why") and rec["outcome"] != OK else ""
    return f"[{rec['section']}] {rec['figure']} {rec['side']}: {what}{why} (load {rec.get('load1', '?')})"


def load(path: str) -> list[dict]:
    """The records of a results file; a line cut short (a bench killed while writing) or
    not JSON is left out, the lines after it are kept."""
    out = []
    with open(path, errors="replace") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and "type" in rec:
                out.append(rec)
    return out


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def spread(xs, fmt="{:.2f}") -> str:
    """The median of the runs, with their range and count: ``1.23 (1.10-1.40, 3 runs)``."""
    if not xs:
        return "no run"
    rng = f"{fmt.format(min(xs))}-{fmt.format(max(xs))}, " if len(xs) > 1 else ""
    return f"{fmt.format(median(xs))} ({rng}{len(xs)} run{'s' if len(xs) != 1 else ''})"


def stats(xs) -> dict:
    return {"median": median(xs), "min": min(xs), "max": max(xs), "runs": list(xs)} if xs else {"runs": []}


class Figure:
    """The runs of one side of one figure: completed values, hangs, failures."""

    def __init__(self, runs: list[dict]):
        self.runs = runs
        self.values = [r["value"] for r in runs if r["outcome"] == OK and r.get("value") is not None]
        self.hangs = sum(r["outcome"] == HUNG for r in runs)
        self.failed = sum(r["outcome"] == FAILED for r in runs)
        self.cut = sum(r["outcome"] == CUT for r in runs)
        #: runs that started and ended on their own (a run cut by the budget is no start)
        self.starts = len(self.values) + self.hangs + self.failed

    def data(self) -> list[dict]:
        return [r.get("data") or {} for r in self.runs if r["outcome"] == OK]

    def med(self) -> float | None:
        return median(self.values) if self.values else None

    def hang_note(self) -> str:
        """``2 hung, 1 failed in 6 starts``, or '' when every start completed."""
        parts = [f"{n} {w}" for n, w in ((self.hangs, "hung"), (self.failed, "failed")) if n]
        return f"{', '.join(parts)} in {self.starts} starts" if parts else ""


def figures(records: list[dict], section: str) -> dict[tuple[str, str], Figure]:
    """(figure, side) -> Figure for one section's runs, in the order first measured."""
    grouped: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        if r.get("type") == "run" and r.get("section") == section:
            grouped.setdefault((r["figure"], r["side"]), []).append(r)
    return {k: Figure(v) for k, v in grouped.items()}


def ratio(a: Figure | None, b: Figure | None, fmt="{:.2f}", names: tuple[str, str] = ("", "")) -> str:
    """The ratio of two medians, with the runs each holds:
    ``1.31x (medians of 3 tfps and 2 classic runs)``."""
    if not a or not b or a.med() is None or not b.med():
        return "n/a (no completed run on one side)"
    na, nb = (f" {n}" if n else "" for n in names)
    return f"{fmt.format(a.med() / b.med())}x (medians of {len(a.values)}{na} and {len(b.values)}{nb} runs)"


def hang_counts(records: list[dict]) -> dict[tuple[str, str], tuple[int, int]]:
    """(section, side) -> (hangs, starts) over every figure of every section."""
    out: dict[tuple[str, str], tuple[int, int]] = {}
    sections = sorted({r["section"] for r in records if r.get("type") == "run"})
    for s in sections:
        for (_fig, side), f in figures(records, s).items():
            if any(r.get("derived") for r in f.runs):
                continue
            h, n = out.get((s, side), (0, 0))
            out[(s, side)] = (h + f.hangs, n + f.starts)
    return out


def section_status(records: list[dict], section: str) -> dict | None:
    """The section's end record (done, budget or failed), None when it never ended (the
    bench was stopped in it)."""
    ends = [r for r in records if r.get("type") == "section" and r.get("section") == section]
    return ends[-1] if ends else None


def info(records: list[dict], section: str) -> dict:
    """The section's ``info`` records merged (its data, steps, ...)."""
    out: dict = {}
    for r in records:
        if r.get("type") == "info" and r.get("section") == section:
            out.update(r.get("data") or {})
    return out


def starts(records: list[dict]) -> list[dict]:
    return [r for r in records if r.get("type") == "start"]
