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

import contextlib
import logging
import os
import sys

from tfps import timeouts

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
    before being initialised (twice per process)."""
    return ((line.startswith("I0000 ") and "port.cc" in line)
            or line.startswith("WARNING: All log messages before absl::InitializeLog()"))


@contextlib.contextmanager
def tf_import_banner_dropped():
    """While inside (TensorFlow's import, a user's module that imports it): file descriptor 2
    goes through a filter process to stderr, TensorFlow's banner (:func:`is_tf_noise`) left
    out. Nothing is dropped when ``TF_CPP_MIN_LOG_LEVEL`` asks for TensorFlow's INFO lines
    (``-v``, or the user's own ``0``).

    A process, not a thread (the launcher stays single-threaded until it forks its tasks),
    and a pipe, not a file held until the end: if the import aborts the process from C++ (a
    failed check, a protobuf mismatch), the filter still passes on its last words. It is
    in a session of its own, so that Ctrl-C reaches only the process that imports.
    """
    if os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0") in ("", "0") or _goes_nowhere(2):
        yield
        return
    import subprocess
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = os.dup(2)
    read_end, write_end = os.pipe()
    try:
        filt = subprocess.Popen(banner_filter_command(), stdin=read_end, stdout=saved,
                                stderr=saved, start_new_session=True)
    except OSError:   # no process to spare: nothing is filtered
        filt = None
    os.close(read_end)
    if filt is not None:
        os.dup2(write_end, 2)
    os.close(write_end)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        if filt is not None:
            # Its lines come before whatever is written next.
            with contextlib.suppress(subprocess.TimeoutExpired):
                filt.wait(timeouts.BANNER_FILTER_DRAIN_SECS)


def _goes_nowhere(fd: int) -> bool:
    """``fd`` is /dev/null (the launcher's own import, unless ``-v``): nothing to filter."""
    try:
        st, null = os.fstat(fd), os.stat(os.devnull)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (null.st_dev, null.st_ino)


def banner_filter_command(root: str | None = None) -> list[str]:
    """The filter process of :func:`tf_import_banner_dropped`: this interpreter, isolated and
    without site-packages, importing tfps from ``root`` (where this tfps is). A filter that
    cannot import it passes everything on, so the pipe never goes unread."""
    root = root or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = (f"import os, sys\nsys.path.insert(0, {root!r})\n"
            "try:\n    from tfps.logs import pass_on_all_but_the_banner\n"
            "except Exception:\n"
            "    while (chunk := os.read(0, 65536)):\n        os.write(1, chunk)\n"
            "else:\n    pass_on_all_but_the_banner()\n")
    return [sys.executable, "-I", "-S", "-c", code]


def pass_on_all_but_the_banner() -> None:
    """The filter process of :func:`tf_import_banner_dropped`: stdin's lines to stdout as
    they come, TensorFlow's banner left out."""
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        if not is_tf_noise(line.decode(errors="replace")):
            out.write(line)
            out.flush()


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
    return log
