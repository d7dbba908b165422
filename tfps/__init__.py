"""tfps: TensorFlow parameter-server training whose jobs end cleanly.

The package is importable without TensorFlow: only the modules that build graphs or run
a task (``tfps.task.*`` below ``run_task``, ``tfps.models``, ``tfps.data``'s
dataset pipeline) import it, and they do so lazily, after the CLI has checked that
TensorFlow is installed.

Layout: ``cli`` (the ``tfps`` command), ``config`` (run options), ``cluster/`` (the plan),
``task/`` (one ps, worker or chief task), ``outcome/`` (results, journal, report, plot),
``notify/`` (the completion message), ``launch/`` (``tfps local`` and ``tfps compose``),
``data``, ``models``, ``keras_model`` and ``modelspec`` (what a job trains on and trains),
``demo`` (the demo datasets), ``logs`` (the one logging setup), ``timeouts`` (every
timeout of a job), ``errors`` and ``exitcodes``.
"""

import os as _os

__version__ = "0.1.0"

#: ``tf.keras`` is tf_keras (Keras 2), whose models build tf.compat.v1 graphs, when this is
#: set before TensorFlow is imported; every tfps process (launcher, task, export, plan)
#: imports tfps first. Keras 3 cannot train on parameter servers (tfps.keras_model).
_os.environ["TF_USE_LEGACY_KERAS"] = "1"
