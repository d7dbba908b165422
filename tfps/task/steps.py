"""Several training steps per ``session.run`` (async training), as TPU iterations_per_loop.

In a ps cluster every ``session.run`` costs more than the step itself: the Python hooks,
the master's call to each partition (this worker and every ps), the fetches. An async
worker therefore runs a ``tf.while_loop`` of up to K steps per call: each iteration takes
the next batch, computes the gradients and applies them on the ps exactly as a single
step does, so the training is the same, step for step.

K is fed to the loop at every call (``StepsPerRunHook``): the first run is one step (the
"first training step" that start-up is measured by), then K doubles until a run takes
about ``timeouts.STEPS_PER_RUN_SECS``, never more than ``--log_steps``. Between two runs
the hooks do what they did between two steps, so a stop signal or the chief's stop flag
is honoured within one run (about as often as the flag is read anyway), and the loop ends
at the last step itself, not K steps later. Like any async job, workers that start a step
at the same moment may each finish it, so the job can end a step or two (fewer than the
number of workers) past ``--train_steps``.

Sync training runs K steps per run the same way (``sync_step_loop``). SyncReplicasOptimizer
builds its graph once, outside the loop (its accumulators, the chief's update, the token
queue); each iteration gives the step's gradients to the accumulators with the step they
belong to (the token of the iteration before) and takes a token, as SyncReplicasOptimizer's
own worker step does. The chief's queue runner applies each step as before. The loop also
ends at a token that the chief gives out to release waiting workers (at its end, or, with
backup workers, a restarted chief's start), so that the hooks see the stop or the end. A model
with a sparse gradient (an embedding) keeps one step per run: a sparse accumulator cannot
be used inside a loop. In a 1 ps, 2 worker CNN job (300 steps, alternating runs) the loop
took training from 4.56 s to 3.88 s (medians of 3).

Each step also moves as few tensors between the worker and the ps as the algorithm
allows. A transfer costs both processes CPU time (a gRPC call and several thread
hand-offs), far more than the bytes of a small model: on 2 cores, the 19 transfers of an
async CNN step were most of its time. Now an async step makes 5 (with one ps):

* ``with_packed_reads``: the variable values a step reads from each ps come as one tensor,
  joined on the ps and split again on the worker (one transfer per ps instead of one per
  read; the sync step uses it too);
* ``apply_packed`` sends a step's dense gradients to each ps as one tensor, split there
  again before the update, and makes the optimizer's constants (learning rate, Adam's
  betas and epsilon) on the ps that applies it instead of sending them every step;
* the loop's condition tests the global step read on the ps right after this worker's
  previous update (one read, which also carries the "update applied" dependency back),
  instead of a read of its own before every step;
* the loop's own control (its condition to the ps, the ps's "next iteration" back).

A sync step (one per run) made 28 transfers with the MLP (1 ps; a RunOptions trace of each
worker's runs): 6 variable reads (``pack_reads`` missed reads outside a loop), 6 gradients
and 6 reads of the local step (one per accumulator), 7 for the hooks' read of the global
step (a ``cond`` split between worker and ps) and 1 for the progress line's, the global
step read for the dropped-gradient count, which also held back the chief's update, and the
token. Now it makes 3, whatever the number of variables (with one ps):

* the packed reads, as above, with the read of the global step that the hooks, the
  progress line and the dropped count share (``compat.share_global_step_read``) joined to
  those of its ps;
* ``apply_sync_packed``: the dense gradients and the local step, one tensor to each ps;
* the token.

Async runs share that one read of the global step too (its own transfer: their reads are
inside the loop).

Backup workers (``--backup_workers``: each step aggregates fewer gradients than there are
workers) change two things, both only then (``pack_accumulator_inputs``,
``take_fresh_token``): a gradient carries the later of its token and the global step read
before its variables, and a worker waits for a token newer than the step it gave a gradient
to. SyncReplicasOptimizer gives every worker a token per step, so the tokens of a frozen
worker pile up, and the others, always finding one, started steps from variables about to
change and saw their gradients dropped: a 20 s freeze of one of 3 workers cost 28% of the
job's steps in it, now 0-5%. The global step is then read before the variables (its own
transfer) and once more as the gradients reach its ps (the dropped count's comparison).
"""

from __future__ import annotations

import time
from typing import NamedTuple

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


#: The ops by which SyncReplicasOptimizer gives a worker's gradient to its accumulator on a ps.
ACCUMULATOR_APPLY_OPS = ("AccumulatorApplyGradient", "ResourceAccumulatorApplyGradient",
                         "SparseAccumulatorApplyGradient")


class SyncStep(NamedTuple):
    """What ``apply_sync_packed`` built: the train op (SyncReplicasOptimizer's: the token
    assigned to the local step), the step this run's gradient carries (on the worker) and
    the global step as the gradient reached its ps; the gradient was dropped as stale when
    the first is behind the second (a lower bound: the accumulator's own step, which decides,
    cannot be read)."""
    train: object
    sent_step: object
    arrived_at: object


def apply_sync_packed(opt, loss, global_step, worker_device: str, after=None, fresh_from=None,
                      last_step=None) -> SyncStep:
    """``opt.minimize(loss, global_step)`` for a ``SyncReplicasOptimizer``, with each ps's
    dense gradients and the step they were computed at sent as one tensor.

    ``SyncReplicasOptimizer`` builds one accumulator per variable on that variable's ps and,
    for each, an op that gives it this worker's gradient and this worker's local step (the
    step the gradient belongs to; an older one is dropped as stale). Each such op receives
    its gradient and a read of the local step of its own: two transfers per variable. Here
    the graph it built is rewired (``pack_accumulator_inputs``): the float32 dense gradients
    of the variables on one ps and the local step, read once, are joined on the worker and
    split again on that ps, and each op takes its parts, the same values. The accumulators,
    the aggregation, the chief's update and the token queue are SyncReplicasOptimizer's own,
    so a step computes exactly what it computes. ``after``: a tensor that must be computed
    before any gradient reaches an accumulator (the global step read for the dropped count).

    ``fresh_from`` (backup workers): the global step as this run read it before its variable
    reads (``with_packed_reads(reads_after=...)``). The gradient then carries the later of
    the local step (the token) and that step, see ``pack_accumulator_inputs``.
    """
    graph = v1.get_default_graph()
    pairs = opt.compute_gradients(loss)
    if all(g is None for g, _ in pairs):
        raise ValueError(f"No gradients provided for any variable: {[v.name for _, v in pairs]}")
    first = len(graph.get_operations())
    train = opt.apply_gradients(pairs, global_step=global_step)
    built = graph.get_operations()[first:]
    sent, arrived, on_ps = pack_accumulator_inputs(built, worker_device, after, fresh_from, global_step)
    if fresh_from is not None:
        take_fresh_token(built, compat.sync_token_queue(opt), global_step.device, on_ps.get(global_step.device, sent),
                         last_step)
    return SyncStep(train, sent, arrived if arrived is not None else after)


#: Added to the step a token carries when it releases waiting workers instead of ending a
#: step (``release_tokens``): a worker's loop of sync steps (``sync_step_loop``) ends at such
#: a token, so that its hooks see why (the job's end, a stop) before it trains on.
RELEASED = 1 << 50


def release_tokens(queue, global_step, count: int, ahead: int = 0, marked: bool = True):
    """An op that gives ``count`` tokens of the current step (+ ``ahead``) to waiting workers.

    The chief gives them at its end, so that a worker waiting for a step the chief will not
    finish sees the end. With backup workers (``ahead`` 1) they carry the step after the
    current one, which a worker waiting in ``take_fresh_token`` for the step it gave a
    gradient to does not pass over; a restarted chief gives them at its start too, when its
    first step may lack the gradients of workers already waiting (the old chief had taken
    them and died before its update). A gradient sent on such a token counts for the current
    step or, if that step ends first, for the next one: one step stale, once per worker.
    ``marked``: the tokens carry ``RELEASED`` too, which ends a loop of sync steps; a worker
    that trains one step per run (SyncReplicasOptimizer's own step, which makes the token its
    local step) gets unmarked ones.
    """
    with tf.device(global_step.device):
        step = global_step.read_value() + ahead + (RELEASED if marked else 0)
        return queue.enqueue_many((tf.fill([count], tf.cast(step, tf.int64)),), name="release_sync_tokens")


class NotLoopable(Exception):
    """A sync step that cannot run in a loop (``sync_loop_step``): one step per run then."""


class SyncLoopStep(NamedTuple):
    """One sync step in a loop (``sync_loop_step``): the op that ends it, the token it took
    (the step of the next gradient, ``RELEASED`` added to a release) and 1 when its gradient
    surely arrived stale (a lower bound, as ``SyncStep``)."""
    train: object
    token: object
    stale: object


def sync_loop_step(opt, loss, global_step, worker_device: str, local_step, step_read,
                   fresh_from=None, last_step=None) -> SyncLoopStep:
    """One step of ``SyncReplicasOptimizer`` inside ``sync_step_loop``'s loop.

    The optimizer's own graph (its accumulators, the chief's update, the token queue, its
    local step and init ops) is built once, outside the loop (``tf.init_scope``), by its own
    ``apply_gradients``, from gradients of the same kind and shape that are never computed.
    The step in the loop then does what that graph's worker part does: each gradient goes to
    its variable's accumulator with the step it belongs to (``local_step``, the token of the
    step before), packed per ps as in ``apply_sync_packed``, and the worker takes a token from
    the queue once every accumulator has its gradient. The accumulators, the aggregation, the
    chief's update and the tokens are SyncReplicasOptimizer's own: the same training.

    ``step_read``: the global step as read before this step's variables (the dropped count
    compares with it). ``fresh_from`` (backup workers): the same read; the gradient carries the
    later of it and ``local_step``, and the worker waits for a token newer than that
    (``pack_accumulator_inputs``, ``take_fresh_token``).

    Raises ``NotLoopable`` for a sparse gradient: its accumulator (a reference, not a resource)
    cannot be used inside a loop.
    """
    pairs = opt.compute_gradients(loss)
    if all(g is None for g, _ in pairs):
        raise ValueError(f"No gradients provided for any variable: {[v.name for _, v in pairs]}")
    sparse = [v.name for g, v in pairs if g is not None and not isinstance(g, tf.Tensor)]
    if sparse:
        raise NotLoopable(f"sparse gradients: {', '.join(sparse)}")
    with tf.init_scope():   # the graph outside the loop
        opt.apply_gradients([(None if g is None else tf.zeros(v.shape, g.dtype), v) for g, v in pairs],
                            global_step=global_step)
    graph = v1.get_default_graph()   # the loop's body
    first = len(graph.get_operations())
    accumulators = iter(compat.sync_accumulators(opt))
    for g, _ in pairs:
        if g is not None:
            accumulator, device = next(accumulators)
            with tf.device(device):
                accumulator.apply_grad(g, local_step=local_step)
    built = graph.get_operations()[first:]
    sent, arrived, on_ps = pack_accumulator_inputs(built, worker_device, step_read, fresh_from, global_step)
    queue = compat.sync_token_queue(opt)
    with tf.device(global_step.device), v1.control_dependencies(
            [op for op in built if op.type in ACCUMULATOR_APPLY_OPS]):
        token = queue.dequeue()
    if fresh_from is not None:
        token = _fresh_token(queue, token, global_step.device, on_ps.get(global_step.device, sent), last_step)
    with tf.device(worker_device):
        token = tf.identity(token, name="sync_token")
        stale = tf.cast(sent < (arrived if arrived is not None else tf.cast(step_read, sent.dtype)), tf.int32)
    return SyncLoopStep(token.op, token, stale)


def sync_step_loop(step_fn, opt, last_step: int, worker_device: str):
    """K sync steps per ``session.run``, as ``step_loop`` runs K async ones.

    ``step_fn(local_step)`` builds one step (``sync_loop_step``) and returns (train_op, loss,
    metrics, token, stale). Each iteration's gradient belongs to the token of the one before
    (the first to SyncReplicasOptimizer's local step, which the run sets to its last token at
    its end). The loop ends after ``bound`` steps, at ``last_step``, and at a released token
    (``release_tokens``): the chief's end or a restarted chief's start, which the hooks
    between runs then act on. Returns (train_op, steps, loss, metrics, bound, stale): ``stale``
    counts the run's gradients that surely arrived stale.
    """
    bound = v1.placeholder_with_default(tf.constant(1, tf.int32), [], name="steps_per_run")
    keys: list[str] = []
    with tf.device(worker_device):
        # The local step exists once the body is built: the loop's first value is rewired to it.
        start = tf.identity(tf.zeros([], tf.int64), name="sync_local_step_start")

    def cond(i, step, released, _values, _stale):
        return tf.logical_and(tf.logical_and(i < bound, step < last_step), tf.logical_not(released))

    def body(i, step, _released, _values, stale):
        train_op, loss, metrics, token, dropped = step_fn(step)
        keys.extend(metrics)
        with v1.control_dependencies([train_op]), tf.device(worker_device):
            released = token >= RELEASED
            token = tf.where(released, token - RELEASED, token)
        return i + 1, token, released, _stacked(loss, metrics, keys), stale + dropped

    steps, last, _, values, stale = v1.while_loop(
        cond, body, [tf.constant(0), start, tf.constant(False), tf.zeros([0], tf.float32), tf.constant(0)],
        shape_invariants=[tf.TensorShape([]), tf.TensorShape([]), tf.TensorShape([]), tf.TensorShape([None]),
                          tf.TensorShape([])],
        parallel_iterations=1, back_prop=False, name="train_steps")
    local = compat.sync_local_step(opt)
    with tf.device(worker_device):
        compat.update_op_input(start.op, 0, local.read_value())
        train_op = local.assign(last)
    loss, metrics = _last_values(steps, values, keys)
    return getattr(train_op, "op", train_op), steps, loss, metrics, bound, stale


#: The op by which a worker takes its token from SyncReplicasOptimizer's queue.
TOKEN_DEQUEUE_OPS = ("QueueDequeueV2", "QueueDequeue")


def take_fresh_token(ops, queue, device: str, sent, last_step=None) -> None:
    """Backup workers: a worker takes the first token newer than the step its gradient carried.

    SyncReplicasOptimizer's worker takes the next token of the queue, whatever its step;
    with a worker frozen, the tokens it does not take pile up (see
    ``pack_accumulator_inputs``), and the others, finding one at once, start their next step
    before the current one is over: from the variables it is about to change, a gradient
    dropped as stale. Here the token op among ``ops`` is followed by a loop on the queue's ps
    (``device``) that passes over the tokens of the steps up to ``sent`` (the step the
    gradient carried, as it reached that ps): the worker waits for the step it gave a
    gradient to, as it does without backup workers. The tokens it passes over were of no
    use to it; a step still adds a token for every worker, so a slower one finds its own.
    """
    dequeues = [op for op in ops if op.type in TOKEN_DEQUEUE_OPS]
    if len(dequeues) != 1:
        raise RuntimeError(f"expected one token dequeue in SyncReplicasOptimizer's graph, found {len(dequeues)}")
    token = dequeues[0].outputs[0]
    users = list(token.consumers())
    _use_instead(token, _fresh_token(queue, token, device, sent, last_step), users)


def _fresh_token(queue, token, device: str, sent, last_step=None):
    """The first token of ``queue`` from ``token`` on that is newer than ``sent``: a loop on
    the queue's ps (``device``) that passes over older ones. A token of ``last_step`` ends the
    wait too: a gradient sent for the last step (the global step reached it while the worker
    computed) waits for no step, since none follows."""
    def older(t):
        before = t <= tf.cast(sent, t.dtype)
        return before if last_step is None else tf.logical_and(before, t < last_step)
    with tf.device(device):
        return tf.while_loop(older, lambda t: tf.reshape(queue.dequeue(), []), [token], name="fresh_token")[0]


def _use_instead(tensor, other, users) -> None:
    """Make each op of ``users`` read ``other`` where it read ``tensor``."""
    for user in users:
        for j, x in enumerate(user.inputs):
            if x is tensor:
                compat.update_op_input(user, j, other)


def _input_index(op, name: str) -> int:
    return [arg.name for arg in op.op_def.input_arg].index(name)


def pack_accumulator_inputs(ops, worker_device: str, after=None, fresh_from=None, global_step=None):
    """Rewire the accumulator ops among ``ops`` (see ``apply_sync_packed``): one transfer per ps.

    The local step (int64) travels in the joined float32 tensor as its two 32-bit halves
    (``tf.bitcast``, both ways: the same bits, no arithmetic on them). Sparse gradients
    (``IndexedSlices``: only the touched rows travel), other dtypes and gradients larger than
    ``PACK_MAX_ELEMENTS`` keep their own transfer, and take the local step sent to their ps.

    With ``fresh_from`` (backup workers) the step sent is the later of the local step and
    ``fresh_from``. SyncReplicasOptimizer adds as many tokens per step as there are workers,
    carrying the new step; a frozen worker takes none, so one token a step piles up in its
    FIFO queue, and the healthy workers go on taking ever older tokens: their gradients,
    computed from the variables of the current step, are dropped as stale (28% of the steps
    lost in a 20 s freeze). The variables a run reads are at least as new as the global step
    read before them, so that step is what its gradient is fresh for; a gradient computed from
    older variables (a frozen worker's) is still dropped. The global step is then also read on
    its ps once the gradients have arrived there, right before they reach the accumulators
    (the dropped count's comparison). Without ``fresh_from`` nothing differs from
    SyncReplicasOptimizer.

    Returns (the step sent, that read on arrival or None, the step sent as each ps has it).
    """
    applies = [op for op in ops if op.type in ACCUMULATOR_APPLY_OPS]
    if not applies:
        return None, None, {}
    step_at = _input_index(applies[0], "local_step")
    with tf.device(worker_device), v1.control_dependencies([after] if after is not None else []):
        # Every op reads the same local variable, which only the token at the end of the
        # run changes (after every accumulator has had its gradient): one read serves them all.
        step = tf.identity(applies[0].inputs[step_at], name="sync_local_step")
        if fresh_from is not None:
            step = tf.maximum(step, tf.cast(fresh_from, step.dtype), name="sync_fresh_step")
        bits = tf.bitcast(step, tf.float32) if step.dtype == tf.int64 else None
    by_ps: dict[str, list] = {}
    for op in applies:
        by_ps.setdefault(op.device, []).append(op)
    arrivals = {}
    for device, group in by_ps.items():
        dense = []
        for op in group:
            if op.type == "SparseAccumulatorApplyGradient":
                continue
            grad = op.inputs[_input_index(op, "gradient")]
            if _packable(grad.dtype, grad.shape):
                dense.append((op, grad))
        if dense and bits is not None:
            tensors = [g for _, g in dense] + [bits]
            parts = _send_joined(tensors, [t.shape for t in tensors], worker_device, device)
            with tf.device(device):
                ps_step = tf.bitcast(parts[-1], tf.int64)
            for (op, _), part in zip(dense, parts):
                compat.update_op_input(op, _input_index(op, "gradient"), part)
        else:
            with tf.device(device):
                ps_step = tf.identity(step)
        for op in group:
            compat.update_op_input(op, _input_index(op, "local_step"), ps_step)
        arrivals[device] = (ps_step, group)
    arrived = None
    if fresh_from is not None and global_step is not None:
        # Read where the global step lives, once its ps's gradients are there and before they
        # reach its accumulators: a gradient whose step is behind it was surely dropped.
        ps_step, group = arrivals.get(global_step.device) or next(iter(arrivals.values()))
        with tf.device(global_step.device), v1.control_dependencies([ps_step]):
            on_arrival = tf.identity(global_step.read_value(), name="global_step_on_arrival")
        for op in group:
            compat.add_control_input(op, on_arrival.op)
        with tf.device(worker_device):
            arrived = tf.identity(on_arrival, name="global_step_at_arrival")
    return step, arrived, {device: ps_step for device, (ps_step, _) in arrivals.items()}


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
