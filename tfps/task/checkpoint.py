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
