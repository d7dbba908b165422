"""Several training steps per ``session.run``, and as few worker <-> ps transfers a step as
the algorithm allows.

``step_loop`` runs up to K async steps per call (K from ``StepsPerRunHook``: 1, then doubling
up to about ``timeouts.STEPS_PER_RUN_SECS`` a run); ``with_packed_reads`` brings the values a
step reads from each ps as one tensor; ``apply_packed`` sends a step's dense gradients to each
ps as one tensor. Sync steps (tfps's own aggregation) are in ``tfps.task.syncagg``. Why and
the measurements: docs/design/steps.md.
"""

from __future__ import annotations

import time

import tensorflow as tf

from tfps import compat, timeouts

v1 = tf.compat.v1

#: Tensors of at most this many float32 values (1 MiB) are packed. A transfer's own cost
#: is that of a small tensor's bytes many times over; a larger tensor travels alone rather
#: than be copied into and out of a joined one every step.
PACK_MAX_ELEMENTS = 1 << 18


def step_loop(step_fn, global_step, last_step: int):
    """Build the loop. ``step_fn()`` builds one step and returns (train_op, loss, metrics).

    Returns (train_op, steps, loss, metrics, bound): ``train_op`` runs ``bound`` steps (at
    most; fewer at ``last_step``), ``steps`` is how many it ran, ``loss`` and ``metrics``
    are those of its last step, ``bound`` the placeholder (default 1) that sets K.
    """
    bound = v1.placeholder_with_default(tf.constant(1, tf.int32), [], name="steps_per_run")
    keys: list[str] = []

    def cond(i, step, _values):
        return tf.logical_and(i < bound, step < last_step)

    def body(i, _step, _values):
        train_op, loss, metrics = step_fn()
        keys.extend(metrics)
        with v1.control_dependencies([train_op]), tf.device(global_step.device):
            # The global step after this update: the next condition needs no read of its own.
            step = tf.identity(global_step.read_value())
        return i + 1, step, _stacked(loss, metrics, keys)

    steps, _, values = v1.while_loop(
        cond, body, [tf.constant(0), global_step.read_value(), tf.zeros([0], tf.float32)],
        shape_invariants=[tf.TensorShape([]), tf.TensorShape([]), tf.TensorShape([None])],
        parallel_iterations=1, back_prop=False, name="train_steps")
    loss, metrics = _last_values(steps, values, keys)
    return steps.op, steps, loss, metrics, bound


def _stacked(loss, metrics: dict, keys: list):
    """Loss and metrics leave a loop as one float32 vector (their count is only known once
    the model is built, inside the loop)."""
    return tf.stack([tf.cast(loss, tf.float32)] + [tf.cast(metrics[k], tf.float32) for k in keys])


def _last_values(steps, values, keys: list) -> tuple:
    """The loss and metrics of a loop's last step. A run that starts at the last step
    (another worker took it) runs no step and has no loss: zeros, which ProgressHook skips
    (it sees ``steps`` 0)."""
    values = tf.cond(steps > 0, lambda: values, lambda: tf.zeros([len(keys) + 1], tf.float32))
    values.set_shape([len(keys) + 1])
    return values[0], {k: values[j + 1] for j, k in enumerate(keys)}


def apply_packed(opt, loss, global_step, worker_device: str):
    """``opt.minimize(loss, global_step)`` with each ps's dense gradients sent as one tensor.

    The gradients of the variables on one ps (float32, dense) are flattened and joined on
    the worker, the joined tensor is split again on that ps, and the optimizer applies the
    parts there, exactly as ``minimize`` would: same gradients, same update. Sparse
    gradients (``IndexedSlices``), other dtypes, variables larger than
    ``PACK_MAX_ELEMENTS`` and variables without a gradient keep their own path. The
    optimizer's own tensors (its constants, the global step's increment) are made on the
    global step's ps (the one ps of most jobs), so that no step sends them there.
    """
    pairs = opt.compute_gradients(loss)
    by_ps: dict[str, list] = {}
    kept = []
    for g, v in pairs:
        if isinstance(g, tf.Tensor) and _packable(g.dtype, v.shape):
            by_ps.setdefault(v.device, []).append((g, v))
        else:
            kept.append((g, v))
    for device, group in by_ps.items():
        if len(group) == 1:
            kept.extend(group)
            continue
        parts = _send_joined([g for g, _ in group], [v.shape for _, v in group], worker_device, device)
        kept.extend((p, v) for p, (_, v) in zip(parts, group))
    with tf.device(global_step.device):
        return opt.apply_gradients(kept, global_step=global_step)


def _packable(dtype, shape) -> bool:
    return dtype == tf.float32 and shape.is_fully_defined() and shape.num_elements() <= PACK_MAX_ELEMENTS


def _send_joined(tensors, shapes, from_device: str, to_device: str) -> list:
    """``tensors`` as one transfer: flattened and joined on ``from_device``, split there
    again on ``to_device`` and given back their ``shapes``."""
    return _split(_join(tensors, from_device), shapes, to_device)


def _join(tensors, device: str):
    with tf.device(device):
        return tf.concat([tf.reshape(t, [-1]) for t in tensors], 0)


def _split(joined, shapes, device: str) -> list:
    with tf.device(device):
        parts = tf.split(joined, [shape.num_elements() for shape in shapes])
        return [tf.reshape(part, shape) for part, shape in zip(parts, shapes)]


def _task_of(device: str) -> tuple:
    spec = tf.DeviceSpec.from_string(device or "")
    return spec.job, spec.replica or 0, spec.task or 0


def _variable_device(read) -> str:
    """Where a ReadVariableOp runs: its own device, else the device of the variable it was
    passed (a read without a device is placed next to its variable at run time; in a loop
    body the variable is a captured tensor, outside a loop the variable's handle op)."""
    if read.device:
        return read.device
    captured = {inner.ref(): outer for outer, inner in getattr(read.graph, "captures", ())}
    outer = captured.get(read.inputs[0].ref())
    if outer is not None:
        return outer.device
    return read.inputs[0].op.device


def _use_instead(tensor, other, users) -> None:
    """Make each op of ``users`` read ``other`` where it read ``tensor``."""
    for user in users:
        for j, x in enumerate(user.inputs):
            if x is tensor:
                compat.update_op_input(user, j, other)


def with_packed_reads(step_fn, worker_device: str, reads_after=None, step_read=None):
    """``step_fn`` (which builds one step), with the reads of the step it builds packed.
    ``reads_after``: an op every read the step sends to the worker waits for (backup workers:
    the global step's read, see ``pack_accumulator_inputs``). ``step_read`` (sync steps, one
    per run): the worker's copy of the global step's read (an identity of the read on its
    ps), which then travels in the packed reads of that ps too: one transfer fewer a step."""
    def step():
        graph = v1.get_default_graph()   # inside the loop: the loop body's graph
        first = len(graph.get_operations())
        built = step_fn()
        sending = pack_reads(graph.get_operations()[first:], worker_device, step_read)
        if reads_after is not None:
            for op in sending:
                compat.add_control_input(op, reads_after)
        return built
    return step


def pack_reads(ops, worker_device: str, step_read=None) -> list:
    """Send the variable values a step reads from each ps as one tensor instead of one per read.

    ``ops`` are the ops a step built. Every float32 variable read that runs on a ps and is
    used on ``worker_device`` (the forward and backward pass) is rewired: the ps flattens
    and joins its reads into one tensor, the worker splits it again, and the users of each
    read take their part, the same values. A read that waits for something (a control
    input, e.g. after an update) or is larger than ``PACK_MAX_ELEMENTS`` keeps its own
    transfer. TensorFlow has no public way to change the input of a built op: its internal
    one is ``compat.update_op_input`` (checked when the task starts).

    ``step_read``: an identity on the worker of the global step's read (int64) on its ps;
    that read joins the packed reads of its ps (as the two 32-bit halves of its bits) and
    the identity takes it from there.

    Returns the ops on a ps whose values the worker receives: the joined reads, and the
    reads that travel alone.
    """
    worker = _task_of(worker_device)
    by_ps: dict[str, list] = {}
    sending = []
    for op in ops:
        if op.type != "ReadVariableOp" or op.control_inputs or op.inputs[0].op.inputs:
            continue
        device = _variable_device(op)
        if _task_of(device)[0] != "ps":
            continue
        users = [c for c in op.outputs[0].consumers() if _task_of(c.device) == worker]
        if not users:
            continue
        if _packable(op.outputs[0].dtype, op.outputs[0].shape):
            by_ps.setdefault(device, []).append((op.outputs[0], users))
        else:
            sending.append(op)
    step_value = step_read.op.inputs[0] if step_read is not None else None
    for device, reads in by_ps.items():
        with_step = step_value is not None and _task_of(step_value.device) == _task_of(device)
        if with_step:
            with tf.device(step_value.device):
                reads = [*reads, (tf.bitcast(step_value, tf.float32), [])]
        if len(reads) < 2:
            sending.append(reads[0][0].op)
            continue
        joined = _join([t for t, _ in reads], device)
        sending.append(joined.op)
        parts = _split(joined, [t.shape for t, _ in reads], worker_device)
        if with_step:
            with tf.device(worker_device):
                compat.update_op_input(step_read.op, 0, tf.bitcast(parts[-1], tf.int64))
        for value, (t, users) in zip(parts, reads):
            _use_instead(t, value, users)
    return sending


class StepsPerRunHook(v1.train.SessionRunHook):
    """Feeds K, the steps of the next run: 1, then doubling up to about ``target_secs`` a run."""

    def __init__(self, bound, max_steps: int, target_secs: float = timeouts.STEPS_PER_RUN_SECS):
        self.bound, self.max_steps, self.target_secs = bound, max(1, max_steps), target_secs
        self.k = 1
        self.t0 = 0.0

    def before_run(self, run_context):
        self.t0 = time.monotonic()
        return v1.train.SessionRunArgs(None, feed_dict={self.bound: self.k})

    def after_run(self, run_context, run_values):
        per_step = max(time.monotonic() - self.t0, 1e-6) / self.k
        self.k = int(max(1, min(self.max_steps, 2 * self.k, self.target_secs / per_step)))
