"""Where the variables live: each on the ps with the fewest bytes so far, not round-robin.

Every variable (and every shard of a split one, tfps.task.graph.partition) goes to the ps
with the fewest bytes so far (``ByteBalancer``, the ``ps_strategy`` of
``replica_device_setter``), instead of round-robin, which put a whole table on one ps and a
few biases on the other. Every worker builds the same graph in the same order, so every
worker computes the same placement.
"""

from __future__ import annotations

import math
import re


def variable_bytes(shape, dtype) -> int:
    dims = [int(d) if d is not None else 0 for d in (shape.as_list() if hasattr(shape, "as_list") else shape)]
    return math.prod(dims) * dtype.size if dims else dtype.size


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
            nbytes = variable_bytes(tf.TensorShape(op.get_attr("shape")), tf.as_dtype(op.get_attr("dtype")))
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
