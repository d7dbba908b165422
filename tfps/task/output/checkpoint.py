"""The global step of a checkpoint, read from its path: the one parser of ``model.ckpt-<step>``.

TensorFlow's savers name every checkpoint ``<prefix>-<global step>`` (``model.ckpt-400``),
and ``tf.train.latest_checkpoint`` returns that path. Pure Python: no TensorFlow import.
"""

from __future__ import annotations

import os


def checkpoint_step(path: str | None) -> int:
    """``/data/model/model.ckpt-400`` -> 400; no checkpoint (None or "") -> 0.

    A path without a step is not a checkpoint tfps wrote: ValueError says which.
    """
    if not path:
        return 0
    _, sep, step = os.path.basename(path).rpartition("-")
    if not sep or not step.isdigit():
        raise ValueError(f"{path} does not end in -<global step> like a checkpoint path (model.ckpt-400)")
    return int(step)


#: What TensorFlow's file patterns (fnmatch) read as other than themselves.
_GLOB_SPECIAL = frozenset("*?[]\\")
_DIR_FDS: dict[str, int] = {}


def glob_free_dir(directory: str) -> str:
    """A path of ``directory`` without glob characters, for TensorFlow.

    TensorFlow's restore op (RestoreV2) globs ``PREFIX.index`` to tell a V2 checkpoint from a
    V1 one: in ``runs/exp[lr=0.01]`` the ``[lr=0.01]`` is a character class, the checkpoint is
    "not found" and the restore fails. A directory whose path holds such characters is given
    to TensorFlow as ``/proc/self/fd/N`` (a descriptor held open for the process's life), the
    same directory under a plain name. Other paths, and systems without /proc, are unchanged.
    """
    path = os.path.abspath(directory)
    if not _GLOB_SPECIAL.intersection(path) or not os.path.isdir("/proc/self/fd"):
        return directory
    real = os.path.realpath(path)
    fd = _DIR_FDS.get(real)
    if fd is None:
        try:
            fd = os.open(real, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return directory
        _DIR_FDS[real] = fd
    return f"/proc/self/fd/{fd}"


def glob_free_checkpoint(checkpoint: str) -> str:
    """``checkpoint`` (a prefix, ``.../model.ckpt-400``) in a :func:`glob_free_dir`."""
    head, tail = os.path.split(checkpoint)
    return os.path.join(glob_free_dir(head), tail) if head else checkpoint
