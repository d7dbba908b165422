"""Where a worker's training data failed as it was read: the file, the line and the column.

The launcher checks the first ``tfps.data.dataset.CSV_SCAN_ROWS`` rows of each CSV file before
start; the rest is checked as it is read (``tf.debugging.assert_all_finite`` in the input
pipeline), and TensorFlow's error names the op, not the row. When a task fails on that
check, it looks for the row itself, in the part of the data it reads (its shard), so
that results.json and the message say which line of which file to fix.
"""

from __future__ import annotations

import csv
import logging
import math
import time

from tfps.data import dataset as data_mod

log = logging.getLogger("tfps")

#: How long a failed task may spend looking for the row (large files: the message then
#: names the files only).
LOCATE_BUDGET_SECS = 60.0


class DataFault(ValueError):
    """Training data that failed as a task read it, past the rows checked before start."""


def is_nonfinite_data_error(error: BaseException) -> bool:
    """Whether ``error`` is the input pipeline's check of non-finite values (tfps.data.dataset)."""
    text = getattr(error, "message", None) or str(error)
    return "non-finite value" in text and "training data" in text


def locate_nonfinite(schema, num_shards: int, shard_index: int,
                     budget: float = LOCATE_BUDGET_SECS) -> str | None:
    """"FILE:LINE has a non-finite value (nan) in column 'c'; ..." for the first such cell of
    this shard's CSV rows, or None (not CSV, not found, or not within ``budget`` seconds)."""
    if getattr(schema, "fmt", None) != "csv":
        return None
    files = list(schema.files)
    by_file = len(files) >= num_shards
    own = data_mod.shard_files(files, num_shards, shard_index) if by_file else files
    deadline = time.monotonic() + budget
    strings = set(getattr(schema, "string_columns", ()) or ())
    for path in own:
        found = _scan(path, strings, None if by_file or len(files) > 1 else (num_shards, shard_index), deadline)
        if found is not None:
            return found
        if time.monotonic() > deadline:
            log.info("the search for the non-finite value took more than %.0f s; stopped", budget)
            return None
    return None


def _scan(path: str, strings: set[str], shard: tuple[int, int] | None, deadline: float) -> str | None:
    try:
        with open(path, newline="", errors="replace") as fh:
            reader = csv.reader(fh)
            header = [h.strip() for h in next(reader, [])]
            numeric = [i for i, h in enumerate(header) if h not in strings]
            # Line k after the header is record k of the file (TextLineDataset, then shard(n, i)).
            for k, row in enumerate(reader):
                if shard is not None and k % shard[0] != shard[1]:
                    continue
                if k % 4096 == 0 and time.monotonic() > deadline:
                    return None
                for i in numeric:
                    if i >= len(row):
                        break
                    try:
                        v = float(row[i])
                    except ValueError:
                        continue
                    if not math.isfinite(v):
                        return (f"{path}:{reader.line_num} has a non-finite value ({row[i].strip()}) in column "
                                f"{header[i]!r}; fix or remove that row (it lies past the first "
                                f"{data_mod.CSV_SCAN_ROWS} rows checked before start)")
    except OSError as e:
        log.debug("cannot read %s to find the non-finite value: %s", path, e)
    return None
