"""Several training steps per ``session.run``, and as few worker <-> ps transfers a step as
the algorithm allows.

``step_loop`` runs up to K async steps per call (K from ``StepsPerRunHook``: 1, then doubling
up to about ``timeouts.STEPS_PER_RUN_SECS`` a run); ``PackedReads`` builds a model so that it
reads the variables of each ps as one tensor; ``apply_packed`` sends a step's dense gradients to each
ps as one tensor. Sync steps (tfps's own aggregation) are in ``tfps.task.graph.syncagg``. Why and
the measurements: docs/design/steps.md.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time

import tensorflow as tf

from tfps import compat, timeouts

v1 = tf.compat.v1
log = logging.getLogger("tfps")

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


class PackedReads:
    """The variables a step reads from each ps, read there as one tensor before the model is built.

    ``build(model, *inputs)`` builds ``model(*inputs)`` (a model function that creates its
    variables with ``tf.compat.v1.get_variable``) so that it gets, instead of each small
    float32 variable on a ps, that variable's part of one tensor: its ps reads all of them,
    flattens and joins them, the worker splits the joined tensor again (one transfer per ps
    instead of one per variable). The gradients are the optimizer's own, with respect to the
    variables: they flow back through the split and the join (copies), as if the model had
    read each variable itself, and a variable also read elsewhere (a regularizer) gets the
    sum of both.

    The model is built twice: first in a graph of its own (its inputs as placeholders), to
    learn which variables it creates and whether they can be read this way, then for real.
    The first of those variables the real build asks for creates them all (as the model
    would, in its order), and the joined reads are built then, before the model uses any.
    A variable that is not float32 or larger than ``PACK_MAX_ELEMENTS`` is read on its own
    (its own transfer) but built the same way. Left to the model: variables created by
    tf_keras (created while its ``add_weight`` runs: ``tfps.compat.in_keras_add_weight``; its
    layers read their weights themselves), a variable the model gathers rows
    from (an embedding: only the rows travel) or assigns to, split or not trainable; and
    every variable when the first build fails, or the inputs are not plain tensors.

    ``step_value``: the global step read on its ps (int64), whose copy on the worker
    ``step_read`` gives. It joins the reads of its ps (as the two 32-bit halves of its bits),
    or, ``wait_for_step`` (backup workers: the step a gradient is fresh for is read before
    its variables), every read built here waits for it and it travels alone. ``pack`` False: no
    rehearsal, the model reads its variables itself (a tf_keras model, whose layers hold
    their weights: a rehearsal would only cost its build time).
    """

    def __init__(self, worker_device: str, step_value=None, wait_for_step: bool = False, pack: bool = True):
        self.worker_device, self.step_value, self.wait_for_step = worker_device, step_value, wait_for_step
        self.pack = pack
        self.plan: dict[str, dict] = {}     # full name -> get_variable's arguments, in creation order
        self.values: dict[str, object] = {}  # full name -> what the model gets (a part, or the variable)
        self._step_part = None

    def build(self, model, *inputs):
        """``model(*inputs)`` with the packed reads."""
        self.plan = _rehearse(model, inputs) if self.pack else {}
        if not self.plan:
            return model(*inputs)
        with v1.variable_scope(v1.get_variable_scope(), custom_getter=self._get):
            return model(*inputs)

    def _get(self, getter, name, *args, **kwargs):
        if name in self.values:
            return self.values[name]
        if name not in self.plan:
            return getter(name, *args, **kwargs)
        self._read_all(getter)
        return self.values[name]

    def _read_all(self, getter) -> None:
        by_ps: dict[str, list] = {}
        alone = []   # too large (or not float32) to join: read on their own, as the model would
        for name, kwargs in self.plan.items():
            var = getter(name, **{**kwargs, "reuse": v1.AUTO_REUSE})
            self.values[name] = var
            if isinstance(var, tf.Variable) and var.trainable and _task_of(var.device)[0] == "ps":
                if _packable(var.dtype.base_dtype, var.shape):
                    by_ps.setdefault(var.device, []).append((name, var))
                else:
                    alone.append((name, var))
        step = None if self.wait_for_step else self.step_value
        with v1.control_dependencies([self.step_value.op] if self.wait_for_step else []):
            for name, var in alone:
                with tf.device(var.device):
                    self.values[name] = var.value()
            for device, group in by_ps.items():
                with tf.device(device):
                    reads = [var.value() for _, var in group]
                with_step = step is not None and _task_of(step.device) == _task_of(device)
                if with_step:
                    with tf.device(step.device):
                        reads.append(tf.bitcast(step, tf.float32))
                if len(reads) == 1:
                    parts = reads
                else:
                    parts = _split(_join(reads, device), [r.shape for r in reads], self.worker_device)
                if with_step:
                    with tf.device(self.worker_device):
                        self._step_part = tf.bitcast(parts[-1], tf.int64)
                for (name, _), part in zip(group, parts):
                    self.values[name] = part

    def step_read(self, name: str = "global_step_read"):
        """The worker's copy of ``step_value``: from the joined reads of its ps, else its own transfer."""
        with tf.device(self.worker_device):
            return tf.identity(self._step_part if self._step_part is not None else self.step_value, name=name)


#: Ops that may use a variable whose value a model gets as a part of the joined reads.
_READ_ONLY = {"ReadVariableOp", "VarIsInitializedOp"}


def _rehearse(model, inputs) -> dict:
    """Build ``model(*inputs)`` in a graph of its own, each candidate variable given as a
    read (a tensor, as the real build will give its part). Returns full name -> arguments of
    the ``get_variable`` calls whose variables can be packed, {} if none or if the model
    cannot be built so."""
    leaves = tf.nest.flatten(inputs)
    if not all(isinstance(t, tf.Tensor) for t in leaves):
        return {}
    calls: dict[str, tuple] = {}

    def record(getter, name, *args, **kwargs):
        var = getter(name, *args, **kwargs)
        if name in calls:
            return calls[name][2]
        init = kwargs.get("initializer")
        if (isinstance(var, tf.Variable) and var.trainable and not isinstance(init, (tf.Tensor, tf.Variable))
                and not compat.in_keras_add_weight()):
            value = var.value()
            calls[name] = (kwargs, var, value)
            return value
        calls[name] = (None, var, var)
        return var

    graph = tf.Graph()
    try:
        with graph.as_default():
            stand_ins = tf.nest.pack_sequence_as(inputs, [v1.placeholder(t.dtype, t.shape) for t in leaves])
            v1.train.get_or_create_global_step()   # as the real graph has one (a model may read it)
            # A tf_keras layer's weights stay Keras's: marked while its add_weight runs (tfps.compat).
            marked = compat.keras_add_weight_wrapped() if "tf_keras" in sys.modules else contextlib.nullcontext()
            with v1.variable_scope(v1.get_variable_scope(), custom_getter=record), marked:
                model(*stand_ins)
    except Exception as e:  # noqa: BLE001 - any failure leaves the reads to the model; its own build says why
        log.info("packed reads off: the model could not be built with its variables' values as tensors (%s: %s)",
                 type(e).__name__, str(e).splitlines()[0] if str(e) else "")
        return {}
    plan = {}
    for name, (kwargs, var, value) in calls.items():
        if kwargs is None:
            continue
        users = {op.type for op in var.handle.consumers() if op is not var.initializer}
        if users <= _READ_ONLY and not _gathered(value):
            plan[name] = kwargs
    return plan


def _gathered(tensor) -> bool:
    """Whether rows of ``tensor`` are gathered (an embedding), directly or through identities."""
    for op in tensor.consumers():
        if op.type.startswith(("Gather", "ResourceGather", "SparseSegment")):
            return True
        if op.type == "Identity" and _gathered(op.outputs[0]):
            return True
    return False


class StepsPerRunHook(v1.train.SessionRunHook):
    """Feeds K, the steps of the next run: 1, then doubling up to about ``target_secs`` a run.

    With ``budget`` (``--epochs``: this worker's passes over its data, in steps) no run goes
    past it (``steps``, the loop's count, is fetched), and once it is reached the session
    stops and ``on_done(steps taken)`` is called: the data is never read past its end.
    """

    def __init__(self, bound, max_steps: int, target_secs: float = timeouts.STEPS_PER_RUN_SECS, *,
                 steps=None, budget: int | None = None, on_done=None):
        self.bound, self.max_steps, self.target_secs = bound, max(1, max_steps), target_secs
        self.k = 1
        self.t0 = 0.0
        self.steps, self.budget, self.on_done = steps, budget, on_done
        self.taken = 0     # steps of this process (budget only)
        self.fed = 1

    def before_run(self, run_context):
        self.t0 = time.monotonic()
        self.fed = self.k if self.budget is None else max(0, min(self.k, self.budget - self.taken))
        return v1.train.SessionRunArgs(self.steps if self.budget is not None else None,
                                       feed_dict={self.bound: self.fed})

    def after_run(self, run_context, run_values):
        per_step = max(time.monotonic() - self.t0, 1e-6) / max(1, self.fed)
        self.k = int(max(1, min(self.max_steps, 2 * self.k, self.target_secs / per_step)))
        if self.budget is None:
            return
        self.taken += int(run_values.results)
        if self.taken >= self.budget:
            run_context.request_stop()
            if self.on_done is not None:
                self.on_done(self.taken)
                self.on_done = None
