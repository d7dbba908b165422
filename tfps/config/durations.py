"""Durations and cadences given as text: ``90s``, ``10m``, ``2h`` (and ``500`` steps).

One parser for every option that takes a duration (``--export_every``, ``--follow_idle``,
``--stall_timeout``), so ``10m`` means the same wherever it is written. Pure Python.
"""

from __future__ import annotations

import math
import re

from tfps.errors import ConfigError

#: Seconds per unit of a duration.
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd])")
#: A duration with an optional unit (a plain number is seconds).
_SECONDS = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([smhd]?)\s*$", re.IGNORECASE)


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


def parse_duration(text, field: str) -> float:
    """``90s``, ``10m``, ``2h``, ``1d`` or a plain number of seconds -> seconds (a plain
    number as it is: the option's own check judges its range)."""
    try:
        return float(text)
    except (TypeError, ValueError):
        pass
    m = _SECONDS.match(str(text))
    if not m:
        raise ConfigError(f"{text!r} is not a duration; write a number with s, m, h or d, such as 90s, 10m or 2h",
                          field)
    return float(m.group(1)) * UNITS.get(m.group(2).lower(), 1)
