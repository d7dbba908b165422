"""Where the variables live: big ones split over every ps, the rest placed by bytes.

Parameter servers exist for models whose tables do not fit one process, so:

* a variable larger than ``--partition_mb`` is split row-wise into one shard per ps task
  (TensorFlow's partitioned variables: ``row_partitioner``). ``tf.nn.embedding_lookup``
  sends each id to the shard that holds its row, and the gradient stays ``IndexedSlices``
  per shard, so only the touched rows travel and are updated;
* every other variable (and every shard) goes to the ps with the fewest bytes so far
  (``ByteBalancer``, the ``ps_strategy`` of ``replica_device_setter``), instead of
  round-robin, which put a whole table on one ps and a few biases on the other;
* a tf_keras layer creates its weights through ``Layer.add_weight``, which takes a
  ``partitioner`` but is never given one by Keras: ``partitioned_keras_weights`` passes ours
  while a model is built, so an ``Embedding`` of a Keras model is split the same way.

Every worker builds the same graph in the same order, so every worker computes the same
placement. The checkpoint holds each partitioned variable whole (with its slices), so a job
resumed with another number of ps tasks splits it again, and the export (a fresh local
graph) restores the whole table.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import re

from tfps import compat
from tfps.errors import ConfigError

log = logging.getLogger("tfps")

def _nbytes(shape, dtype) -> int:
    dims = [int(d) if d is not None else 0 for d in (shape.as_list() if hasattr(shape, "as_list") else shape)]
    return math.prod(dims) * dtype.size if dims else dtype.size


def row_partitioner(num_ps: int, partition_bytes: int):
    """A partitioner that splits a variable over ``num_ps`` shards by rows when it is larger
    than ``partition_bytes``, and leaves smaller ones whole."""
    def partition(shape, dtype):
        dims = shape.as_list()
        rows = dims[0] if dims else 0
        if num_ps > 1 and rows and rows >= num_ps and _nbytes(shape, dtype) > partition_bytes:
            return [num_ps] + [1] * (len(dims) - 1)
        return [1] * len(dims)
    return partition


def _per_shard(initializer):
    """A Keras initializer that draws each shard anew: an unseeded Keras initializer called
    twice returns the same values, which would make every shard a copy of the first."""
    config = initializer.get_config() if hasattr(initializer, "get_config") else None
    if config is None or "seed" not in config:
        return initializer

    def init(shape, dtype=None, partition_info=None):
        offset = partition_info.var_offset[0] if partition_info is not None else 0
        seed = (config.get("seed") or 0) * 1_000_003 + offset
        return type(initializer).from_config({**config, "seed": seed})(shape, dtype=dtype)
    return init


def _splits(partitioner, shape, dtype) -> bool:
    """Whether ``partitioner`` splits a variable of this shape and dtype (known shapes only)."""
    import tensorflow as tf
    if shape is None:
        return False
    tshape = tf.TensorShape(shape)
    return bool(tshape.is_fully_defined() and tshape.rank
                and partitioner(tshape, tf.as_dtype(dtype))[0] > 1)


class ByteBalancer:
    """``ps_strategy`` for ``replica_device_setter``: the ps with the fewest bytes so far.

    Called once per variable op in creation order; records what it placed where, so that
    the chief can say what each ps holds.
    """

    def __init__(self, num_ps: int):
        self.loads = [0] * num_ps
        self.placed: dict[str, tuple[int, int]] = {}
        self.slots: set[str] = set()   # the optimizer's slots among ``placed``

    def __call__(self, op) -> int:
        import tensorflow as tf
        try:
            nbytes = _nbytes(tf.TensorShape(op.get_attr("shape")), tf.as_dtype(op.get_attr("dtype")))
        except (ValueError, TypeError):
            nbytes = 0
        # An optimizer's slot (``table/part_0/Adam``) is colocated with its variable when the
        # graph is placed, after this choice: count its bytes where it will live.
        primary = op.name.rpartition("/")[0]
        if primary in self.placed:
            ps = self.placed[primary][0]   # an optimizer slot lives with its variable
            self.slots.add(op.name)
        else:
            ps = min(range(len(self.loads)), key=lambda i: (self.loads[i], i))
        self.loads[ps] += nbytes
        self.placed[op.name] = (ps, nbytes)
        return ps

    def shares_mb(self) -> dict[str, float]:
        """Megabytes of variables each ps holds, the optimizer's slots included (from the shapes)."""
        return {f"ps{i}": round(load / 2**20, 2) for i, load in enumerate(self.loads)}

    def variables_bytes(self) -> dict[str, int]:
        """Bytes of each variable without the optimizer's slots, a partitioned one whole
        (``table/embeddings``, not its ``part_N``): what a fresh graph restores."""
        whole: dict[str, int] = {}
        for name, (_, nbytes) in self.placed.items():
            if name not in self.slots:
                key = re.sub(r"/part_\d+$", "", name)
                whole[key] = whole.get(key, 0) + nbytes
        return whole


def device_setter(task, cluster_spec, balancer: ByteBalancer):
    import tensorflow as tf
    return tf.compat.v1.train.replica_device_setter(
        worker_device=f"/job:worker/task:{task.index}", cluster=cluster_spec, ps_strategy=balancer)


@contextlib.contextmanager
def partitioned(num_ps: int, partition_mb: float, keras: bool = True):
    """Build a model inside this: ``get_variable`` and tf_keras ``add_weight`` split big variables.

    ``keras=False`` (a built-in model: plain ops and ``get_variable``) leaves tf_keras alone:
    not even imported, which a task's start-up would pay for nothing."""
    import tensorflow as tf
    v1 = tf.compat.v1
    split = row_partitioner(num_ps, int(partition_mb * 2**20))

    def split_big(getter, name, shape=None, dtype=tf.float32, partitioner=None, **kwargs):
        # Only variables that are split get a partitioner: a partitioner of one shard would
        # still turn a small variable into a PartitionedVariable (a concat on every read).
        if partitioner is None and _splits(split, shape, dtype):
            partitioner = split
        return getter(name, shape=shape, dtype=dtype, partitioner=partitioner, **kwargs)

    with v1.variable_scope(v1.get_variable_scope(), custom_getter=split_big), \
            (partitioned_keras_weights(split) if keras else contextlib.nullcontext()):
        yield


@contextlib.contextmanager
def partitioned_keras_weights(partitioner):
    """While a tf_keras model is built in a graph: its weights above the size are split.

    tf_keras's graph-mode layers take ``add_weight(partitioner=...)``, but Keras never passes
    one, and its TF2 layers (what a model built in a ``tf.Graph`` of TensorFlow 2 gets)
    ignore the argument. So a big weight is created here instead, as a partitioned
    variable named as Keras would name it (``table/embeddings``): ``Embedding`` looks its
    rows up with ``tf.nn.embedding_lookup``, which takes the shards as they are, and the
    fresh export graph (built without this) restores the whole table under that name.
    """
    def wrap(original):
        def add_weight(self, name=None, shape=None, dtype=None, initializer=None, *args, **kwargs):
            if kwargs.get("partitioner") is None and _splits(partitioner, shape, dtype or self.dtype or "float32"):
                import tensorflow as tf
                from tf_keras import initializers
                v1 = tf.compat.v1
                with v1.variable_scope(v1.VariableScope(reuse=v1.AUTO_REUSE, name="")):
                    return v1.get_variable(
                        f"{self.name}/{name}", shape=shape, dtype=tf.as_dtype(dtype or self.dtype or "float32"),
                        initializer=_per_shard(initializers.get(initializer)), partitioner=partitioner,
                        trainable=kwargs.get("trainable", True) is not False)
            return original(self, name, shape, dtype, initializer, *args, **kwargs)
        return add_weight

    with compat.keras_add_weight_wrapped(wrap):   # tf_keras's layer bases; nothing without tf_keras
        yield


# --------------------------------------------------------------------------- memory you can plan
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
    (the same graph, the same ByteBalancer); ``export_mb`` what the chief's export restores
    at the end of the job, while the ps tasks still hold their shares: the model's variables
    once, whole, without the optimizer's slots.
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
    def of(cls, balancer: ByteBalancer, optimizer: str, dynamic: tuple = ()) -> MemoryEstimate:
        """What ``balancer`` placed while a worker's training graph was built (and the
        ``DynamicBudget`` of each dynamic table it built)."""
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
