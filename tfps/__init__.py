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

__version__ = "0.1.0"
