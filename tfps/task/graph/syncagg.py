"""tfps's own synchronous aggregation, on public TensorFlow ops.

Each step, every worker gives its gradients to one accumulator per variable on that
variable's ps (``ConditionalAccumulator``, ``SparseConditionalAccumulator`` for sparse
gradients) with the step they belong to; an accumulator drops a gradient older than its
global step. The chief's queue runner takes ``replicas_to_aggregate`` gradients from each
(their mean), applies them with the wrapped optimizer, and puts one token per worker,
carrying the new global step, into a ``FIFOQueue`` on the global step's ps. A worker takes
a token before its next step: the step its next gradient belongs to. This is
``tf.compat.v1.train.SyncReplicasOptimizer``'s algorithm (the unit tests check bit-equality
with it), built so that the worker's side is cheap:

* the float32 dense gradients for one ps and the step they carry (its int64 bits) travel
  as one tensor, split again on that ps (``send``);
* with backup workers, the step carried is the later of the token and the global step read
  before the variables, and a worker waits for a token newer than that step
  (``fresh_token``): why, in docs/design/steps.md;
* the accumulators, the chief's update and the token queue are built once, outside a loop
  of several steps per ``session.run`` (``sync_step_loop``), and the worker's local
  step (the step of its next gradient) lives on the worker.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from tfps.task.graph.steps import _last_values, _packable, _send_joined, _stacked

v1 = tf.compat.v1


class SyncAggregation:
    """The shared graph of sync training: accumulators, the chief's update, the token queue.

    ``opt``: the optimizer that applies the aggregated gradients. ``build(pairs)`` makes the
    accumulators and the chief's update from the first step's (gradient, variable) pairs
    (only their kinds, dtypes and variables matter); ``send`` is a worker's part of a step.
    """

    def __init__(self, opt, global_step, replicas_to_aggregate: int, total_num_replicas: int, worker_device: str,
                 name: str = "sync_replicas"):
        self.opt, self.global_step, self.worker_device, self.name = opt, global_step, worker_device, name
        self.replicas_to_aggregate, self.total_num_replicas = replicas_to_aggregate, total_num_replicas
        self.tokens_per_step = max(total_num_replicas, replicas_to_aggregate)
        with tf.device(worker_device):
            # The step this worker's next gradient belongs to (its last token): its own, on it.
            self.local_step = v1.Variable(0, trainable=False, collections=[v1.GraphKeys.LOCAL_VARIABLES],
                                          dtype=global_step.dtype.base_dtype, name="sync_rep_local_step")
        with tf.device(global_step.device), tf.name_scope(""):
            self.token_queue = v1.FIFOQueue(-1, global_step.dtype.base_dtype, shapes=(), name="sync_token_q",
                                            shared_name="sync_token_q")
            self._dummy_queue = v1.FIFOQueue(1, tf.int32, shapes=(), name="dummy_queue", shared_name="dummy_queue")
        self.accumulators: list | None = None   # (accumulator, variable) per gradient, in the pairs' order
        self.queue_runner = None
        self.chief_init_op = self.local_step_init_op = None

    def compute_gradients(self, loss, **kwargs):
        """The wrapped optimizer's gradients (a worker's own: clipped there, before they travel)."""
        return self.opt.compute_gradients(loss, **kwargs)

    def build(self, pairs) -> None:
        """The accumulators and the chief's update, once (later calls do nothing).

        Built as SyncReplicasOptimizer builds them (names, devices, the update under the
        global step's device), so that the same optimizer makes the same variables."""
        if self.accumulators is not None:
            return
        gs = self.global_step
        accumulators, aggregated, var_list = [], [], []
        # Shared ops wait for nothing of the step being built (e.g. its batch normalisation's
        # updates): the chief's queue runner and the session hook run them on their own.
        with v1.control_dependencies(None), tf.name_scope(self.name):
            for grad, var in pairs:
                var_list.append(var)
                with tf.device(var.device):
                    if grad is None:
                        aggregated.append(None)
                        continue
                    if isinstance(grad, tf.Tensor):
                        acc = v1.ConditionalAccumulator(grad.dtype, shape=var.get_shape(),
                                                        shared_name=var.name + "/grad_accum")
                        aggregated.append(acc.take_grad(self.replicas_to_aggregate))
                    else:
                        acc = v1.SparseConditionalAccumulator(grad.dtype, shape=(),
                                                              shared_name=var.name + "/grad_accum")
                        aggregated.append(acc.take_indexed_slices_grad(self.replicas_to_aggregate))
                    accumulators.append((acc, var))
            with tf.device(gs.device), tf.name_scope(""):
                update = self.opt.apply_gradients(list(zip(aggregated, var_list)), gs)
            with tf.device(gs.device), tf.name_scope(""), v1.control_dependencies([update]):
                tokens = tf.fill([self.tokens_per_step], gs.read_value())
                sync_op = self.token_queue.enqueue_many((tokens,))
            self.queue_runner = v1.train.QueueRunner(self._dummy_queue, [sync_op])
            with tf.device(self.worker_device):
                self.local_step_init_op = self.local_step.assign(gs.read_value())
            chief_init = [self.local_step_init_op]
            for acc, var in accumulators:
                with tf.device(var.device):
                    chief_init.append(acc.set_global_step(gs, name="SetGlobalStep"))
            self.chief_init_op = tf.group(*chief_init)
        self.accumulators = accumulators

    def send(self, pairs, step, after=None, fresh_from=None, last_step=None):
        """A worker's part of a step: its gradients to the accumulators, then a token.

        ``pairs`` as given to ``build``; ``step``: the step the gradients belong to (the
        local step, or the token of the step before in a loop). The float32 dense gradients
        for one ps and ``step`` (its int64 bits) travel as one tensor; sparse gradients
        (only the touched rows), other dtypes and gradients above ``PACK_MAX_ELEMENTS`` travel
        alone and take the step as their ps has it. ``after``: computed before any gradient
        reaches an accumulator (the global step read for the dropped count).

        ``fresh_from`` (backup workers): the global step read before this step's variables.
        The gradients then carry the later of ``step`` and it, the global step is read again
        on its ps as they arrive (before they reach its accumulators), and the token taken is
        the first newer than the step carried (``fresh_token``).

        Returns (token, the step sent (on the worker), the global step on arrival or None).
        """
        self.build(pairs)
        wd, gs = self.worker_device, self.global_step
        given = [(g, v) for g, v in pairs if g is not None]
        with tf.device(wd), v1.control_dependencies([after] if after is not None else []):
            sent = tf.identity(step, name="sync_rep_local_step")
            if fresh_from is not None:
                sent = tf.maximum(sent, tf.cast(fresh_from, sent.dtype), name="sync_fresh_step")
            bits = tf.bitcast(sent, tf.float32)
        by_ps: dict[str, list] = {}
        for (g, _), (acc, var) in zip(given, self.accumulators):
            by_ps.setdefault(var.device, []).append((g, acc))
        on_ps, values = {}, {}
        for device, group in by_ps.items():
            dense = [(j, g) for j, (g, _) in enumerate(group)
                     if isinstance(g, tf.Tensor) and _packable(g.dtype, g.shape)]
            if dense:
                tensors = [g for _, g in dense] + [bits]
                parts = _send_joined(tensors, [t.shape for t in tensors], wd, device)
                with tf.device(device):
                    on_ps[device] = tf.bitcast(parts[-1], sent.dtype)
                values[device] = {j: part for (j, _), part in zip(dense, parts)}
            else:
                with tf.device(device):
                    on_ps[device] = tf.identity(sent)
                values[device] = {}
        arrived, arrival_device, waits = None, None, []
        if fresh_from is not None:
            # Read where the global step lives, once its ps's gradients are there and before they
            # reach its accumulators: a gradient whose step is behind it was surely dropped.
            arrival_device = gs.device if gs.device in on_ps else next(iter(on_ps))
            with tf.device(gs.device), v1.control_dependencies([on_ps[arrival_device]]):
                on_arrival = tf.identity(gs.read_value(), name="global_step_on_arrival")
            waits = [on_arrival]
            with tf.device(wd):
                arrived = tf.identity(on_arrival, name="global_step_at_arrival")
        applies = []
        for device, group in by_ps.items():
            with tf.device(device), v1.control_dependencies(waits if device == arrival_device else []):
                for j, (g, acc) in enumerate(group):
                    if isinstance(g, tf.Tensor):
                        applies.append(acc.apply_grad(values[device].get(j, g), local_step=on_ps[device]))
                    else:
                        applies.append(acc.apply_indexed_slices_grad(g, local_step=on_ps[device]))
        with tf.device(gs.device), tf.name_scope(""), v1.control_dependencies(applies):
            token = self.token_queue.dequeue()
        if fresh_from is not None:
            token = fresh_token(self.token_queue, token, gs.device, on_ps.get(gs.device, sent), last_step)
        return token, sent, arrived

    def init_tokens_op(self):
        """The chief's first tokens: ``replicas_to_aggregate`` of the current step."""
        with tf.device(self.global_step.device), tf.name_scope(""):
            tokens = tf.fill([self.replicas_to_aggregate], self.global_step.read_value())
            return self.token_queue.enqueue_many((tokens,))

    def hook(self, is_chief: bool) -> v1.train.SessionRunHook:
        """The session hook: local (and on the chief, accumulator) initialisation at each
        session, the chief's first tokens and its queue runner."""
        return _SyncHook(self, is_chief)


def fresh_token(queue, token, device: str, sent, last_step=None):
    """The first token of ``queue`` from ``token`` on that is newer than ``sent``: a loop on
    the queue's ps (``device``) that passes over older ones. A token of ``last_step`` ends the
    wait too: a gradient sent for the last step (the global step reached it while the worker
    computed) waits for no step, since none follows."""
    def older(t):
        before = t <= tf.cast(sent, t.dtype)
        return before if last_step is None else tf.logical_and(before, t < last_step)
    with tf.device(device):
        return tf.while_loop(older, lambda t: tf.reshape(queue.dequeue(), []), [token], name="fresh_token")[0]


class _SyncHook(v1.train.SessionRunHook):
    def __init__(self, agg: SyncAggregation, is_chief: bool):
        self.agg, self.is_chief = agg, is_chief
        self.ready = self.init_tokens = None

    def begin(self):
        if self.agg.accumulators is None:
            raise ValueError("the sync aggregation was never given gradients")
        # Every global variable (the chief's initialisation or restore) before the local step
        # is set from the global step.
        self.ready = v1.report_uninitialized_variables(v1.global_variables())
        self.init_tokens = self.agg.init_tokens_op() if self.is_chief else None

    def after_create_session(self, session, coord):
        left = session.run(self.ready)
        if len(left):
            raise RuntimeError("the model is not ready for the sync local step: uninitialised "
                               + ", ".join(n.decode() for n in left[:5]))
        session.run(self.agg.chief_init_op if self.is_chief else self.agg.local_step_init_op)
        if self.is_chief:
            session.run(self.init_tokens)
            self.agg.queue_runner.create_threads(session, coord=coord, daemon=True, start=True)


# ------------------------------------------------------------------ a worker's sync steps
class SyncStep(NamedTuple):
    """What ``apply_sync_packed`` built: the train op (the token assigned to the local step),
    the step this run's gradient carries (on the worker) and the global step as the gradient
    reached its ps; the gradient was dropped as stale when the first is behind the second (a
    lower bound: the accumulator's own step, which decides, cannot be read)."""
    train: object
    sent_step: object
    arrived_at: object


def _gradients(agg: SyncAggregation, loss) -> list:
    pairs = agg.compute_gradients(loss)
    if all(g is None for g, _ in pairs):
        raise ValueError(f"No gradients provided for any variable: {[v.name for _, v in pairs]}")
    return pairs


def apply_sync_packed(agg: SyncAggregation, loss, after=None, fresh_from=None, last_step=None) -> SyncStep:
    """One sync step per ``session.run``: the gradients of ``loss`` go to the accumulators
    with the local step (``SyncAggregation.send``), and the token taken becomes the local
    step. ``after``: a tensor computed before any gradient reaches an accumulator (the
    global step read for the dropped count); ``fresh_from``: backup workers, see ``send``."""
    pairs = _gradients(agg, loss)
    token, sent, arrived = agg.send(pairs, agg.local_step.read_value(), after, fresh_from, last_step)
    with tf.device(agg.worker_device):
        train = agg.local_step.assign(token)
    return SyncStep(train, sent, arrived if arrived is not None else after)


#: Added to the step a token carries when it releases waiting workers instead of ending a
#: step (``release_tokens``): a worker's loop of sync steps (``sync_step_loop``) ends at such
#: a token, so that its hooks see why (the job's end, a stop) before it trains on.
RELEASED = 1 << 50


def release_tokens(queue, global_step, count: int, ahead: int = 0, marked: bool = True):
    """An op that gives ``count`` tokens of the current step (+ ``ahead``) to waiting workers.

    The chief gives them at its end, so that a worker waiting for a step the chief will not
    finish sees the end. With backup workers (``ahead`` 1) they carry the step after the
    current one, which a worker waiting in ``fresh_token`` for the step it gave a gradient to
    does not pass over; a restarted chief gives them at its start too, when its first step
    may lack the gradients of workers already waiting (the old chief had taken them and died
    before its update). A gradient sent on such a token counts for the current step or, if
    that step ends first, for the next one: one step stale, once per worker. ``marked``: the
    tokens carry ``RELEASED`` too, which ends a loop of sync steps; a worker that trains one
    step per run (``apply_sync_packed``, which makes the token its local step) gets unmarked ones.
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


def sync_loop_step(agg: SyncAggregation, loss, local_step, step_read, fresh_from=None,
                   last_step=None) -> SyncLoopStep:
    """One sync step inside ``sync_step_loop``'s loop.

    The shared graph (accumulators, the chief's update, the token queue) is built once,
    outside the loop (``tf.init_scope``); the step gives its gradients with ``local_step``
    (the token of the step before) and takes a token. ``step_read``: the global step as read
    before this step's variables (the dropped count compares with it); ``fresh_from``
    (backup workers): the same read, see ``SyncAggregation.send``.

    Raises ``NotLoopable`` for a sparse gradient: its accumulator (a reference, not a
    resource) cannot be used inside a loop.
    """
    pairs = _gradients(agg, loss)
    sparse = [v.name for g, v in pairs if g is not None and not isinstance(g, tf.Tensor)]
    if sparse:
        raise NotLoopable(f"sparse gradients: {', '.join(sparse)}")
    with tf.init_scope():   # the graph outside the loop
        agg.build(pairs)
    token, sent, arrived = agg.send(pairs, local_step, step_read, fresh_from, last_step)
    with tf.device(agg.worker_device):
        token = tf.identity(token, name="sync_token")
        stale = tf.cast(sent < (arrived if arrived is not None else tf.cast(step_read, sent.dtype)), tf.int32)
    return SyncLoopStep(token.op, token, stale)


def sync_step_loop(step_fn, agg: SyncAggregation, last_step: int):
    """K sync steps per ``session.run``, as ``tfps.task.graph.steps.step_loop`` runs K async ones.

    ``step_fn(local_step)`` builds one step (``sync_loop_step``) and returns (train_op, loss,
    metrics, token, stale). Each iteration's gradient belongs to the token of the one before
    (the first to the local step, which the run sets to its last token at its end). The
    loop ends after ``bound`` steps, at ``last_step``, and at a released token
    (``release_tokens``): the chief's end or a restarted chief's start, which the hooks
    between runs then act on. Returns (train_op, steps, loss, metrics, bound, stale):
    ``stale`` counts the run's gradients that surely arrived stale.
    """
    bound = v1.placeholder_with_default(tf.constant(1, tf.int32), [], name="steps_per_run")
    keys: list[str] = []
    worker_device = agg.worker_device
    with tf.device(worker_device):
        start = tf.identity(agg.local_step.read_value(), name="sync_local_step_start")

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
    with tf.device(worker_device):
        train_op = agg.local_step.assign(last)
    loss, metrics = _last_values(steps, values, keys)
    return getattr(train_op, "op", train_op), steps, loss, metrics, bound, stale
