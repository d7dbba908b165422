"""Memory you can plan: what a job's variables need, and whether a host can hold them (pure Python).

The estimate itself (``MemoryEstimate``) is made by building the training graph with the
worker's own code (``tfps.launch.estimate``, which needs TensorFlow); everything here is the
arithmetic on it and its reporting: ``tfps local``'s refusal (``check_fits_host``), the
Ansible role's check of each host (``host_problems``, through the ``tfps_memory_problems``
filter), the dynamic tables' budgets (``DynamicBudget``) and the lines ``tfps plan`` and the
chief show. It never imports TensorFlow, so the launchers and the role's plugins read it
without importing ``tfps.task``.
"""

from __future__ import annotations

import dataclasses
import math
import re

from tfps.errors import ConfigError

#: Of a host's memory (MemTotal; ``ansible_memtotal_mb`` on a host of the play), the part
#: tfps plans for variables. The rest is for the system, TensorFlow's own runtime (a few
#: hundred MB per task) and the rows in flight.
USABLE_MEMORY = 0.9


def fmt_mb(mb: float) -> str:
    """``96``, ``6.01``, ``274658``: as the chief's line shows them, never in e-notation."""
    return f"{mb:.0f}" if mb >= 1000 else f"{mb:g}"


def fmt_size(mb: float) -> str:
    """``12 MB``, ``715.3 GiB``."""
    return f"{mb / 1024:.1f} GiB" if mb >= 1024 else f"{fmt_mb(round(mb, 2))} MB"


def versions_on_disk(export_mb: float, export_every: str | None, keep: int | None) -> str:
    """What the versions of ``--export_every`` take on the export's disk, each about the size
    of the export (``MemoryEstimate.export_mb``: the model's variables once): ``--keep_exports``
    x that size, one more while the next version is written; "unbounded" without
    ``--keep_exports``. '' for a job without versions (``tfps plan``, ``tfps local``)."""
    if export_every is None:
        return ""
    head = f"the versions of --export_every {export_every} take about {fmt_mb(export_mb)} MB each on the export's disk"
    if keep is None:
        return f"{head}: unbounded (every version stays; set --keep_exports K to keep the newest K)"
    return (f"{head}: --keep_exports {keep} x {fmt_mb(export_mb)} MB = {fmt_size(keep * export_mb)} "
            f"({fmt_size((keep + 1) * export_mb)} while the next one is written)")


def deltas_on_disk(delta_secs: int | None, checkpoint_secs: int | None) -> str:
    """What the delta checkpoints of ``--delta_checkpoint_secs`` keep on the chief's disk: the
    deltas of the newest full checkpoint, until the next full one removes them. '' without."""
    if not delta_secs:
        return ""
    count = (f"about {max(1, checkpoint_secs // delta_secs)} (--checkpoint_secs {checkpoint_secs} / "
             f"{delta_secs})" if checkpoint_secs else "one per interval until the next full checkpoint")
    return (f"the delta checkpoints of --delta_checkpoint_secs {delta_secs} stay in MODEL_DIR/deltas until the "
            f"next full checkpoint: {count}, each the dense variables plus the dynamic tables' rows touched in "
            f"{delta_secs} s (at most a full checkpoint's size)")


#: Bytes a ``MutableHashTable`` int64 -> int64 takes per entry on a ps (TensorFlow 2.21, the
#: RSS of one process before and after inserting random keys): 40-48 once built (0.6-3 M
#: entries), 53-55 at its peak while it grows its buckets; the plan takes the peak.
HASH_TABLE_BYTES_PER_ID = 56
#: A dynamic table's own bookkeeping per row (tfps.layers.dynamic_embedding): the row's key,
#: its last-seen step and its place in the free list, an int64 each.
ROW_BOOKKEEPING_BYTES = 24
#: Slots per variable of each optimizer (--optimizer): rows of the table's width each.
OPTIMIZER_SLOTS = {"sgd": 0, "adagrad": 1, "adam": 2, "ftrl": 2}


@dataclasses.dataclass(frozen=True)
class DynamicBudget:
    """A dynamic table's memory per ps task, planned from its expected live ids
    (``--expected_ids``, else the table's capacity): its ids are spread over the ps tasks by
    a hash, each id's row of ``width`` floats with the optimizer's ``slots`` rows beside it,
    and its entry in the shard's hash table and bookkeeping."""

    name: str
    expected_ids: int       # live ids of the whole table
    width: int              # floats per row
    slots: int              # optimizer slot rows per row
    num_ps: int
    hint: bool = True       # from --expected_ids (else the table's capacity)

    @property
    def bytes_per_id(self) -> int:
        return self.width * 4 * (1 + self.slots) + HASH_TABLE_BYTES_PER_ID + ROW_BOOKKEEPING_BYTES

    @property
    def ids_per_ps(self) -> int:
        return math.ceil(self.expected_ids / max(self.num_ps, 1))

    @property
    def per_ps_mb(self) -> float:
        return round(self.ids_per_ps * self.bytes_per_id / 2**20, 2)

    def line(self) -> str:
        source = "--expected_ids" if self.hint else "its capacity; set --expected_ids"
        return (f"dynamic table {self.name}: {fmt_mb(self.per_ps_mb)} MB per ps task for {self.expected_ids} live "
                f"ids ({source}): {self.ids_per_ps} ids per ps x ({self.width} floats x (1 + {self.slots} slots) x "
                f"4 B + {HASH_TABLE_BYTES_PER_ID + ROW_BOOKKEEPING_BYTES} B of hash table and bookkeeping)")

    @classmethod
    def of_table(cls, table, optimizer: str, num_ps: int, expected_ids: int = 0) -> DynamicBudget:
        """The budget of a built ``tfps.layers.dynamic_embedding.DynamicTable``."""
        ids = int(expected_ids or getattr(table, "capacity", 0) or 0)
        return cls(str(getattr(table, "name", "table")), ids, int(table.dim), OPTIMIZER_SLOTS.get(optimizer, 2),
                   int(num_ps), bool(expected_ids))


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """What a job's variables need, from the shapes of its training graph (no session, no values).

    ``shares_mb`` is what the chief later logs and results.json records as ``ps_shares_mb``
    (the same graph, the same ``tfps.task.graph.placement.ByteBalancer``); ``export_mb`` what
    the chief's export restores at the end of the job, while the ps tasks still hold their
    shares: the model's variables once, whole, without the optimizer's slots.
    """

    shares_mb: dict[str, float]
    export_mb: float
    largest: str            # the largest variable (a partitioned one whole)
    largest_mb: float
    optimizer: str
    slots_mb: float = 0.0   # the optimizer's slots among the shares
    #: The dynamic tables' budgets (``DynamicBudget`` as dicts): their hash tables are no variables.
    dynamic: tuple = ()

    def budgets(self) -> list[DynamicBudget]:
        return [DynamicBudget(**b) if isinstance(b, dict) else b for b in self.dynamic]

    def shares_text(self) -> str:
        """``ps0 96, ps1 96``: the chief's "variables per ps task" line."""
        return ", ".join(f"{k} {fmt_mb(v)}" for k, v in self.shares_mb.items())

    def line(self) -> str:
        budgets = "".join(f"; {b.line()}" for b in self.budgets())
        return f"variables per ps task (MB, the optimizer's slots included): {self.shares_text()}{budgets}"

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        out["dynamic"] = [dataclasses.asdict(b) for b in self.budgets()]   # JSON: a list
        return out

    @classmethod
    def from_json(cls, data) -> MemoryEstimate:
        values = {f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data}
        values["dynamic"] = tuple(values.get("dynamic") or ())
        return cls(**values)

    @classmethod
    def of(cls, balancer, optimizer: str, dynamic: tuple = ()) -> MemoryEstimate:
        """What ``balancer`` (a ``tfps.task.graph.placement.ByteBalancer``) placed while a worker's
        training graph was built (and the ``DynamicBudget`` of each dynamic table it built)."""
        whole = balancer.variables_bytes()
        largest = max(whole, key=whole.get) if whole else ""
        slots = sum(balancer.placed[n][1] for n in balancer.slots)
        return cls(balancer.shares_mb(), round(sum(whole.values()) / 2**20, 2), largest,
                   round(whole.get(largest, 0) / 2**20, 2), optimizer, round(slots / 2**20, 2),
                   tuple(dataclasses.asdict(b) for b in dynamic))


def _changes(est: MemoryEstimate, *changes: str, last: str = "", slots: bool = True, where: str = "") -> str:
    """What to change, as one list ``a, b, or c``: ``changes``, a smaller largest variable, an
    optimizer that keeps fewer slots (when they are a good part of the shares), ``last``."""
    items = list(changes)
    items.append(f"make the largest variable ({est.largest}, {fmt_mb(est.largest_mb)} MB) smaller{where}")
    if slots and est.slots_mb > 0.05 * sum(est.shares_mb.values()):
        items.append(f"train with an optimizer that keeps fewer slots ({est.optimizer}'s are "
                     f"{fmt_mb(est.slots_mb)} MB; sgd keeps none)")
    items += [last] if last else []
    return ", ".join(items[:-1]) + f", or {items[-1]}" if len(items) > 1 else items[0]


def check_fits_host(est: MemoryEstimate, mem_total: int) -> None:
    """``tfps local``: refuse a job whose variables this host cannot hold (ConfigError, one line).

    Every ps task runs here, and the chief's export restores the model's variables once
    more while they still hold theirs: their sum must fit in :data:`USABLE_MEMORY` of
    ``mem_total`` (bytes, MemTotal). Unknown memory (0) is not checked.
    """
    need_mb = sum(est.shares_mb.values()) + est.export_mb
    if not mem_total or need_mb * 2**20 <= USABLE_MEMORY * mem_total:
        return
    changes = _changes(est, last="run the ps tasks on hosts with more memory (the Ansible role, one ps per host)",
                       where=" (e.g. --model_arg, --hash_buckets)")
    raise ConfigError(
        f"the variables need {fmt_size(need_mb)} on this host, which has {mem_total / 2**30:.1f} GiB "
        f"(MemTotal; tfps plans at most {USABLE_MEMORY:.0%} of it for variables): the ps tasks hold "
        f"{est.shares_text()} MB (the optimizer's slots included) and the chief's export restores the model's "
        f"variables once more ({fmt_mb(est.export_mb)} MB); {changes}", "memory")


def memory_limit_mb(value) -> float | None:
    """MB of a container memory limit as Docker takes it (``8g``, ``512m``, ``1073741824``); None: no limit."""
    text = str(value or "").strip().lower()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([bkmgtp]?)b?", text)
    if not match:
        return None
    power = "bkmgtp".index(match.group(2) or "b")
    return float(match.group(1)) * 1024 ** power / 2**20


def host_problems(est, plan: dict, host: str, memtotal_mb, ps_memory="", worker_memory="") -> list[str]:
    """The Ansible role's memory check of one host: its problems, one line each (none when it fits).

    A ps host holds the shares of its ps tasks; the chief's host restores the model's
    variables once more for the export. Each must fit in :data:`USABLE_MEMORY` of the
    host's ``ansible_memtotal_mb``, and each task in that much of its container's memory
    limit (``tfps_ps_memory``, ``tfps_worker_memory``), if set. ``est``: a MemoryEstimate
    or its JSON; ``plan``: the plan's JSON.
    """
    if not est:
        return []
    est = est if isinstance(est, MemoryEstimate) else MemoryEstimate.from_json(est)
    total = int(memtotal_mb) if str(memtotal_mb or "").strip().isdigit() else None
    share = f"{USABLE_MEMORY:.0%}"
    problems = []
    tasks = [t for t in plan.get("tasks", []) if t.get("host") == host]
    ps = [t["name"] for t in tasks if t.get("job") == "ps"]
    held = sum(est.shares_mb.get(name, 0.0) for name in ps)
    if ps and total is not None and held > USABLE_MEMORY * total:
        more = ("move some of its tfps_ps_tasks to other hosts, or add hosts to group ps" if len(ps) > 1
                else "add hosts to group ps")
        problems.append(
            f"{host}: its ps task{'s' if len(ps) > 1 else ''} {', '.join(ps)} hold{'' if len(ps) > 1 else 's'} "
            f"{fmt_mb(held)} MB of variables (the optimizer's slots included; estimated on the controller), and "
            f"the host has {total} MB (ansible_memtotal_mb; tfps plans at most {share} of it for variables); "
            + _changes(est, f"{more} so that each ps task holds less", last="use a host with more memory"))
    limit = memory_limit_mb(ps_memory)
    over = [name for name in ps if limit is not None and est.shares_mb.get(name, 0.0) > USABLE_MEMORY * limit]
    if over:
        problems.append(
            f"{host}: {', '.join(over)} hold{'s' if len(over) == 1 else ''} "
            f"{', '.join(fmt_mb(est.shares_mb[n]) for n in over)} MB of variables, more than {share} of "
            f"tfps_ps_memory {ps_memory} (its container would be killed); "
            + _changes(est, "raise tfps_ps_memory", "add hosts to group ps so that each ps task holds less"))
    chief = next((t["name"] for t in tasks if t.get("chief")), None)
    if chief and total is not None and est.export_mb > USABLE_MEMORY * total:
        problems.append(
            f"{host}: the chief ({chief}) restores the model's variables once, whole, for its export "
            f"({fmt_mb(est.export_mb)} MB), and the host has {total} MB (ansible_memtotal_mb; tfps plans at most "
            f"{share} of it for variables); "
            + _changes(est, last="make a host with more memory the first of group worker (the chief)", slots=False))
    limit = memory_limit_mb(worker_memory)
    if chief and limit is not None and est.export_mb > USABLE_MEMORY * limit:
        problems.append(
            f"{host}: the chief ({chief}) restores the model's variables once, whole, for its export "
            f"({fmt_mb(est.export_mb)} MB), more than {share} of tfps_worker_memory {worker_memory} (its container "
            f"would be killed at the end of the job); " + _changes(est, "raise tfps_worker_memory", slots=False))
    return problems


# --------------------------------------------------------------------------- this host's memory
def host_total_memory() -> int:
    """Bytes of memory this host has (MemTotal, what ``ansible_memtotal_mb`` reports), or 0 when unknown."""
    return meminfo("MemTotal")


def meminfo(key: str) -> int:
    """Bytes of ``key`` (``MemTotal``, ``MemAvailable``) in /proc/meminfo, or 0 when unknown."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith(f"{key}:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0
