"""The job's slice queue on ps 0: work handed out in stream order to whichever worker asks next.

The chief numbers the slices of the input (tfps.data.stream: row ranges of a finite
``--train_data``, the files of followed partitions) and enqueues them, in order, on one
``FIFOQueue`` on ps 0 (shared by name, like the done tokens). Each worker's input pipeline
takes the next slice when it needs one (``claims``), so a slow worker takes fewer and all
move through the stream together. The state lives in variables on ps 0:

* ``tfps_stream/position``: P, the slices done without a gap (saved in every checkpoint);
* ``tfps_stream/marks``: a ring of RING done marks: slice k is done once
  ``marks[k % RING] >= k + 1``; the last batch of a slice sets its mark (``scatter_max``) in
  the same run as, and after, its update of the model, so a checkpoint never counts a
  slice done whose rows it does not hold. The chief never hands out a slice at or past
  P + RING, so a mark is never overwritten before P passes it;
* ``tfps_stream/claims``: who took slice k (``k * 1024 + worker + 1`` at ``k % RING``), so that
  the chief gives a frozen or lost worker's unfinished slice to another;
* ``tfps_stream/examples``: the examples trained, counted by every step.

The chief's ``Feeder`` (a thread) lists, enqueues, advances the position and decides the end
of a followed job. What the position guarantees: docs/explanation/continuous-training.md.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np

from tfps import timeouts
from tfps.data import dataset as data_mod
from tfps.errors import ConfigError
from tfps.task.runtime.session import session_config

log = logging.getLogger("tfps")

#: The ring of done marks: the most slices handed out past the position.
RING = 4096
#: claims[k % RING] = k * CLAIM_BASE + worker + 1
CLAIM_BASE = 1024
#: How long a worker's input waits for the next slice per run, before it looks at its stop.
DEQUEUE_WAIT_MS = 2000


class SliceOps:
    """The queue and the variables of the stream on ps 0, and the ops that use them, in the
    training graph of every worker (built outside the device setter)."""

    def __init__(self, index: int):
        import tensorflow as tf
        v1 = tf.compat.v1
        i64 = tf.int64
        self.index = index
        with v1.device("/job:ps/task:0"):
            self.queue = v1.FIFOQueue(2 * RING, [i64, tf.string, i64, i64], shapes=[[], [], [], []],
                                      shared_name="tfps_slices", name="tfps_slices")

            def var(name, shape):
                return v1.get_variable(f"tfps_stream/{name}", shape=shape, dtype=i64,
                                       initializer=v1.zeros_initializer(), trainable=False)
            self.position = var("position", [])
            self.marks = var("marks", [RING])
            self.claims = var("claims", [RING])
            self.examples = var("examples", [])
            # a worker's input: the next slice, and its claim
            sid, path, start, end = self.queue.dequeue()
            claim = v1.scatter_update(self.claims, [sid % RING], [sid * CLAIM_BASE + index + 1])
            with tf.control_dependencies([claim]):
                self.take = [tf.identity(sid), tf.identity(path), tf.identity(start), tf.identity(end)]
            # the chief's feeder
            self.ids = v1.placeholder(i64, [None], name="tfps_slice_ids")
            self.paths = v1.placeholder(tf.string, [None], name="tfps_slice_paths")
            self.starts = v1.placeholder(i64, [None], name="tfps_slice_starts")
            self.ends = v1.placeholder(i64, [None], name="tfps_slice_ends")
            self.enqueue = self.queue.enqueue_many([self.ids, self.paths, self.starts, self.ends])
            self.size = self.queue.size()
            self.close = self.queue.close(cancel_pending_enqueues=True)
            self.drain_n = v1.placeholder(tf.int32, [], name="tfps_drain_n")
            self.drain = self.queue.dequeue_up_to(self.drain_n)
            self.new_position = v1.placeholder(i64, [], name="tfps_new_position")
            self.set_position = self.position.assign(self.new_position).op
            self.state = [self.position.read_value(), self.marks.read_value(), self.claims.read_value(),
                          self.examples.read_value()]

    def step_updates(self, sid, last, count):
        """The ops a training step runs after its update: count its examples and, on a slice's
        last batch, mark the slice done."""
        import tensorflow as tf
        v1 = tf.compat.v1
        with v1.device("/job:ps/task:0"):
            mark = v1.scatter_max(self.marks, [sid % RING], [tf.where(last, sid + 1, tf.zeros_like(sid))])
            counted = self.examples.assign_add(tf.cast(count, tf.int64))
        return tf.group(mark, counted)


def done(marks: np.ndarray, k: int) -> bool:
    return int(marks[k % RING]) >= k + 1


def advance(position: int, marks: np.ndarray, limit: int) -> int:
    """The position after the marks: the first slice (below ``limit``) not done."""
    while position < limit and done(marks, position):
        position += 1
    return position


def claimed_by(claims: np.ndarray, k: int) -> int | None:
    """The worker that took slice k, or None when nobody did (or the record is of another slice)."""
    v = int(claims[k % RING])
    return v % CLAIM_BASE - 1 if v // CLAIM_BASE == k and v % CLAIM_BASE else None


# ------------------------------------------------------------------------ a worker's input
def slice_specs(session_factory, ops: SliceOps, stopping, name: str, job=None):
    """The generator of a worker's input: the slices it takes from the queue, in order, until
    the queue is closed (the job's data ended) or ``stopping()``; ``job.slices_taken`` counts them."""
    import tensorflow as tf
    v1 = tf.compat.v1

    held: list = []   # the session that takes slices: closed by ``close()`` after training, never by the
    #                   generator (its end runs as the training session closes, and two closes wait on each other)

    def session():
        if not held:
            held.append(session_factory())
        return held[0]

    def drop() -> None:
        if held:
            held.pop().close()

    def gen():
        options = v1.RunOptions(timeout_in_ms=DEQUEUE_WAIT_MS)
        active.set()
        try:
            while not stopping():
                try:
                    sid, path, start, end = session().run(ops.take, options=options)
                except tf.errors.DeadlineExceededError:
                    if job is not None:   # waiting for the next slice (a followed job's next partition)
                        job.watchdog.extend()
                    continue
                except (tf.errors.OutOfRangeError, tf.errors.CancelledError):
                    log.info("%s: the slice queue is closed: no more input", name)
                    if job is not None:   # the final save follows, however long this worker waited
                        job.watchdog.extend()
                    return
                except tf.errors.OpError as e:
                    log.debug("%s: taking a slice: %s", name, e.message.splitlines()[0] if e.message else e)
                    drop()
                    time.sleep(1.0)
                    continue
                if job is not None:
                    job.slices_taken += 1
                active.clear()
                yield int(sid), path, int(start), int(end)
                active.set()
        finally:
            active.clear()

    def idle(timeout: float) -> bool:
        """Wait until the generator runs no code (it is never called again once ``stopping()``):
        the session must not close while it runs (a close that waits for the input's thread,
        which waits for the interpreter's lock, never ends)."""
        end = time.monotonic() + timeout
        while active.is_set() and time.monotonic() < end:
            time.sleep(0.05)
        return not active.is_set()

    active = threading.Event()
    gen.idle, gen.close = idle, drop
    return gen


def slice_dataset(schema, label_column: str, batch_size: int, gen, shuffle_seed: int | None):
    """(features, labels, slice id, last batch of its slice) batches of the slices ``gen``
    yields, each slice read whole and batched on its own (its last batch may be smaller)."""
    import tensorflow as tf

    specs = tf.data.Dataset.from_generator(gen, output_signature=(
        tf.TensorSpec([], tf.int64), tf.TensorSpec([], tf.string), tf.TensorSpec([], tf.int64),
        tf.TensorSpec([], tf.int64)))
    read = slice_reader(schema, label_column, batch_size)

    @data_mod.plain_function
    def one(sid, path, start, end):
        rows = end - start
        batches = read(path, start, rows, None if shuffle_seed is None else shuffle_seed + sid)
        last = (rows + batch_size - 1) // batch_size - 1
        return batches.enumerate().map(lambda i, b: (b[0], b[1], sid, tf.equal(i, last)))

    return specs.flat_map(one).prefetch(1)


def slice_reader(schema, label_column: str, batch_size: int):
    """``read(path, start, rows, seed)``: a dataset of the (features, labels) batches of rows
    [start, start + rows) of one file (tensors; a CSV's header is not a row), shuffled
    within the slice when ``seed`` is given: the input of the slice queue (tfps.task.graph.slicequeue)."""
    import tensorflow as tf

    files = list(schema.files)
    label_dtype = tf.int64 if schema.num_classes else tf.float32

    def shuffled(ds, seed, size):
        return ds if seed is None else ds.shuffle(size, seed=seed)

    if schema.fmt == "csv":
        parse, nonblank = data_mod.csv_parser(schema, label_column, files)

        def read(path, start, rows, seed):
            lines = shuffled(tf.data.TextLineDataset(path).skip(1 + start).take(rows), seed, 4096)
            return lines.batch(batch_size).map(lambda b: parse(nonblank(b)))
    elif schema.fmt == "tfrecord":
        parse = data_mod.tfrecord_parser(schema, label_column, files)

        def read(path, start, rows, seed):
            records = shuffled(tf.data.TFRecordDataset(path).skip(start).take(rows), seed, 4096)
            return records.map(parse).batch(batch_size)
    elif schema.fmt == "npz":
        def load(path, start, rows):
            x, y = data_mod._load_npz(path.decode(), label_column, "train_data")
            y = np.asarray(y).reshape(len(y), -1)[:, 0]
            return x[start:start + rows], y[start:start + rows].astype(label_dtype.as_numpy_dtype)

        def read(path, start, rows, seed):
            x, y = tf.numpy_function(load, [path, start, rows], [tf.float32, label_dtype])
            x.set_shape([None, *schema.feature_shape])
            y.set_shape([None])
            return shuffled(tf.data.Dataset.from_tensor_slices((x, y)), seed, 4096).batch(batch_size)
    else:
        raise ConfigError(f"the slice queue reads CSV, TFRecord and npz files, not {schema.fmt}; use "
                          "--input_split static", "input_split")
    return read


def worker_input(worker, setup, graph, ops: SliceOps):
    """A worker's input through the slice queue: (its dataset, the generator of its slices)."""
    import tensorflow as tf
    cfg, task = worker.cfg, worker.task
    specs = slice_specs(lambda: tf.compat.v1.Session(worker.server.target, graph=graph,
                                                     config=session_config(task, cfg)),
                        ops, lambda: worker.stop.requested or worker.input_over, task.name, worker)
    return slice_dataset(setup.schema, cfg.label_column, cfg.batch_size, specs,
                         None if cfg.follow else cfg.seed), specs


def run_options():
    """The RunOptions of a training run that reads the slice queue (timeouts.QUEUE_RUN_TIMEOUT_MS)."""
    import tensorflow as tf
    return tf.compat.v1.RunOptions(timeout_in_ms=timeouts.QUEUE_RUN_TIMEOUT_MS)
