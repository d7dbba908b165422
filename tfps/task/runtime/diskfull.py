"""A disk that fills while the chief saves: one line naming the disk and the need, no leftovers.

A full disk reaches the chief in two forms: ``OSError`` with ``errno.ENOSPC`` (results.json,
history.jsonl, anything Python writes) and a TensorFlow ``OpError`` whose message holds the
C library's text "No space left on device" (``SaveV2``, ``MergeV2Checkpoints``, the
SavedModel's writes; TensorFlow raises it as ``ResourceExhaustedError`` or ``UnknownError``).
``is_disk_full`` knows both, anywhere in an exception's chain. ``DiskFull`` is the one line
the job fails with: ``the disk of /data/model is full (0 B free of 2.0 MiB) while writing the
checkpoint of step 58, which needs about 12.2 MiB: free space there or give --model_dir on a
larger disk``. ``remove_save_temporaries`` removes what a failed save leaves: TensorFlow's
``*.tempstate*`` files and ``*_temp*/`` directories of a sharded save.

Pure Python: no TensorFlow import (the classification reads types' and messages' text).
"""

from __future__ import annotations

import fnmatch
import logging
import os
import re
import shutil

from tfps.errors import DiskFull, disk_full_line, error_chain, is_disk_full, size_text  # noqa: F401 - names the chief uses

log = logging.getLogger("tfps")

#: The file TensorFlow was writing, in its message: ``/m/model.ckpt-58.data-00000-of-00001.tempstate123; No space``.
_TF_PATH = re.compile(r"(/[^\s;']+); (?:No space left on device|Disk quota exceeded)")
#: The step of a checkpoint file or temporary (``model.ckpt-58.index``, ``model.ckpt-58_temp/part-...``).
_CKPT_STEP = re.compile(r"-(\d+)(?:_temp|\.data-|\.index|\.meta|\.tempstate)")


def written_path(error: BaseException | None) -> str | None:
    """The file that could not be written, when the error names it."""
    for e in error_chain(error):
        if isinstance(e, OSError) and e.filename:
            return os.fsdecode(e.filename)
        m = _TF_PATH.search(getattr(e, "message", None) or str(e))
        if m:
            return m.group(1)
    return None


def checkpoint_step_of(path: str | None) -> int | None:
    """The global step in the name of a checkpoint file or temporary (None for other files)."""
    if not path:
        return None
    m = _CKPT_STEP.search(os.path.basename(path) if "_temp" not in path else path)
    return int(m.group(1)) if m else None


def checkpoint_bytes(prefix: str | None) -> int:
    """Bytes of one whole checkpoint (its data files, index and meta graph), 0 without one."""
    if not prefix:
        return 0
    head, base = os.path.split(prefix)
    total = 0
    try:
        names = os.listdir(head or ".")
    except OSError:
        return 0
    for name in names:
        if name.startswith(base + ".") and ".tempstate" not in name and (
                name.startswith(base + ".data-") or name in (base + ".index", base + ".meta")):
            try:
                total += os.path.getsize(os.path.join(head, name))
            except OSError:
                pass
    return total


def disk_full(error: BaseException, directory: str, what: str, need_bytes: float | None,
              flag: str = "model_dir") -> DiskFull:
    """``error`` as the job's one-line ``DiskFull`` (raised from it, for the traceback in results.json)."""
    full = DiskFull(disk_full_line(directory, what, need_bytes, flag))
    full.__cause__ = error
    return full


def what_was_written(error: BaseException, fallback_step: int) -> str:
    """``the checkpoint of step 58``, ``history.jsonl``: what a full disk stopped, from its error."""
    path = written_path(error)
    step = checkpoint_step_of(path)
    if step is not None or path is None or "ckpt" in os.path.basename(path) or "_temp" in path:
        return f"the checkpoint of step {step if step is not None else fallback_step}"
    return os.path.basename(path)


def remove_save_temporaries(directory: str) -> list[str]:
    """Remove what a failed TensorFlow save leaves in ``directory``: ``*.tempstate*`` files and
    ``*_temp*`` directories (a sharded save's parts). Returns the names removed."""
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        path = os.path.join(directory, name)
        try:
            if fnmatch.fnmatchcase(name, "*.tempstate*") and not os.path.isdir(path):
                os.unlink(path)
            elif fnmatch.fnmatchcase(name, "*_temp*") and os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                continue
        except OSError as e:
            log.warning("could not remove %s: %s", path, e)
            continue
        removed.append(name)
    return removed
