"""The chief's feeder: lists the input, fills the slice queue on ps 0, keeps the position.

One thread of the chief (workers only take slices, tfps.task.graph.slicequeue). About twice a
second it:

* lists what is new (a followed ``--train_data``: tfps.data.stream.PartitionLister, which reads a
  directory again only when it changed), checks each new partition's files against the
  job's columns, and numbers their slices in the manifest (model_dir/stream.jsonl);
* reads the done marks and moves the position (``tfps_stream/position``, checkpointed) to
  the first slice not done;
* enqueues the next slices in order, a few per worker ahead, never RING past the position;
* gives the unfinished slice of a worker that made no step for ``--sync_timeout`` (frozen,
  lost) to the next worker that asks, and a slice taken from the queue by a cut-short
  request (never claimed) likewise;
* decides the end: ``--epochs`` read, ``--until`` trained, ``--follow_idle`` without a new
  partition, a malformed partition (the job fails with its path and line, unless
  ``--skip_bad_partitions``), or a stop. It then closes the queue: every worker's input ends.

``Feeder.where()`` is the stream's position for the chief's hooks and messages.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np

from tfps import timeouts
from tfps.data import dataset as data_mod
from tfps.data import stream
from tfps.errors import ConfigError
from tfps.task.graph.slicequeue import RING, advance, claimed_by, done
from tfps.task.runtime.session import session_config

log = logging.getLogger("tfps")

POLL_SECS = 0.5
#: A slice taken from the queue but never claimed (a request cut short) for this long is queued again.
ORPHAN_SECS = 10.0


class FiniteSource:
    """A finite ``--train_data``: its slices, read ``epochs`` times (forever without)."""

    follow = False

    def __init__(self, slices: list, epochs: int | None):
        self.slices = slices
        self.total = len(slices) * epochs if epochs else None

    def available(self, position: int) -> int:
        return self.total if self.total is not None else position + RING

    def slice(self, k: int):
        return self.slices[k % len(self.slices)]

    def poll(self) -> None:
        pass


class FollowSource:
    """A followed ``--train_data``: the complete partitions so far, numbered by the manifest."""

    follow = True

    def __init__(self, cfg, schema):
        self.cfg, self.schema = cfg, schema
        self.manifest = stream.Manifest(cfg.model_dir)
        self.lister = stream.PartitionLister(cfg.train_data)
        self.lister.skip_to(self.manifest.last)
        self.until = stream.check_until(cfg.until, cfg.train_data) if cfg.until else None
        self.last_new_at = time.monotonic()
        self.error: Exception | None = None
        self.newest = self.manifest.last
        self.skipped_now: list = []   # (partition, why) skipped since the feeder last looked

    @property
    def total(self) -> int | None:
        return None

    def available(self, position: int) -> int:
        return len(self.manifest.slices)

    def slice(self, k: int):
        return self.manifest.slices[k]

    def until_reached(self, position: int) -> bool:
        """Whether every slice of the --until partition (and before it) is done."""
        if self.until is None or self.until not in self.manifest.partitions:
            return False
        return all(s.partition > self.until for s in self.manifest.slices[position:])

    def poll(self) -> None:
        if self.error is not None:
            return
        for p in self.lister.poll():
            try:
                slices = [stream.Slice(f, 0, stream.count_rows(f, self.schema.fmt), p) for f in self._checked(p)]
            except ConfigError as e:
                if not self.cfg.skip_bad_partitions:
                    self.error = e
                    return
                log.warning("chief: skipping the malformed partition %s (--skip_bad_partitions): %s", p, e)
                self.manifest.skip(p, str(e))
                self.skipped_now.append((p, str(e)))
                continue
            self.manifest.add(p, [s for s in slices if s.rows])
            self.last_new_at = time.monotonic()
            self.newest = p
            log.info("chief: partition %s: %d file(s), %d row(s)", p, len(slices), sum(s.rows for s in slices))
        for p in self.lister.late:
            log.warning("chief: partition %s landed after a later one was listed: the stream's order is the "
                        "sorted path, so it is not trained", p)
        self.lister.late.clear()

    def _checked(self, partition: str) -> list[str]:
        """The partition's data files, each read and checked against the job's columns."""
        files = stream.data_files(partition)
        for f in files:
            got = data_mod.infer_schema(f, self.cfg.label_column, self.schema.num_classes, "train_data",
                                        text_columns=self.schema.string_columns,
                                        decided_by=f"the stream's first partition ({self.schema.files[0]})")
            if got.fmt != self.schema.fmt or got.feature_keys != self.schema.feature_keys \
                    or got.feature_shape != self.schema.feature_shape:
                raise ConfigError(f"{f} has columns {list(got.feature_keys) or list(got.feature_shape)}, the "
                                  f"stream's first partition {self.schema.files[0]} has "
                                  f"{list(self.schema.feature_keys) or list(self.schema.feature_shape)}; every "
                                  "partition needs the same columns", "train_data")
        return files


class Feeder(threading.Thread):
    """The chief's thread that fills the slice queue and keeps the position (module doc)."""

    def __init__(self, chief, server, graph, ops, source):
        super().__init__(name="tfps-feeder", daemon=True)
        self.chief, self.server, self.graph, self.ops, self.source = chief, server, graph, ops, source
        self.halted = threading.Event()
        self.position = 0
        self.examples = 0
        self.ended_by: str | None = None
        self.error: Exception | None = None
        self.skipped: list[dict] = []
        self._next = 0
        self._sessions = 0
        self._steps: dict[int, tuple] = {}       # worker -> (its steps, when they last changed)
        self._taken: dict[int, int] = {}         # worker -> slices its process took (its board)
        self.requeued: list[int] = []            # slices queued again (a frozen or lost worker's)
        self._requeued: dict[int, int] = {}      # slice -> the claim it was queued again after
        self._unclaimed: dict[int, float] = {}   # slice -> since when it is out of the queue, unclaimed
        self._claimed: dict[int, tuple] = {}     # slice -> (its claim, when the feeder first saw it)
        self._stalled = False
        self._partition = None
        self._closed = False

    # ------------------------------------------------------------------ for hooks
    def where(self) -> dict:
        """The stream's position: slices done, the partition reached, the newest complete one."""
        src = self.source
        at = {"position": self.position, "examples": self.examples}
        if src.follow:
            avail = src.available(self.position)
            reached = src.slice(self.position).partition if self.position < avail else src.newest
            parts = src.manifest.partitions
            at.update(partition=reached, newest=src.newest,
                      behind=(len(parts) - 1 - parts.index(reached)) if reached in parts else 0)
        elif src.total is not None:
            at["total"] = src.total
        return at

    @property
    def caught_up(self) -> bool:
        """A followed job has trained every partition listed (it waits for the next)."""
        return self.source.follow and self.position >= self.source.available(self.position)

    def halt(self) -> None:
        self.halted.set()

    def join_end(self) -> Exception | None:
        """Stop the feeder (its queue is closed as it ends); its error, if any (a malformed partition)."""
        self.halt()
        self.join(timeouts.WATCH_READ_TIMEOUT_MS / 1000 + 5)
        return self.error

    def summary(self) -> dict:
        """The stream's figures for results.json."""
        out = self.where()
        out["slices_by_worker"] = {f"worker{i}": n for i, n in sorted(self._taken.items())}
        if self.requeued:
            out["requeued"] = list(self.requeued)
        if self.skipped:
            out["skipped"] = list(self.skipped)
        return out

    # ------------------------------------------------------------------ the loop
    def run(self) -> None:
        import tensorflow as tf
        v1 = tf.compat.v1
        options = v1.RunOptions(timeout_in_ms=timeouts.WATCH_READ_TIMEOUT_MS)
        sess = None
        try:
            while not self.halted.is_set() and not self.chief.sessions:
                time.sleep(0.1)
            sess = v1.Session(self.server.target, graph=self.graph,
                              config=session_config(self.chief.task, self.chief.cfg))
            while not self.halted.is_set():
                if self.chief.stop.requested:
                    self._end(sess, None, drain=True)
                    return
                try:
                    if self._tick(sess, options):
                        return
                except tf.errors.OpError as e:   # ps 0 away: the session is created again
                    log.debug("chief: feeder: %s", e.message.splitlines()[0] if e.message else e)
                    self._sessions = 0
                self.halted.wait(POLL_SECS)
            if not self._closed:   # the training loop ended (--train_steps, a failure): inputs end too
                self._end(sess, None, drain=True)
        except Exception as e:  # noqa: BLE001 - the training loop decides; the queue must close
            log.error("chief: the slice feeder failed: %s: %s", type(e).__name__, e)
            self.error = e
            if sess is not None:
                self._end(sess, None, drain=True)
        finally:
            if sess is not None:
                sess.close()

    def _tick(self, sess, options) -> bool:
        ops, src = self.ops, self.source
        src.poll()
        for p, why in getattr(src, "skipped_now", []):
            self.skipped.append({"partition": p, "error": why})
            self.chief.skipped_partition(p, why)
        if src.follow:
            src.skipped_now.clear()
        position, marks, claims, examples = sess.run(ops.state, options=options)
        if self._sessions != self.chief.sessions:   # a new session: the variables may have been restored
            self._sessions = self.chief.sessions
            n = int(sess.run(ops.size, options=options))
            if n:
                sess.run(ops.drain, feed_dict={ops.drain_n: n},
                         options=options)
            self._next = int(position)
            self._requeued.clear()
            if position:
                log.info("chief: the stream resumes after slice %d (the checkpointed position)", int(position) - 1)
        self.examples = int(examples)
        avail = src.available(int(position))
        new = advance(int(position), marks, avail)
        if new != position:
            sess.run(ops.set_position, feed_dict={ops.new_position: new}, options=options)
        self.position = new
        self._progress_line()
        if src.follow and src.error is not None:
            self._end(sess, src.error, drain=True)
            return True
        if self._ended(new, avail):
            self._end(sess, None, drain=False)
            return True
        self._enqueue(sess, options, marks, avail)
        self._requeue(sess, options, marks, claims)
        self._check_stall()
        return False

    def _ended(self, position: int, avail: int) -> bool:
        src, cfg = self.source, self.chief.cfg
        if not src.follow:
            if src.total is not None and position >= src.total:
                self.ended_by = "epochs"
            return self.ended_by is not None
        if src.until_reached(position):
            self.ended_by = "until"
            log.info("chief: --until %s is trained (slice %d); the job ends", src.until, position - 1)
        elif cfg.follow_idle and position >= avail and time.monotonic() - src.last_new_at >= cfg.follow_idle:
            self.ended_by = "follow_idle"
            log.info("chief: no new partition for %.0f s (--follow_idle) and every one is trained; the job "
                     "ends", cfg.follow_idle)
        return self.ended_by is not None

    def _enqueue(self, sess, options, marks, avail: int) -> None:
        ops = self.ops
        room = max(0, 2 * self.chief.task.num_workers + 2 - int(sess.run(ops.size, options=options)))
        limit = min(avail, self.position + RING)
        if self.source.follow and self.source.until is not None:
            limit = min(limit, sum(1 for s in self.source.manifest.slices if s.partition <= self.source.until))
        batch = []
        self._next = max(self._next, self.position)
        while self._next < limit and len(batch) < room:
            if not done(marks, self._next):
                batch.append(self._next)
            self._next += 1
        self._put(sess, options, batch)

    def _put(self, sess, options, ids: list[int]) -> None:
        if not ids:
            return
        ss = [self.source.slice(k) for k in ids]
        sess.run(self.ops.enqueue, options=options, feed_dict={
            self.ops.ids: np.array(ids, np.int64), self.ops.paths: [s.path.encode() for s in ss],
            self.ops.starts: np.array([s.start for s in ss], np.int64),
            self.ops.ends: np.array([s.end for s in ss], np.int64)})
        now = time.monotonic()
        for k in ids:
            self._unclaimed[k] = now

    def _requeue(self, sess, options, marks, claims) -> None:
        """Queue again the unfinished slice of a worker without a step for --sync_timeout, and a
        slice out of the queue that nobody claimed."""
        now = time.monotonic()
        boards = self.chief.ops.board.read_all(sess, options)
        for i, b in enumerate(boards):
            steps = None if b is None else int(b[0])
            if b is not None:
                self._taken[i] = int(b[-1])
            if i not in self._steps or self._steps[i][0] != steps:
                self._steps[i] = (steps, now)
        queued = int(sess.run(self.ops.size, options=options))
        again = []
        for k in range(self.position, self._next):
            if done(marks, k):
                self._unclaimed.pop(k, None)
                self._claimed.pop(k, None)
                continue
            w = claimed_by(claims, k)
            if w is None:
                since = self._unclaimed.setdefault(k, now)
                if queued == 0 and now - since > ORPHAN_SECS:
                    log.warning("chief: slice %d left the queue unclaimed (a request cut short); queued again", k)
                    again.append(k)
                continue
            self._unclaimed.pop(k, None)
            claim = int(claims[k % RING])
            if self._claimed.get(k, (None,))[0] != claim:
                self._claimed[k] = (claim, now)
            if w == self.chief.task.index or self._requeued.get(k) == claim:
                continue
            # no step since it took the slice (an idle worker waiting for data took none before)
            if now - max(self._steps.get(w, (None, now))[1], self._claimed[k][1]) > self.chief.cfg.sync_timeout:
                log.warning("chief: worker %d made no step for --sync_timeout (%.0f s); its slice %d goes to "
                            "the next worker", w, self.chief.cfg.sync_timeout, k)
                self._requeued[k] = claim
                self.requeued.append(k)
                again.append(k)
        self._put(sess, options, again)

    def _end(self, sess, error, drain: bool) -> None:
        """Close the queue: every worker's input ends (after what is queued, unless ``drain``)."""
        import tensorflow as tf
        self.error = self.error or error
        try:
            if drain:
                n = int(sess.run(self.ops.size))
                if n:
                    sess.run(self.ops.drain, feed_dict={self.ops.drain_n: n})
            sess.run(self.ops.close)
            self._closed = True
        except tf.errors.OpError as e:
            log.debug("chief: closing the slice queue: %s", e.message.splitlines()[0] if e.message else e)
        self.halted.set()

    def _progress_line(self) -> None:
        if not self.source.follow:
            return
        at = self.where()
        if at["partition"] != self._partition:
            self._partition = at["partition"]
            log.info("chief: stream at partition %s (slice %d); newest complete %s, %d partition(s) behind",
                     at["partition"], self.position, at["newest"], at["behind"])

    def _check_stall(self) -> None:
        cfg, src = self.chief.cfg, self.source
        if not src.follow or not cfg.stall_timeout:
            return
        quiet = time.monotonic() - src.last_new_at
        if quiet < cfg.stall_timeout:
            self._stalled = False
        elif not self._stalled:
            self._stalled = True
            self.chief.stream_stalled(quiet, src.newest)


def make_source(cfg, schema, num_workers: int):
    """The feeder's source: the followed partitions, or the finite data's slices."""
    if cfg.follow:
        return FollowSource(cfg, schema)
    slices = stream.plan_slices(schema.files, schema.fmt, num_workers, cfg.batch_size)
    log.info("chief: %d training file(s) in %d slice(s), handed out in order to whichever worker asks next",
             len(schema.files), len(slices))
    return FiniteSource(slices, cfg.epochs)

