"""The arguments of a dynamic table (``DynamicTable``, ``DynamicEmbedding``), checked when it
is made: each bad one is a ValueError that names it, its bounds and what was given, before any
variable exists. A float would be truncated, a string fail deep inside TensorFlow, and a count
past 32 bits wrap (every id admitted at once); so each must be a whole number in its range."""

from __future__ import annotations

import numbers

from tfps.config import MAX_INT64_FLAG, MAX_MIN_COUNT, MAX_TABLE_IDS

#: The widest row: TensorFlow's shapes of a row are int32 in the ops that slice it.
MAX_OUTPUT_DIM = 2**31 - 1


def _whole(table: str, arg: str, value, least: int, most: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        kind = type(value).__name__
        raise ValueError(f"DynamicEmbedding {table}: {arg} must be a whole number ({what}, {least}..{most}), "
                         f"not {value!r} (a {kind})")
    if not least <= int(value) <= most:
        raise ValueError(f"DynamicEmbedding {table}: {arg} must be {least}..{most} ({what}), not {value}")
    return int(value)


def check_table_args(table: str, output_dim, min_count, steps_to_live, capacity) -> tuple:
    """``(output_dim, min_count, steps_to_live or None, capacity or None)`` as ints, or ValueError."""
    dim = _whole(table, "output_dim", output_dim, 1, MAX_OUTPUT_DIM, "the width of each id's row")
    count = _whole(table, "min_count", min_count, 1, MAX_MIN_COUNT,
                   "times an id is seen before it gets its own row; unadmitted ids are counted in 32 bits")
    live = None if steps_to_live is None else _whole(
        table, "steps_to_live", steps_to_live, 1, MAX_INT64_FLAG,
        "global steps an unseen id keeps its row; None never frees it")
    cap = None if capacity is None else _whole(
        table, "capacity", capacity, 1, MAX_TABLE_IDS, "rows of the whole table; None for the default")
    return dim, count, live, cap


def check_id_dtype(table: str, dtype) -> None:
    """TypeError unless ``dtype`` (a tf.DType) is one a table keys ids by: strings or integers."""
    if dtype.name != "string" and not dtype.is_integer:
        raise TypeError(f"DynamicEmbedding {table} takes string or integer ids (tf.string, tf.int32, tf.int64, "
                        f"...), not {dtype.name}: cast ids that are whole numbers to tf.int64, or give them as "
                        "strings")
