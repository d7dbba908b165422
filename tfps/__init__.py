"""tfps: TensorFlow parameter-server training whose jobs end cleanly.

The package is importable without TensorFlow: only the modules that build graphs or run
a task (``tfps.task.*`` below ``run_task``, ``tfps.models``, ``tfps.data.dataset``'s
dataset pipeline) import it, and they do so lazily, after the CLI has checked that
TensorFlow is installed.

Layout: ``cli`` (the ``tfps`` command), ``config`` (run options), ``cluster/`` (the plan),
``task/`` (one ps, worker or chief task), ``outcome/`` (results, journal, report, plot),
``notify/`` (the completion message), ``launch/`` (``tfps local`` and ``tfps compose``),
``data``, ``models``, ``keras_model`` and ``modelspec`` (what a job trains on and trains),
``demo`` (the demo datasets), ``logs`` (the one logging setup), ``timeouts`` (every
timeout of a job), ``errors`` and ``exitcodes``. Each layer imports only those below it
(tests/unit/test_imports.py holds the order, docs/design/layers.md says why).
"""

import os as _os

#: The one version of tfps (pyproject.toml reads it; CHANGELOG.md says what each brought).
__version__ = "0.2.0"

#: When this is 1 before TensorFlow is imported, ``tf.keras`` is tf_keras (Keras 2), whose
#: models build tf.compat.v1 graphs; otherwise it is Keras 3, which cannot train on
#: parameter servers (tfps.models.keras_model refuses such a model).
LEGACY_KERAS_ENV = "TF_USE_LEGACY_KERAS"


def use_tf_keras(environ=_os.environ) -> None:
    """Make ``tf.keras`` tf_keras unless the user chose otherwise (``setdefault``).

    tfps's entry points call this before TensorFlow is imported: ``tfps`` and ``python -m
    tfps`` (``tfps.cli.main``), a task's entry (``tfps.task.entry.main``) and
    ``tfps.task.import_tensorflow``. ``import tfps`` alone changes no environment variable.
    """
    environ.setdefault(LEGACY_KERAS_ENV, "1")


def legacy_keras_refused(environ=_os.environ) -> str | None:
    """The value of TF_USE_LEGACY_KERAS when the user set it to one that makes ``tf.keras``
    Keras 3 (TensorFlow's own test: only ``1``, ``true`` and ``True`` mean tf_keras), else None."""
    value = environ.get(LEGACY_KERAS_ENV)
    return value if value is not None and value not in ("true", "True", "1") else None
