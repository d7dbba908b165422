"""Whether a file that a launcher is asked to write over is one that tfps wrote.

``tfps compose -o`` and ``tfps slurm -o`` overwrite their own earlier output, and never a
user's file: their output begins with lines of tfps's own, which this reads.
"""

from __future__ import annotations


def written_by_tfps(path: str, first_line: str, mark: str, within: int) -> bool:
    """Whether ``path`` is empty, or its first line starts with ``first_line`` and one of its
    next ``within`` lines starts with ``mark``; False when it cannot be read."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096).decode("utf-8", "replace").splitlines()
    except OSError:
        return False
    if not head:
        return True
    return head[0].startswith(first_line) and any(line.startswith(mark) for line in head[1:within + 1])
