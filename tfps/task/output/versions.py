"""SavedModel versions while the job trains (``--export_every``), in TF Serving's layout.

TF Serving polls a model's base path and serves the highest integer directory under it.
So with ``--export_every`` the export directory becomes that base path: the chief exports
the newest checkpoint into ``<export_dir>/<version>/`` every DURATION or every STEPS global
steps, and once more at the end (the job's final export is then its last version; results.json
names that directory).

* **Versions only increase.** A version is the global step of its checkpoint, or one more
  than the highest version already in the base path when that is higher (a chief that
  restarted from an older checkpoint, a new job writing into an old job's base path): a
  number is never reused, so TF Serving always takes the new one.
* **Each appears whole.** It is written into ``.tmp-<version>`` in the same base path (a
  hidden name TF Serving does not read as a version), every file and directory is synced to
  disk, and one ``rename`` gives it its integer name. A reader sees no version or a complete
  one. Its metadata (:func:`metadata`: global step, checkpoint, time, the stream position and
  the progressive AUC from their providers) is the ``tfps_export.json`` inside it.
* **Training goes on.** The chief saves a checkpoint when a version is due (the checkpoint
  hook asks :meth:`Versions.due`) and exports it in a thread of its own, at low CPU priority
  (nice 10, its own TensorFlow thread pool of one thread), from the checkpoint file into a
  fresh local graph as the final export does; the training session never waits for it. At
  most one export runs at a time: a version that comes due while one is written waits.
* **A failure is one line.** A version that fails is one logged line; the third failure in a
  row is also one message (event ``exports_failing``); the next success says so. It never
  ends the job. ``--keep_exports K`` removes the oldest versions beyond K after each one.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from typing import Any

from tfps.outcome.results import now_iso, read_export_marker

log = logging.getLogger("tfps")

#: The hidden prefix of a version being written (and of one being removed).
TMP_PREFIX = ".tmp-"
#: Failures in a row that make the one "exports_failing" message.
FAILURES_BEFORE_MESSAGE = 3
#: Nice value of the thread that exports (and of the TensorFlow threads it starts).
EXPORT_NICE = 10
#: Metadata fields that other parts of a job fill (stream input, progressive validation):
#: present in every version, None until a provider gives them.
PROVIDED_FIELDS = ("position", "progressive_auc", "progressive")
#: name -> callable giving the value at export time: tfps's stream input sets "position", the
#: chief "progressive_auc" and "progressive" (results.json's block, ``Chief.progressive_figures``).
PROVIDERS: dict[str, Callable[[], Any]] = {}


def set_provider(name: str, provider: Callable[[], Any] | None) -> None:
    """Let ``provider()`` fill the metadata field ``name`` of every later version (None removes it)."""
    if provider is None:
        PROVIDERS.pop(name, None)
    else:
        PROVIDERS[name] = provider


def metadata(version: int, step: int, checkpoint: str, providers: dict[str, Callable[[], Any]] | None = None) -> dict:
    """The metadata of a version, the one place it is built: the version, the global step and
    checkpoint it holds, when it was exported, and each provider's field (None when a provider
    is missing or fails: a view of the job, never a failed export)."""
    out: dict[str, Any] = {"version": int(version), "global_step": int(step), "checkpoint": checkpoint,
                           "exported_at": now_iso(), **{f: None for f in PROVIDED_FIELDS}}
    for name, provider in sorted((PROVIDERS if providers is None else providers).items()):
        try:
            out[name] = provider()
        except Exception as e:  # noqa: BLE001 - the version goes out without that field
            log.info("chief: version %d: no %s: %s", version, name, e)
            out[name] = None
    return out


def versions(base: str) -> list[int]:
    """The integer versions in ``base`` (what TF Serving would read), lowest first."""
    try:
        names = os.listdir(base)
    except OSError:
        return []
    return sorted(int(n) for n in names if n.isdigit() and os.path.isdir(os.path.join(base, n)))


def next_version(base: str, step: int) -> int:
    """The version of a checkpoint of ``step``: the step, unless a version in ``base`` is that
    high already; then one more than the highest (never a number used before)."""
    have = versions(base)
    return max(int(step), have[-1] + 1 if have else 0)


def _fsync_tree(path: str) -> None:
    """Every file and directory under ``path`` (and ``path``) on disk, before it is renamed."""
    for root, _dirs, files in os.walk(path, topdown=False):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(root)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def place(tmp: str, base: str, version: int) -> str:
    """Give the complete version in ``tmp`` its integer name in ``base`` in one rename, after
    syncing it to disk. Refuses (FileExistsError) to replace a version that exists."""
    final = os.path.join(base, str(version))
    _fsync_tree(tmp)
    if os.path.lexists(final):
        raise FileExistsError(f"version {version} exists already in {base}")
    os.rename(tmp, final)
    _fsync_dir(base)
    return final


def prune(base: str, keep: int | None) -> list[int]:
    """Remove the oldest versions beyond the newest ``keep`` (None keeps all): each is first
    renamed to a hidden name, so a reader never finds half of one. Returns those removed."""
    if not keep:
        return []
    old = versions(base)[:-keep]
    for v in old:
        hidden = os.path.join(base, f"{TMP_PREFIX}old-{v}")
        try:
            os.rename(os.path.join(base, str(v)), hidden)
        except OSError:
            continue
        shutil.rmtree(hidden, ignore_errors=True)
    return old


def clear_temporaries(base: str) -> list[str]:
    """Remove what an interrupted export left in ``base`` (``.tmp-*`` directories)."""
    try:
        names = [n for n in os.listdir(base) if n.startswith(TMP_PREFIX)]
    except OSError:
        return []
    for n in names:
        shutil.rmtree(os.path.join(base, n), ignore_errors=True)
    return names


def low_priority() -> None:
    """Lower this thread's CPU priority (Linux: a thread is a task of its own; the threads it
    starts inherit it). Without the right to, it stays as it was."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), EXPORT_NICE)
    except (OSError, AttributeError):
        pass


class Versions:
    """The versions of one chief: a ``CheckpointSaverListener`` (duck-typed) that exports the
    checkpoint just saved when a version is due, in a background thread.

    ``write(checkpoint, dest, step, extra)`` writes a complete SavedModel with its marker
    (holding ``extra``) into ``dest`` (tfps.task.output.export.write_version). ``on_failing(text)``
    sends the one message of failures in a row.
    """

    def __init__(self, write, base: str, cadence: tuple[str, float], keep: int | None, model_dir: str,
                 on_failing: Callable[[str], None] | None = None, clock: Callable[[], float] = time.monotonic):
        self.write, self.base, self.keep, self.model_dir = write, os.path.abspath(base), keep, model_dir
        self.unit, self.every = cadence
        self.on_failing, self.clock = on_failing, clock
        self.last_step: int | None = None        # the global step of the newest version written
        self.last_path: str | None = None
        self.last_at = clock()                   # the first one a full interval after the start
        self.failures = 0                        # in a row
        self.written: list[dict] = []            # {"version", "global_step", "at"} of this process
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        os.makedirs(self.base, exist_ok=True)
        left = clear_temporaries(self.base)
        if left:
            log.info("chief: removed %s left by an interrupted export in %s", ", ".join(sorted(left)), self.base)
        have = versions(self.base)
        marker = read_export_marker(os.path.join(self.base, str(have[-1]))) if have else None
        if marker and os.path.dirname(marker["checkpoint"]) == os.path.abspath(model_dir):
            self.last_step = marker["global_step"]   # a restarted chief: that checkpoint is out already

    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def due(self, step: int) -> bool:
        """Whether a version of global step ``step`` is due (and none is being written)."""
        if self.busy() or (self.last_step is not None and step <= self.last_step):
            return False
        if self.unit == "steps":
            return step - (self.last_step or 0) >= self.every
        return self.clock() - self.last_at >= self.every

    # CheckpointSaverListener
    def begin(self):
        pass

    def before_save(self, session, global_step_value):
        pass

    def after_save(self, session, global_step_value):
        step = int(global_step_value)
        if not self.due(step):
            return
        checkpoint = os.path.join(os.path.abspath(self.model_dir), f"model.ckpt-{step}")
        self.last_at = self.clock()
        self._thread = threading.Thread(target=self._background, args=(checkpoint, step),
                                        name="tfps-version", daemon=True)
        self._thread.start()

    def end(self, session, global_step_value):
        pass

    def _background(self, checkpoint: str, step: int) -> None:
        low_priority()
        try:
            self.export(checkpoint, step, threads=1)
        except Exception as e:  # noqa: BLE001 - a version that fails never ends the job
            self._failed(step, e)

    def _failed(self, step: int, error: Exception) -> None:
        self.failures += 1
        why = (str(error).strip().splitlines() or [type(error).__name__])[0]
        log.warning("chief: version of step %d not exported (%d in a row): %s: %s", step, self.failures,
                    type(error).__name__, why)
        if self.failures == FAILURES_BEFORE_MESSAGE and self.on_failing is not None:
            try:
                self.on_failing(f"{self.failures} versions in a row failed to export into {self.base}; "
                                f"the last: {type(error).__name__}: {why}. Training goes on.")
            except Exception as e:  # noqa: BLE001 - a message is a view
                log.warning("chief: the message about failing exports was not sent: %s", e)

    def export(self, checkpoint: str, step: int, threads: int | None = None) -> str:
        """Write the version of ``checkpoint`` (global step ``step``) now; its directory."""
        with self._lock:
            version = next_version(self.base, step)
            tmp = os.path.join(self.base, f"{TMP_PREFIX}{version}")
            shutil.rmtree(tmp, ignore_errors=True)
            try:
                self.write(checkpoint, tmp, step, metadata(version, step, checkpoint), threads)
                path = place(tmp, self.base, version)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            if self.failures >= FAILURES_BEFORE_MESSAGE:
                log.info("chief: versions are exported again after %d failure(s)", self.failures)
            self.failures = 0
            self.last_step, self.last_path = step, path
            self.written.append({"version": version, "global_step": step, "at": now_iso()})
            removed = prune(self.base, self.keep)
        log.info("chief: exported version %d (global step %d) to %s%s", version, step, path,
                 f"; removed version(s) {', '.join(map(str, removed))} (--keep_exports {self.keep})"
                 if removed else "")
        return path

    def finish(self, checkpoint: str, step: int, wait: float) -> str:
        """The job's last version, of its final checkpoint: waits up to ``wait`` seconds for a
        version being written, then writes this one (unless it is out already)."""
        if self._thread is not None:
            self._thread.join(wait)
        if self.last_step == step and self.last_path and os.path.isdir(self.last_path):
            return self.last_path
        return self.export(checkpoint, step)
