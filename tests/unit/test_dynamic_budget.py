"""Memory you can plan for a dynamic table (issue 37): its budget per ps task, from the
expected live ids (``--expected_ids``), the row width, the optimizer's slots and the hash
table's measured bytes per entry (``tfps.cluster.memory.DynamicBudget``)."""

from __future__ import annotations

import pytest

from tfps.cluster import memory
from tfps.cluster.memory import DynamicBudget, MemoryEstimate
from tfps.config import RunConfig


def test_the_budget_is_ids_per_ps_times_row_slots_and_hash_overhead():
    b = DynamicBudget("embeddings", 1_000_000, width=17, slots=1, num_ps=2)
    assert b.ids_per_ps == 500_000
    # 17 floats, once for the row and once for Adagrad's accumulator, and 80 B of hash table and bookkeeping
    assert b.bytes_per_id == 17 * 4 * 2 + memory.HASH_TABLE_BYTES_PER_ID + memory.ROW_BOOKKEEPING_BYTES == 216
    assert b.per_ps_mb == round(500_000 * 216 / 2**20, 2) == 103.0
    assert ("dynamic table embeddings: 103 MB per ps task for 1000000 live ids (--expected_ids): 500000 ids per ps "
            "x (17 floats x (1 + 1 slots) x 4 B + 80 B of hash table and bookkeeping)") == b.line()
    # A third ps takes a third of the ids; Adam keeps two slots.
    assert DynamicBudget("t", 999_999, 16, memory.OPTIMIZER_SLOTS["adam"], 3).ids_per_ps == 333_333
    assert DynamicBudget("t", 10, 16, memory.OPTIMIZER_SLOTS["sgd"], 1).bytes_per_id == 64 + 80


def test_the_plans_line_shows_each_tables_budget_and_survives_json():
    budget = DynamicBudget("embeddings", 80_000, 17, 1, 2)
    est = MemoryEstimate({"ps0": 1.5, "ps1": 1.5}, 3.0, "deep0/kernel", 0.5, "adagrad", 0.7, (budget,))
    line = est.line()
    assert line.startswith("variables per ps task (MB, the optimizer's slots included): ps0 1.5, ps1 1.5; ")
    assert "dynamic table embeddings: 8.24 MB per ps task for 80000 live ids" in line
    back = MemoryEstimate.from_json(est.to_json())
    assert back.budgets() == [budget] and back.line() == line
    # An estimate of a tfps without dynamic tables (no "dynamic" in its JSON) reads as none.
    old = {k: v for k, v in est.to_json().items() if k != "dynamic"}
    assert MemoryEstimate.from_json(old).budgets() == []


def test_a_mutable_hash_table_takes_at_most_the_planned_bytes_per_entry():
    """The constant is a measurement: the RSS of this process grows by at most
    HASH_TABLE_BYTES_PER_ID per int64 -> int64 entry (measured 40-48 B, 53-55 B at the peak of a growth)."""
    tf = pytest.importorskip("tensorflow")

    def rss() -> int:
        with open("/proc/self/status") as fh:
            return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmRSS"))

    n, chunk = 400_000, 100_000
    keys = tf.random.stateless_uniform([n], seed=[3, 7], minval=0, maxval=2**62, dtype=tf.int64)
    table = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, default_value=-1)
    before = rss()
    for i in range(0, n, chunk):
        table.insert(keys[i:i + chunk], tf.range(i, i + chunk, dtype=tf.int64))
    grown = rss() - before
    assert int(table.size()) == n
    assert grown / n <= memory.HASH_TABLE_BYTES_PER_ID, grown / n


def test_the_estimate_of_wide_deep_with_dynamic_tables_prints_their_budget():
    """Built as a worker builds it (tfps plan and tfps local print this line)."""
    pytest.importorskip("tfps.layers.dynamic_embedding")
    from tfps.launch import estimate
    cfg = RunConfig(model="wide_deep", embedding="dynamic", expected_ids=100_000, optimizer="adagrad",
                    embedding_dim=8, train_steps=10).validate()
    est = estimate.estimate_memory(cfg, 2)
    [budget] = est.budgets()
    # one table: each id's embedding and its wide weight (one logit) side by side, with Adagrad's slot
    assert (budget.expected_ids, budget.width, budget.slots, budget.num_ps) == (100_000, 9, 1, 2)
    assert budget.line() in est.line()
