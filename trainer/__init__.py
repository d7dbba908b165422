"""tfps: TensorFlow parameter-server training whose jobs end cleanly.

The package is importable without TensorFlow: only the modules that build graphs
(``trainer.train``, ``trainer.ps``, ``trainer.export``, ``trainer.models``,
``trainer.data``) import it, and they do so lazily from the CLI.
"""

__version__ = "0.1.0"
