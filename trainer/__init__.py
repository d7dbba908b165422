"""tfps: TensorFlow parameter-server training whose jobs end cleanly.

The package is importable without TensorFlow: only the modules that build graphs or run
a task (``trainer.task.*`` below ``run_task``, ``trainer.models``, ``trainer.data``'s
dataset pipeline) import it, and they do so lazily, after the CLI has checked that
TensorFlow is installed.

Layout: ``cli`` (the ``tfps`` command), ``config`` (run options), ``cluster`` (the plan),
``task/`` (one ps, worker or chief task), ``outcome/`` (results, report, plot),
``notify/`` (the completion message), ``local`` and ``compose`` (launchers),
``logs`` (the one logging setup), ``timeouts`` (every timeout of a job).
"""

__version__ = "0.1.0"
