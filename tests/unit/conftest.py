"""Unit tests call ``cli.main`` in-process; its logging setup must not leak into later tests."""

from __future__ import annotations

import logging

import pytest

import tfps
from tfps import logs

# Unit tests build Keras models in their own process, as a task does: tf.keras is tf_keras
# here as under tfps's entry points (``import tfps`` alone sets nothing). Integration and
# system tests start tfps's entry points, which set it themselves.
tfps.use_tf_keras()


@pytest.fixture(autouse=True)
def clean_logging(monkeypatch):
    """Undo what ``logs.setup`` does to the process (loggers, TF_CPP_MIN_LOG_LEVEL) after each test."""
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    saved = {}
    for name in (logs.LOGGER, "tensorflow", "apprise"):
        lg = logging.getLogger(name)
        saved[name] = (list(lg.handlers), list(lg.filters), lg.level, lg.propagate)
    yield
    for name, (handlers, filters, level, propagate) in saved.items():
        lg = logging.getLogger(name)
        lg.handlers[:] = handlers
        # Filters installed meanwhile stay (the notifier's secret scrubber is installed once per process).
        lg.filters[:] = filters + [f for f in lg.filters if f not in filters and f is not logs._DROP]
        lg.setLevel(level)
        lg.propagate = propagate
