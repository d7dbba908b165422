"""The chief's side of ``tfps.layers.DynamicEmbedding``: eviction off the step path, and the
tables' line in the log.

Every ``every`` global steps (a quarter of the shortest ``steps_to_live``, else the progress
interval) a thread of the chief runs each table's eviction op, which runs on the ps shards
under their locks, and logs one line per table: live rows per ps, rows admitted and evicted
since the last line. The chief's step never waits for it. A shard that has refused new ids
for want of rows says so once. docs/design/dynamic_embedding.md.
"""

from __future__ import annotations

import logging
import threading

import tensorflow as tf

from tfps.layers import dynamic_embedding as de

log = logging.getLogger("tfps")
v1 = tf.compat.v1


class DynamicTablesHook(v1.train.SessionRunHook):
    """On the chief: evicts and reports the graph's dynamic tables every ``every`` steps."""

    def __init__(self, step_read, log_steps: int, name: str = "chief"):
        self.step_read, self.log_steps, self.name = step_read, max(1, log_steps), name
        self.tables: list = []
        self.next_at = 0
        self.wake = threading.Event()
        self.stopping = False
        self.thread = None
        self.last: dict[str, list] = {}
        self.full_said: set[str] = set()

    def begin(self):
        self.tables = de.tables()
        if not self.tables:
            return
        lives = [t.steps_to_live for t in self.tables if t.steps_to_live]
        self.every = max(1, min(lives) // 4) if lives else self.log_steps
        for t in self.tables:   # once per graph: a later session's hook finds them built (the graph is final)
            if getattr(t, "chief_ops", None) is None:
                t.chief_ops = (t.evict_op(self.step_read), t.stats_op())
        self.evict = {t.name: t.chief_ops[0] for t in self.tables}
        self.stats = {t.name: t.chief_ops[1] for t in self.tables}

    def after_create_session(self, session, coord):
        if not self.tables or self.thread is not None:
            return
        self.session = session
        self.run_once(evict=False, when=" at the session's start")   # what a restore brought back
        self.thread = threading.Thread(target=self._loop, name="tfps-dynamic-tables", daemon=True)
        self.thread.start()

    def before_run(self, run_context):
        return v1.train.SessionRunArgs(self.step_read) if self.tables else None

    def after_run(self, run_context, run_values):
        if self.tables and run_values.results >= self.next_at:
            self.next_at = int(run_values.results) + self.every
            self.wake.set()

    def end(self, session):
        self.stopping = True
        self.wake.set()
        if self.thread is not None:
            self.thread.join(timeout=30)

    def _loop(self):
        while True:
            self.wake.wait()
            self.wake.clear()
            if self.stopping:
                return
            try:
                self.run_once()
            except Exception as e:  # noqa: BLE001 - a session closing under the thread ends it quietly
                if not self.stopping:
                    log.debug("%s: dynamic tables: %s", self.name, e)
                return

    def run_once(self, evict: bool = True, when: str = "") -> dict:
        """Evict, then read each table's counts; logs and returns them by table."""
        out = self.session.run({"evicted": self.evict, "stats": self.stats} if evict else {"stats": self.stats})
        for name, stats in out["stats"].items():
            live = [int(s[0]) for s in stats]
            totals = [int(sum(s[j] for s in stats)) for j in (1, 2, 3)]
            before = self.last.get(name, [0, 0, 0])
            self.last[name] = totals
            per_ps = ", ".join(f"ps{i} {n}" for i, n in enumerate(live)) if len(live) > 1 else ""
            log.info("%s: table %s: live %d%s%s, +%d admitted, -%d evicted", self.name, name, sum(live),
                     f" ({per_ps})" if per_ps else "", when, totals[0] - before[0], totals[1] - before[1])
            if totals[2] and name not in self.full_said:
                self.full_said.add(name)
                table = next(t for t in self.tables if t.name == name)
                log.warning("%s: table %s is full (%d rows per ps): %d new ids read the default until rows "
                            "are freed; give it more rows (--expected_ids, the layer's capacity) or a "
                            "--steps_to_live", self.name, name, table.shard_capacity, totals[2])
        return out
