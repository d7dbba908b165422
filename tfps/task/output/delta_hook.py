"""The chief's delta checkpoints (``--delta_checkpoint_secs N``), between its full ones.

Every N seconds after the last save (full or delta) the chief saves what changed since
(tfps.layers.table_delta: the dynamic tables' touched rows and evictions) and every other
variable whole (a Saver of its own, on the chief's disk), as delta ``seq`` of the newest
full checkpoint (tfps.task.output.delta writes it atomically). A full save starts a new chain and
removes the deltas it covers. The first delta of a chain, and the one after a delta that
failed to write, carries the live key sets instead of the evictions. A delta that cannot
be written is one warning; training goes on and the next one is tried at the next interval.
Deltas start after the session's first full save (each session of the chief makes one).
"""

from __future__ import annotations

import logging
import os
import time
import weakref

import tensorflow as tf

from tfps.layers import dynamic_embedding as de
from tfps.layers.table_delta import TableDeltas
from tfps.task.output import delta

v1 = tf.compat.v1
log = logging.getLogger("tfps")
#: The delta ops built in each graph (not a graph collection: a meta graph cannot hold them).
_BUILT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _first_line(error: Exception) -> str:
    lines = [x.strip() for x in str(getattr(error, "message", error)).splitlines()]
    return next((x for x in lines if x and x != "Graph execution error:"), type(error).__name__)


class _FullSaves(v1.train.CheckpointSaverListener):
    """Tells the delta hook of each full checkpoint (CheckpointSaverHook's listener)."""

    def __init__(self, hook):
        self.hook = hook

    def after_save(self, session, global_step_value):
        self.hook.full_saved(tf.train.latest_checkpoint(self.hook.model_dir), int(global_step_value))


class DeltaCheckpointHook(v1.train.SessionRunHook):
    """See the module docstring; ``listener`` goes to the CheckpointSaverHook's listeners."""

    def __init__(self, model_dir: str, secs: float, name: str = "chief", in_flight: int | None = None):
        """``in_flight``: tfps.layers.table_delta.IN_FLIGHT_STEPS unless given (a test's exact 0)."""
        self.model_dir, self.secs, self.name, self.in_flight = model_dir, float(secs), name, in_flight
        self.listener = _FullSaves(self)
        self.deltas = None
        self.base = None          # the chain's full checkpoint (None: no delta until one is saved)
        self.seq = 0
        self.since = 0            # the global step of the chain's last save
        self.with_keys = True
        self.last_save = time.monotonic()
        self.saved: list[dict] = []   # this process's deltas: manifest + pause seconds (bench, tests)

    def begin(self):
        graph = v1.get_default_graph()
        if graph in _BUILT:   # a later MonitoredSession on the same graph (finalized): reuse
            self.deltas, self.dense, self.step = _BUILT[graph]
            return
        self.deltas = TableDeltas(graph) if self.in_flight is None else TableDeltas(graph, self.in_flight)
        owned = {id(v) for t in self.deltas.tables for v in t.owned_variables()}
        var_list = de.saver_var_list(graph)
        if var_list is None:   # no dynamic table: what the default Saver saves
            var_list = graph.get_collection(v1.GraphKeys.GLOBAL_VARIABLES) + \
                graph.get_collection(v1.GraphKeys.SAVEABLE_OBJECTS)
        table_saveables = {id(t.saveable()) for t in self.deltas.tables}
        dense = [v for v in var_list if id(v) not in owned and id(v) not in table_saveables]
        self.dense = v1.train.Saver(dense, sharded=False, max_to_keep=None, save_relative_paths=True,
                                    allow_empty=True)
        self.step = v1.train.get_global_step(graph)
        _BUILT[graph] = (self.deltas, self.dense, self.step)

    def after_create_session(self, session, coord):
        self.base = None   # the session's first full save starts the chain

    def full_saved(self, path: str | None, step: int) -> None:
        if not path:
            return
        self.base, self.seq, self.since, self.with_keys = path, 0, step, True
        self.last_save = time.monotonic()
        removed = delta.prune(self.model_dir, path)
        if removed:
            log.debug("%s: removed %d delta(s) covered by %s", self.name, len(removed), os.path.basename(path))

    def after_run(self, run_context, run_values):
        if self.base is None or time.monotonic() - self.last_save < self.secs:
            return
        self.save(run_context.session)

    def save(self, session) -> dict | None:
        """Write the next delta now; returns its manifest (None: it failed, a warning said why)."""
        t0 = time.monotonic()
        seq = self.seq + 1
        try:
            step = int(session.run(self.step)) if self.step is not None else self.since + 1
            if step <= self.since:
                self.last_save = time.monotonic()
                return None
            with_keys = self.with_keys
            got = session.run(self.deltas.fetches(with_keys), {self.deltas.since: self.since})
            self.with_keys = True   # until this delta is on disk, the marks are ahead of the chain

            def save_dense(prefix) -> int:
                """The dense part; returns the global step it holds (async workers move it on)."""
                self.dense.save(session, prefix, write_meta_graph=False, write_state=False)
                if self.step is None:
                    return step
                return int(tf.train.load_checkpoint(prefix).get_tensor(self.step.op.name))

            manifest = delta.write(self.model_dir, self.base, seq, step, self.since, save_dense, got)
        except (tf.errors.OpError, OSError) as e:
            log.warning("%s: delta checkpoint %d of %s failed (%s); training goes on, the next delta carries "
                        "the live key sets", self.name, seq, os.path.basename(self.base or "?"), _first_line(e))
            self.last_save = time.monotonic()
            return None
        pause = time.monotonic() - t0
        self.seq, self.since, self.with_keys, self.last_save = seq, step, False, time.monotonic()
        self.saved.append({**manifest, "pause_secs": pause})
        rows = sum(t["rows"] for t in manifest["tables"].values())
        log.info("%s: delta checkpoint %d of %s at step %d: %d row(s) of %d table(s), %.1f MB, %.2f s",
                 self.name, seq, os.path.basename(self.base), step, rows, len(manifest["tables"]),
                 delta.nbytes(manifest) / 1e6, pause)
        return manifest
