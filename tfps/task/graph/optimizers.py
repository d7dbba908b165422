"""The optimizers a job trains with, each updating only the rows a sparse gradient touched.

SGD, Adagrad and FTRL (``tf.compat.v1.train``) already apply an ``IndexedSlices`` gradient
to its rows only. TensorFlow's Adam does not: its sparse update still decays the first
and second moments of the whole table (``m = m * beta1``), so a step costs time
proportional to the table, and for a table of gigabytes that is the whole step.
``LazyAdamOptimizer`` updates the moments and the variable of the touched rows only, as
LazyAdam (TensorFlow Addons, Keras) does: a row's moments decay only in the steps that see
it. Dense gradients get Adam exactly as before.

The names (``--optimizer``) are ``tfps.config.OPTIMIZERS``, below every task module; a Keras
model's compiled optimizer may also train as ``adamw`` or ``rmsprop``, with the options
``tfps.models.keras_model`` reads from its compile() (hyperparameters, a learning-rate schedule,
gradient clipping, weight decay: ``make``). It imports TensorFlow only when ``make`` runs.
"""

from __future__ import annotations

from tfps import compat
from tfps.config import OPTIMIZERS as NAMES

#: Every optimizer tfps trains with: its name (``tfps.config.OPTIMIZERS``; also the
#: lower-cased class name of the Keras optimizer that maps to it) -> its
#: ``tf.compat.v1.train`` class. Adam trains as :func:`lazy_adam_class`, a subclass of that class.
_CLASS_OF = {"sgd": "GradientDescentOptimizer", "adam": "AdamOptimizer", "adagrad": "AdagradOptimizer",
             "ftrl": "FtrlOptimizer"}
CLASSES = {name: _CLASS_OF[name] for name in NAMES}   # a name without a class fails at import


def make(name: str, learning_rate: float, options: dict | None = None):
    """The ``tf.compat.v1.train`` optimizer ``name`` at ``learning_rate``.

    ``options`` (from a Keras model's compile(), ``tfps.models.keras_optimizers.compiled_optimizer``; in
    Keras's own names) adds what that optimizer was compiled with: its hyperparameters, a
    learning-rate ``schedule`` (evaluated on the global step), gradient clipping (applied
    to each worker's gradients before they travel, as ``compute_gradients`` returns them)
    and decoupled ``weight_decay`` (applied with each update, before it). ``name`` may be
    any key of ``KERAS_CLASSES``.
    """
    import tensorflow as tf
    options = dict(options or {})
    train = tf.compat.v1.train
    lr = learning_rate
    if options.get("schedule"):
        lr = _schedule_rate(options["schedule"])
    if name in ("adam", "adamw"):
        base = lazy_adam_class()
        names = (("beta_1", "beta1"), ("beta_2", "beta2"), ("epsilon", "epsilon"))
        kwargs = {v1_name: options[k] for k, v1_name in names if k in options}
    elif name == "sgd" and float(options.get("momentum") or 0) > 0:
        base, kwargs = train.MomentumOptimizer, {"momentum": options["momentum"],
                                                 "use_nesterov": bool(options.get("nesterov"))}
    elif name == "rmsprop":
        centered = bool(options.get("centered"))
        base = rmsprop_class(centered)
        kwargs = {"decay": options.get("rho", 0.9), "momentum": options.get("momentum", 0.0),
                  "epsilon": options.get("epsilon", 1e-7), "centered": centered}
    elif name == "adagrad":
        base, kwargs = train.AdagradOptimizer, {}
        if "initial_accumulator_value" in options:
            kwargs["initial_accumulator_value"] = options["initial_accumulator_value"]
    elif name == "ftrl":
        base, kwargs = train.FtrlOptimizer, {k: options[k] for k in FTRL_OPTIONS if k in options}
    else:
        base, kwargs = getattr(train, CLASSES[name]), {}
    extras = {k: options[k] for k in ("clipnorm", "clipvalue", "global_clipnorm", "weight_decay") if options.get(k)}
    if not extras:
        return base(lr, **kwargs)
    return keras_extras_class(base)(lr, clip=_clip_of(options), weight_decay=options.get("weight_decay"),
                                    decay_excluded=options.get("weight_decay_excluded") or (), **kwargs)


#: Ftrl's options: the same names in Keras and ``tf.compat.v1.train.FtrlOptimizer``.
FTRL_OPTIONS = ("learning_rate_power", "initial_accumulator_value", "l1_regularization_strength",
                "l2_regularization_strength", "l2_shrinkage_regularization_strength", "beta")

def rmsprop_class(centered: bool) -> type:
    """``tf.compat.v1.train.RMSPropOptimizer`` whose slots start at zero, as Keras's RMSprop:
    TensorFlow's starts its mean square at one, which makes the first steps several times
    smaller than Keras's. The update itself is the same (epsilon inside the square root)."""
    key = ("rmsprop", centered)
    if key not in _EXTRAS:
        import tensorflow as tf

        slots = ("rms", "mg", "momentum") if centered else ("rms", "momentum")
        _EXTRAS[key] = compat.with_zeros_slots(tf.compat.v1.train.RMSPropOptimizer, "KerasRMSPropOptimizer", slots)
    return _EXTRAS[key]


def _schedule_rate(config: dict):
    """A callable learning rate: the Keras schedule ``config`` on the v1 global step.

    The v1 optimizers call it when they build their update (``apply_gradients``), so in an
    async step loop it is evaluated at every step, on the global step as it is then.
    """
    import tensorflow as tf
    import tf_keras as keras
    schedule = keras.optimizers.schedules.deserialize(config)

    def rate():
        return schedule(tf.cast(tf.compat.v1.train.get_or_create_global_step(), tf.float32))
    return rate


def _clip_of(options: dict) -> list:
    """[(kind, value)] applied in order; Keras's own order (the legacy optimizers clip by value
    first and then by norm; the others apply clipnorm, else global_clipnorm, else clipvalue)."""
    if options.get("legacy"):
        order = ("clipvalue", "clipnorm", "global_clipnorm")
        return [(k, float(options[k])) for k in order if options.get(k)]
    for k in ("clipnorm", "global_clipnorm", "clipvalue"):
        if options.get(k):
            return [(k, float(options[k]))]
    return []


def clip_gradients(pairs: list, clip: list) -> list:
    """(gradient, variable) pairs with their gradients clipped as Keras clips them.

    ``IndexedSlices`` stay ``IndexedSlices`` (their values are clipped; TensorFlow's clip
    functions take them), so only the touched rows still travel.
    """
    import tensorflow as tf
    pairs = list(pairs)
    for kind, value in clip:
        grads = [g for g, _ in pairs]
        if kind == "global_clipnorm":
            present = [g for g in grads if g is not None]
            clipped = iter(tf.clip_by_global_norm(present, value)[0]) if present else iter(())
            grads = [None if g is None else next(clipped) for g in grads]
        elif kind == "clipnorm":
            grads = [None if g is None else tf.clip_by_norm(g, value) for g in grads]
        else:
            grads = [None if g is None else tf.clip_by_value(g, -value, value) for g in grads]
        pairs = [(g, v) for g, (_, v) in zip(grads, pairs)]
    return pairs


def decay_weights(pairs: list, learning_rate, weight_decay: float, excluded=()) -> list:
    """Decoupled weight decay ``var -= lr * wd * var`` (Keras's ``weight_decay``, AdamW) of
    the variables that have a gradient; the ops, to run before their update.

    A variable with a sparse gradient (``IndexedSlices``, an embedding table) decays its
    touched rows only, once per step (lazily, as LazyAdam updates its moments): decaying a
    whole table every step would cost time proportional to its size. A row the step does
    not see is not decayed (Keras would decay it). ``excluded``: regular expressions of
    variable names that keep their value (Keras's ``exclude_from_weight_decay``).
    """
    import re

    import tensorflow as tf
    v1 = tf.compat.v1
    ops = []
    for g, v in pairs:
        if g is None or any(re.search(p, v.name) for p in excluded):
            continue
        with tf.device(v.device):
            dtype = v.dtype.base_dtype
            rate = tf.cast(learning_rate() if callable(learning_rate) else learning_rate, dtype) * \
                tf.cast(weight_decay, dtype)
            if isinstance(g, tf.IndexedSlices):
                rows = tf.unique(g.indices)[0]
                ops.append(v1.scatter_sub(v, rows, rate * tf.gather(v, rows)))
            else:
                ops.append(v1.assign_sub(v, rate * tf.convert_to_tensor(v)))
    return ops


_EXTRAS: dict = {}


def keras_extras_class(base: type) -> type:
    """``base`` (a v1 optimizer class) with Keras's gradient clipping and weight decay.

    Both are public methods of every v1 optimizer, which ``SyncReplicasOptimizer`` and
    ``tfps.task.graph.steps.apply_packed`` call: ``compute_gradients`` clips (on the worker,
    before the gradients travel; in sync training each worker's gradient is clipped before
    the aggregation) and ``apply_gradients`` decays the weights before the update.
    """
    if base in _EXTRAS:
        return _EXTRAS[base]
    import tensorflow as tf

    def __init__(self, learning_rate, *args, clip=(), weight_decay=None, decay_excluded=(), **kwargs):
        base.__init__(self, learning_rate, *args, **kwargs)
        self.tfps_clip, self.tfps_weight_decay = list(clip), weight_decay
        self.tfps_learning_rate, self.tfps_decay_excluded = learning_rate, tuple(decay_excluded)

    def compute_gradients(self, *args, **kwargs):
        return clip_gradients(base.compute_gradients(self, *args, **kwargs), self.tfps_clip)

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        pairs = list(grads_and_vars)
        if not self.tfps_weight_decay:
            return base.apply_gradients(self, pairs, global_step=global_step, name=name)
        decays = decay_weights(pairs, self.tfps_learning_rate, self.tfps_weight_decay, self.tfps_decay_excluded)
        with tf.control_dependencies(decays):
            return base.apply_gradients(self, pairs, global_step=global_step, name=name)

    cls = type(f"Keras{base.__name__}", (base,), {"__init__": __init__, "compute_gradients": compute_gradients,
                                                  "apply_gradients": apply_gradients, "__doc__": base.__doc__,
                                                  "__module__": __name__})
    _EXTRAS[base] = cls
    return cls


_LAZY_ADAM = None


def lazy_adam_class():
    """``tf.compat.v1.train.AdamOptimizer`` whose sparse updates touch only the given rows."""
    global _LAZY_ADAM
    if _LAZY_ADAM is not None:
        return _LAZY_ADAM
    import tensorflow as tf

    v1 = tf.compat.v1

    def rows_update(opt, grad, var, indices, scatter_update, scatter_sub):
        beta1_power, beta2_power = compat.adam_beta_powers(opt)
        lr_t, beta1_t, beta2_t, epsilon_t = compat.adam_hyper_tensors(opt)
        dtype = var.dtype.base_dtype
        beta1_power = tf.cast(beta1_power, dtype)
        beta2_power = tf.cast(beta2_power, dtype)
        lr = tf.cast(lr_t, dtype) * tf.sqrt(1 - beta2_power) / (1 - beta1_power)
        b1, b2 = tf.cast(beta1_t, dtype), tf.cast(beta2_t, dtype)
        eps = tf.cast(epsilon_t, dtype)
        m, v = opt.get_slot(var, "m"), opt.get_slot(var, "v")
        m_rows = b1 * tf.gather(m, indices) + (1 - b1) * grad
        v_rows = b2 * tf.gather(v, indices) + (1 - b2) * tf.square(grad)
        m_t = scatter_update(m, indices, m_rows)
        v_t = scatter_update(v, indices, v_rows)
        with tf.control_dependencies([m_t, v_t]):
            var_t = scatter_sub(var, indices, lr * m_rows / (tf.sqrt(v_rows) + eps))
        return tf.group(var_t, m_t, v_t)

    def resource_apply_sparse(opt, grad, var, indices):
        def update(ref, i, rows):
            return tf.raw_ops.ResourceScatterUpdate(resource=ref.handle, indices=i, updates=rows)

        def sub(ref, i, rows):
            return tf.raw_ops.ResourceScatterSub(resource=ref.handle, indices=i, updates=rows)
        return rows_update(opt, grad, var, indices, update, sub)

    def apply_sparse(opt, grad, var):
        locking = compat.optimizer_use_locking(opt)
        return rows_update(opt, grad.values, var, grad.indices,
                           lambda ref, i, rows: v1.scatter_update(ref, i, rows, use_locking=locking),
                           lambda ref, i, rows: v1.scatter_sub(ref, i, rows, use_locking=locking))

    # The sparse updates are the two methods TensorFlow's v1 Optimizer has subclasses override.
    _LAZY_ADAM = compat.with_sparse_updates(v1.train.AdamOptimizer, "LazyAdamOptimizer",
                                            apply_sparse=apply_sparse, resource_apply_sparse=resource_apply_sparse)
    return _LAZY_ADAM
