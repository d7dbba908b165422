"""The chief's side of ``tfps.layers.DynamicEmbedding``: eviction off the step path, and the
tables' line in the log.

Every ``every`` global steps (a quarter of the shortest ``steps_to_live``, else the progress
interval) a thread of the chief runs each table's eviction op, which runs on the ps shards
under their locks, and every ``--log_steps`` global steps at most it logs one line per table:
live rows per ps, rows admitted, evicted (and refused, if any) since the last line. The
chief's step never waits for it. A shard that has refused new ids for want of rows says so
once. docs/design/dynamic_embedding.md.

The cadence follows the global step, whatever the chief's own share of the steps: the thread
reads the global step itself (one read on its ps) about twice per ``every`` steps at the
step's recent pace (twice as late each time it has not moved), between POLL_MIN_SECS and
POLL_MAX_SECS. The chief's own runs only nudge
it: an asynchronous chief runs up to --log_steps steps per session.run (tfps.task.graph.steps), and
with other workers the global step advances by several times that meanwhile (a chief of two
workers, 2 ps, made 18 of the first 245 global steps at the dynamic bench's scale 0.02, and
evictions 50 and 92 global steps apart let a table planned for --steps_to_live 10 fill and
refuse 15562 new ids).
"""

from __future__ import annotations

import logging
import threading
import time

import tensorflow as tf

from tfps.layers import dynamic_embedding as de

log = logging.getLogger("tfps")
v1 = tf.compat.v1

#: Bounds of the thread's wait between two reads of the global step (seconds).
POLL_MIN_SECS, POLL_MAX_SECS = 0.01, 1.0
#: The graph's collection of the thread's own read of the global step (built once per graph).
STEP_NOW_KEY = "tfps_dynamic_tables_step_now"


def _step_now(fallback):
    """The global step read on its own ps (built once per graph; ``fallback``: no global step)."""
    graph = v1.get_default_graph()
    got = graph.get_collection(STEP_NOW_KEY)
    if got:
        return got[0]
    step = v1.train.get_global_step(graph)
    if step is None:
        return fallback
    with tf.device(step.device), v1.name_scope(None):
        now = tf.identity(step.read_value(), name="dynamic_tables_step_now")
    graph.add_to_collection(STEP_NOW_KEY, now)
    return now


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
        self.evicted_at = self.logged_at = None   # the global step of the last eviction, of the last line
        self.evictions = 0

    def begin(self):
        self.tables = de.tables()
        if not self.tables:
            return
        lives = [t.steps_to_live for t in self.tables if t.steps_to_live]
        self.every = max(1, min(lives) // 4) if lives else self.log_steps
        # once per graph: a later session's hook finds them built (the graph is final)
        self.step_now = _step_now(self.step_read)
        for t in self.tables:
            if getattr(t, "chief_ops", None) is None:
                t.chief_ops = (t.evict_op(self.step_now), t.stats_op())
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
        wait, last = POLL_MIN_SECS, None   # last: (global step, time) of the last read that saw it move
        while True:
            self.wake.wait(timeout=wait)
            self.wake.clear()
            if self.stopping:
                return
            try:
                step = int(self.session.run(self.step_now))
                now = time.monotonic()
                if self.evicted_at is None or step >= self.evicted_at + self.every:
                    self.run_once(step=step)
                if last is not None and step > last[0]:   # about twice per `every` steps at this pace
                    pace = (step - last[0]) / max(now - last[1], 1e-6)
                    wait = min(POLL_MAX_SECS, max(POLL_MIN_SECS, 0.5 * self.every / pace))
                else:   # not moved since the last read (the steps come in bursts): wait longer, gradually
                    wait = min(POLL_MAX_SECS, 2 * wait) if last is not None else POLL_MIN_SECS
                if last is None or step > last[0]:
                    last = (step, now)
            except Exception as e:  # noqa: BLE001 - a session closing under the thread ends it quietly
                if not self.stopping:
                    log.debug("%s: dynamic tables: %s", self.name, e)
                return

    def run_once(self, evict: bool = True, when: str = "", step: int | None = None) -> dict:
        """Evict, then read each table's counts; logs them (at most every ``log_steps`` global
        steps when ``step``, the global step read before, is given) and returns them by table."""
        out = self.session.run({"evicted": self.evict, "stats": self.stats} if evict else {"stats": self.stats})
        if evict:
            self.evictions += 1
            self.evicted_at = step if step is not None else self.evicted_at
        if step is not None and self.logged_at is not None and step < self.logged_at + self.log_steps:
            self._warn_full(out["stats"])
            return out
        self.logged_at = step if step is not None else self.logged_at
        for name, stats in out["stats"].items():
            live = [int(s[0]) for s in stats]
            totals = [int(sum(s[j] for s in stats)) for j in (1, 2, 3)]
            before = self.last.get(name, [0, 0, 0])
            self.last[name] = totals
            per_ps = ", ".join(f"ps{i} {n}" for i, n in enumerate(live)) if len(live) > 1 else ""
            refused = totals[2] - before[2]
            log.info("%s: table %s: live %d%s%s, +%d admitted, -%d evicted%s", self.name, name, sum(live),
                     f" ({per_ps})" if per_ps else "", when, totals[0] - before[0], totals[1] - before[1],
                     f", {refused} new ids refused (table full)" if refused > 0 else "")
        self._warn_full(out["stats"])
        return out

    def _warn_full(self, all_stats: dict) -> None:
        for name, stats in all_stats.items():
            totals = [int(sum(s[j] for s in stats)) for j in (1, 2, 3)]
            if totals[2] and name not in self.full_said:
                self.full_said.add(name)
                table = next(t for t in self.tables if t.name == name)
                log.warning("%s: table %s is full (%d rows per ps): %d new ids read the default until rows "
                            "are freed; give it more rows (--expected_ids, the layer's capacity) or a "
                            "--steps_to_live", self.name, name, table.shard_capacity, totals[2])
