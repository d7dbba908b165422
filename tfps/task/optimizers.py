"""The optimizers a job trains with, each updating only the rows a sparse gradient touched.

SGD, Adagrad and FTRL (``tf.compat.v1.train``) already apply an ``IndexedSlices`` gradient
to its rows only. TensorFlow's Adam does not: its sparse update still decays the first
and second moments of the whole table (``m = m * beta1``), so a step costs time
proportional to the table, and for a table of gigabytes that is the whole step.
``LazyAdamOptimizer`` updates the moments and the variable of the touched rows only, as
LazyAdam (TensorFlow Addons, Keras) does: a row's moments decay only in the steps that see
it. Dense gradients get Adam exactly as before.

This module is the one list of optimizer names (``--optimizer``, ``tfps.config``, and the
Keras optimizers ``tfps.keras_model`` maps): it imports TensorFlow only when ``make`` runs.
"""

from __future__ import annotations

#: Every optimizer tfps trains with: its name (``--optimizer``; also the lower-cased class
#: name of the Keras optimizer that maps to it) -> its ``tf.compat.v1.train`` class.
#: Adam trains as :func:`lazy_adam_class`, a subclass of that class.
CLASSES = {"sgd": "GradientDescentOptimizer", "adam": "AdamOptimizer", "adagrad": "AdagradOptimizer",
           "ftrl": "FtrlOptimizer"}
NAMES = tuple(CLASSES)


def make(name: str, learning_rate: float):
    import tensorflow as tf
    if name == "adam":
        return lazy_adam_class()(learning_rate)
    return getattr(tf.compat.v1.train, CLASSES[name])(learning_rate)


_LAZY_ADAM = None


def lazy_adam_class():
    """``tf.compat.v1.train.AdamOptimizer`` whose sparse updates touch only the given rows."""
    global _LAZY_ADAM
    if _LAZY_ADAM is not None:
        return _LAZY_ADAM
    import tensorflow as tf

    from tfps import compat
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
