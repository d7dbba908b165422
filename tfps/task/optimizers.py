"""The optimizers a job trains with, each updating only the rows a sparse gradient touched.

SGD, Adagrad and FTRL (``tf.compat.v1.train``) already apply an ``IndexedSlices`` gradient
to its rows only. TensorFlow's Adam does not: its sparse update still decays the first
and second moments of the whole table (``m = m * beta1``), so a step costs time
proportional to the table, and for a table of gigabytes that is the whole step.
``LazyAdamOptimizer`` updates the moments and the variable of the touched rows only, as
LazyAdam (TensorFlow Addons, Keras) does: a row's moments decay only in the steps that see
it. Dense gradients get Adam exactly as before.
"""

from __future__ import annotations

from tfps.config import OPTIMIZERS as NAMES  # noqa: F401 - every name tfps takes, said once


def make(name: str, learning_rate: float):
    import tensorflow as tf
    t = tf.compat.v1.train
    if name == "adam":
        return lazy_adam_class()(learning_rate)
    return {"sgd": t.GradientDescentOptimizer, "adagrad": t.AdagradOptimizer,
            "ftrl": t.FtrlOptimizer}[name](learning_rate)


_LAZY_ADAM = None


def lazy_adam_class():
    """``tf.compat.v1.train.AdamOptimizer`` whose sparse updates touch only the given rows."""
    global _LAZY_ADAM
    if _LAZY_ADAM is not None:
        return _LAZY_ADAM
    import tensorflow as tf
    v1 = tf.compat.v1

    class LazyAdamOptimizer(v1.train.AdamOptimizer):
        def _rows_update(self, grad, var, indices, scatter_update, scatter_sub):
            beta1_power, beta2_power = self._get_beta_accumulators()
            dtype = var.dtype.base_dtype
            beta1_power = tf.cast(beta1_power, dtype)
            beta2_power = tf.cast(beta2_power, dtype)
            lr = tf.cast(self._lr_t, dtype) * tf.sqrt(1 - beta2_power) / (1 - beta1_power)
            b1, b2 = tf.cast(self._beta1_t, dtype), tf.cast(self._beta2_t, dtype)
            eps = tf.cast(self._epsilon_t, dtype)
            m, v = self.get_slot(var, "m"), self.get_slot(var, "v")
            m_rows = b1 * tf.gather(m, indices) + (1 - b1) * grad
            v_rows = b2 * tf.gather(v, indices) + (1 - b2) * tf.square(grad)
            m_t = scatter_update(m, indices, m_rows)
            v_t = scatter_update(v, indices, v_rows)
            with tf.control_dependencies([m_t, v_t]):
                var_t = scatter_sub(var, indices, lr * m_rows / (tf.sqrt(v_rows) + eps))
            return tf.group(var_t, m_t, v_t)

        def _resource_apply_sparse(self, grad, var, indices):
            def update(ref, i, rows):
                return tf.raw_ops.ResourceScatterUpdate(resource=ref.handle, indices=i, updates=rows)

            def sub(ref, i, rows):
                return tf.raw_ops.ResourceScatterSub(resource=ref.handle, indices=i, updates=rows)
            return self._rows_update(grad, var, indices, update, sub)

        def _apply_sparse(self, grad, var):
            return self._rows_update(grad.values, var, grad.indices,
                                     lambda ref, i, rows: v1.scatter_update(ref, i, rows, use_locking=self._use_locking),
                                     lambda ref, i, rows: v1.scatter_sub(ref, i, rows, use_locking=self._use_locking))

    _LAZY_ADAM = LazyAdamOptimizer
    return _LAZY_ADAM
