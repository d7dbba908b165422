"""The one interface every launcher implements, and the jobs table they all print.

A backend answers the same five questions over the cluster plan, each its own way (as
TorchX's schedulers do): what would start (:meth:`Backend.dry_run`), start it
(:meth:`Backend.submit`), which jobs there are (:meth:`Backend.jobs`), one job's state
(:meth:`Backend.status`), a task's log (:meth:`Backend.logs`) and stopping it
(:meth:`Backend.stop`). ``tfps jobs``, ``logs``, ``stop`` and ``status`` call these and nothing
else (``tfps.backends.selected``). docs/design/backends.md has the table of what each does.

Refusals are the house's: a job no backend knows, a task it does not have, is one line
``tfps: error: job: ...`` (a :class:`~tfps.errors.ConfigError` of field ``job``) and exit 2,
whichever backend it is.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import ClassVar, Protocol, runtime_checkable

from tfps.cluster import Launch, Plan
from tfps.exitcodes import ExitCode


@dataclass(frozen=True)
class Start:
    """What a backend would start for one task of the plan: the task's name (``ps0``,
    ``worker0``), where it runs (an address, a compose service, a container on a host, a
    rank of the Slurm step) and its command."""

    task: str
    where: str
    command: tuple[str, ...]

    def line(self) -> str:
        return f"{self.task:<9} {self.where:<28} {' '.join(self.command)}"


@runtime_checkable
class Backend(Protocol):
    """A launcher, as ``tfps jobs/logs/stop/status`` see it.

    ``name`` is its key in ``tfps.backends.REGISTRY``; ``option`` is how those commands
    select it (``-i INVENTORY``, ``--slurm``, ...). An instance is made from the command's
    namespace (``from_args``): which inventory, which directories.
    """

    name: ClassVar[str]
    option: ClassVar[str]

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Backend: ...

    def dry_run(self, plan: Plan, launch: Launch) -> list[Start]:
        """What would start, one :class:`Start` per task of ``plan``, in the plan's order; starts nothing."""

    def submit(self, ns: argparse.Namespace) -> int:
        """Start the job (or write what starts it) as the backend's run command does; its exit code."""

    def jobs(self) -> tuple[str, bool]:
        """(the jobs table, whether everything could be read)."""

    def status(self, job: str) -> int:
        """Print ``job``'s row of the table; refuse (ConfigError, field ``job``) a job it does not know."""

    def logs(self, job: str, task: str, follow: bool, lines: int) -> int:
        """Print the task's last ``lines`` lines, prefixed ``[task] ``, and with ``follow`` what comes
        next; refuse a job it does not know."""

    def stop(self, job: str) -> int:
        """Stop ``job`` as one stop (the chief writes its final checkpoint and export first); refuse a
        job it does not know."""


# --------------------------------------------------------------------------- the jobs table

#: The table's columns, for every backend.
COLUMNS = ("job", "state", "step", "loss", "examples/s", "started", "ETA", "hosts")


def age(seconds: float) -> str:
    seconds = max(int(seconds), 0)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def render(rows: list[dict], errors: dict[str, str], empty: str = "no tfps job on these hosts") -> str:
    """The table of ``rows`` (one dict per job, keyed by :data:`COLUMNS`), then one line per
    place that could not be read."""
    lines = []
    if rows:
        width = {c: max(len(c.upper()), *(len(r[c]) for r in rows)) for c in COLUMNS}
        lines.append("  ".join(c.upper().ljust(width[c]) for c in COLUMNS).rstrip())
        lines += ["  ".join(r[c].ljust(width[c]) for c in COLUMNS).rstrip() for r in rows]
    else:
        lines.append(empty)
    lines += [f"{where}: not read: {error}" for where, error in sorted(errors.items())]
    return "\n".join(lines)


def print_row(row: dict) -> ExitCode:
    """``tfps status``'s answer for one job: the table with its one row."""
    print(render([row], {}), flush=True)
    return ExitCode.OK


def print_starts(starts: list[Start]) -> None:
    """A dry run for people: one line per task."""
    for start in starts:
        print(start.line().rstrip(), flush=True)
