"""One task of a cluster, from start to exit code: what ``tfps run`` runs.

``entry`` is the task's process (its flags, the ``--restarts`` supervisor, the exit), which
the CLI and ``tfps local``'s forked tasks both call.

``ps`` serves the variables until every worker is done; ``worker`` trains, and ``chief``
(worker 0) also checkpoints, exports and reports; ``feeder`` is the chief's thread that fills
the slice queue; ``setup`` is what a job trains, checked before any cluster exists. What the
roles use lives in one subpackage per concern: ``graph`` (the training graph), ``runtime``
(the process: signals, the done queue, session settings, health, the supervisor, the
watchdog, the session's hooks), ``net`` (the network guards), ``output`` (checkpoints,
exports, versions) and ``monitor`` (the board, the watch, progressive validation). Only
``run_task`` and the modules it loads import TensorFlow.
"""

from __future__ import annotations

import os
import sys

from tfps import use_tf_keras
from tfps.compat import TF_EAGER_KERAS_MODULES, check_tensorflow, literal_checkpoint_directories

#: What ``import tensorflow`` imports eagerly only to register Keras's optimizers for
#: SavedModels of Keras objects (tensorflow/__init__.py): it loads all of Keras, about half
#: a second of every task's start. A task never loads such a SavedModel, and a Keras model
#: imports Keras itself when it is built.
EAGER_KERAS = TF_EAGER_KERAS_MODULES


def single_threaded_blas() -> None:
    """Before NumPy loads: its OpenBLAS would start a spinning thread per CPU, next to
    TensorFlow's own pools (``runtime.session.auto_threads``); a task does no BLAS work of its own
    in NumPy. A value the user set wins."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def import_tensorflow():
    """``import tensorflow`` without its eager import of Keras; later imports of Keras work as
    usual, and ``tf.keras`` is tf_keras unless the user set TF_USE_LEGACY_KERAS otherwise."""
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    use_tf_keras()   # also for python -m tfps.launch.estimate, started by the Ansible role's plugin
    single_threaded_blas()
    blocked = [name for name in EAGER_KERAS if name not in sys.modules]
    for name in blocked:
        sys.modules[name] = None   # import_module raises ImportError, which TensorFlow ignores there
    try:
        import tensorflow
    finally:
        for name in blocked:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]
    return tensorflow


def run_task(task, cfg, stop, started_wall: float | None = None, replace: bool = False):
    """Run this process's task (ps, worker or chief) and return its ExitCode. ``replace``
    (``--replace``): the chief goes on with settings other than those its model_dir records.

    A TensorFlow without the internals tfps uses is refused here, before anything starts
    (``tfps.compat.check_tensorflow``: ConfigError, one line).
    """
    import_tensorflow()
    check_tensorflow()
    literal_checkpoint_directories()   # a model_dir named exp[lr=0.01] finds its checkpoints
    if task.job == "ps":
        from tfps.task.ps import serve  # lazy: the CLI imports tfps.task, and ps brings 24 modules more
        return serve(task, cfg, stop)
    if task.is_chief:
        from tfps.task.chief import Chief  # lazy: imports NumPy and PyYAML
        chief = Chief(task, cfg, stop, started_wall)
        chief.replace = replace
        return chief.run()
    from tfps.task.worker import Worker  # lazy: imports NumPy
    return Worker(task, cfg, stop, started_wall).run()
