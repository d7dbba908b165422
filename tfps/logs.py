"""The one logging setup of every tfps process: tfps's lines on stderr, TensorFlow's quiet.

tfps's own lines (logger ``tfps`` and its children, such as ``tfps.notify``) go to
stderr, one per event, for people; stdout stays for what a command prints as its
result (``tfps plan``, ``notify-test``'s per-service lines, ``tfps local``'s summary).

TensorFlow stays out of the console unless ``-v`` is given:

* Its Python logger (``tensorflow``) has no level of its own, so it inherits the root
  logger's. tfps used to configure the root logger (``logging.basicConfig``) before
  TensorFlow was imported, and TensorFlow's INFO chatter came along. So only the
  ``tfps`` logger is configured here; ``tensorflow`` is set to WARNING, and its
  deprecation notices ("... is deprecated ...", "Instructions for updating") are dropped,
  as is StepCounterHook's "global step ... has not been increased", which parameter-server
  training triggers harmlessly (the hook reads the step on the ps alongside the train op,
  so two steps can read the same value before the updates land).
* Its C++ side (absl, oneDNN) reads ``TF_CPP_MIN_LOG_LEVEL`` once, when TensorFlow is
  loaded. :func:`setup` sets it here, before anything imports TensorFlow, and child
  processes (``tfps local``'s tasks, ``tfps run --restarts``) inherit it. A value the
  user set in the environment wins.

With ``-v``: tfps logs DEBUG, TensorFlow INFO with its deprecation notices, and the C++
side everything (``TF_CPP_MIN_LOG_LEVEL=0``).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import os
import sys
import tempfile

#: The logger of tfps's own lines; modules use it or a child (``tfps.notify``).
LOGGER = "tfps"
#: ``TF_CPP_MIN_LOG_LEVEL`` when not verbose: 2 hides INFO and WARNING of absl and oneDNN.
TF_CPP_QUIET = "2"
TF_CPP_VERBOSE = "0"
#: Parts of TensorFlow's deprecation notices (logged as warnings, one per deprecated call).
DEPRECATION_MARKERS = ("is deprecated", "Instructions for updating")
#: TensorFlow warnings that say nothing wrong about a parameter-server job (see above).
NOISE_MARKERS = ("It seems that global step (tf.train.get_global_step) has not been increased",)


def is_tf_noise(line: str) -> bool:
    """TensorFlow's C++ lines printed at its import whatever TF_CPP_MIN_LOG_LEVEL says, on
    CPUs where oneDNN is on: the oneDNN banner, and absl's notice that it logs to stderr
    before being initialised (twice per process). tfps leaves them out where it reads a
    task's output (``tfps local``'s task lines, ``tfps logs``); a container's own log
    (``docker logs``) keeps them, as it keeps everything the process wrote."""
    return ((line.startswith("I0000 ") and "port.cc" in line)
            or line.startswith("WARNING: All log messages before absl::InitializeLog()"))


FORMAT = "%(asctime)s %(levelname).1s %(message)s"
DATEFMT = "%H:%M:%S"


class DropDeprecations(logging.Filter):
    """Drops TensorFlow's deprecation notices (they speak to TensorFlow's developers, not to
    tfps's users) and the warnings of ``NOISE_MARKERS``."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a broken record is not ours to judge
            return True
        return not any(marker in message for marker in DEPRECATION_MARKERS + NOISE_MARKERS)


_DROP = DropDeprecations()


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a line is logged (as logging's lastResort does),
    so a process that swaps stderr (pytest's capture, a daemonising launcher) keeps its lines."""

    def __init__(self):
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value):
        pass


def _attach(logger: logging.Logger, handler: logging.Handler) -> None:
    for h in list(logger.handlers):
        if getattr(h, "_tfps", False):
            logger.removeHandler(h)
    logger.addHandler(handler)


def setup(verbose: bool = False, stream=None) -> logging.Logger:
    """Configure the ``tfps``, ``tensorflow`` and ``apprise`` loggers and TF's C++ log level.

    Idempotent. apprise's warnings (a service that refused a message, scrubbed of
    secrets by tfps.notify.secrets) share tfps's handler; its INFO lines only with -v.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", TF_CPP_VERBOSE if verbose else TF_CPP_QUIET)

    handler = logging.StreamHandler(stream) if stream is not None else _StderrHandler()
    handler.setFormatter(logging.Formatter(FORMAT, datefmt=DATEFMT))
    handler._tfps = True  # type: ignore[attr-defined]

    log = logging.getLogger(LOGGER)
    _attach(log, handler)
    log.setLevel(logging.DEBUG if verbose else logging.INFO)
    log.propagate = False   # the root logger stays unconfigured: TensorFlow inherits nothing

    apprise_log = logging.getLogger("apprise")
    _attach(apprise_log, handler)
    apprise_log.setLevel(logging.DEBUG if verbose else logging.WARNING)

    tf_log = logging.getLogger("tensorflow")
    tf_log.setLevel(logging.INFO if verbose else logging.WARNING)
    if verbose:
        tf_log.removeFilter(_DROP)
    elif _DROP not in tf_log.filters:
        tf_log.addFilter(_DROP)
    quiet_tensorflow_import(not verbose)
    return log


# ------------------------------------------------- TensorFlow's import banner
def replay_without_noise(text: str, fd: int = 2) -> None:
    """Write ``text`` (what went to stderr while TensorFlow loaded) to ``fd`` without the
    lines of :func:`is_tf_noise`: a real warning or a crash's last words still show."""
    kept = "".join(line for line in text.splitlines(keepends=True) if not is_tf_noise(line))
    if kept:
        os.write(fd, kept.encode(errors="replace"))


class _StderrHeld:
    """File descriptor 2 goes to a temporary file until :meth:`release`, which replays what
    came there through :func:`replay_without_noise`."""

    def __init__(self) -> None:
        sys.stderr.flush()
        self._saved = os.dup(2)
        self._file = tempfile.TemporaryFile()
        os.dup2(self._file.fileno(), 2)

    def release(self) -> None:
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os.dup2(self._saved, 2)
        os.close(self._saved)
        self._file.seek(0)
        text = self._file.read().decode(errors="replace")
        self._file.close()
        replay_without_noise(text)


class _QuietLoader(importlib.abc.Loader):
    """TensorFlow's own loader, its module run with file descriptor 2 held (:class:`_StderrHeld`)."""

    def __init__(self, loader) -> None:
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        held = _StderrHeld()
        try:
            self._loader.exec_module(module)
        finally:
            held.release()

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _QuietTensorFlowImport(importlib.abc.MetaPathFinder):
    """The first ``import tensorflow`` of the process, wherever it happens (tfps's tasks, the
    launcher's checks, a user's model module), without the C++ lines that TensorFlow prints
    at its import whatever TF_CPP_MIN_LOG_LEVEL says: absl's "All log messages before
    absl::InitializeLog() ..." and oneDNN's "oneDNN custom operations are on" on CPUs where
    oneDNN is on by default (AMD EPYC; TF_ENABLE_ONEDNN_OPTS=1 forces it anywhere). They are
    dropped, every other line written meanwhile is replayed once the import is over."""

    _busy = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "tensorflow" or self._busy:
            return None
        self._busy = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy = False
        if spec is None or spec.loader is None:
            return None
        spec.loader = _QuietLoader(spec.loader)
        return spec


_QUIET_IMPORT = _QuietTensorFlowImport()


def quiet_tensorflow_import(quiet: bool = True) -> None:
    """Hide TensorFlow's import banner (:class:`_QuietTensorFlowImport`) or, with ``-v``, show it."""
    if _QUIET_IMPORT in sys.meta_path:
        sys.meta_path.remove(_QUIET_IMPORT)
    if quiet and "tensorflow" not in sys.modules:
        sys.meta_path.insert(0, _QUIET_IMPORT)
