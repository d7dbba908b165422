"""Durations and cadences given as text: ``90s``, ``10m``, ``2h`` (and ``500`` steps).

One parser for every option that takes a duration (``--export_every``; the lead merges
``--follow_idle``'s here), so ``10m`` means the same wherever it is written. Pure Python.
"""

from __future__ import annotations

import math
import re

from tfps.errors import ConfigError

#: Seconds per unit of a duration.
UNITS = {"s": 1, "m": 60, "h": 3600}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smh])")


def parse_every(value, field: str) -> tuple[str, float]:
    """``"10m"`` -> ``("secs", 600.0)``, ``"90s"`` -> ``("secs", 90.0)``, ``"2h"`` -> ``("secs",
    7200.0)``, ``"500"`` (or 500) -> ``("steps", 500)``: a cadence in seconds or global steps.

    Anything else, and a cadence of zero, is one ConfigError about ``field`` that says what to
    write. A duration is a number and one unit (s, m or h); a bare number is global steps.
    """
    text = str(value).strip().lower() if not isinstance(value, bool) else ""
    if text.isdigit() and 0 < int(text) <= 2**62:   # the global step is an int64
        return "steps", int(text)
    match = _DURATION.fullmatch(text)
    if match:
        seconds = float(match.group(1)) * UNITS[match.group(2)]
        if math.isfinite(seconds) and 0 < seconds <= 10**9:
            return "secs", seconds
    raise ConfigError(f"{value!r} is not a duration or a step count; write seconds, minutes or hours "
                      "such as 90s, 10m or 2h, or a whole number of global steps such as 500", field)
