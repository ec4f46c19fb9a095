"""Durations and times as people type them (``90s``, ``15m``, ``2h``, ``7d``, ISO 8601): one
parser for the command line and the Spark report."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime

from objq_broker.errors import ConfigurationError
from objq_broker.model.checks import shown

#: Units accepted in durations, in seconds.
DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_AGE = re.compile(r"^-?(\d+(?:\.\d+)?)([smhd])$")


def parse_duration(text: str, where: str = "duration") -> float:
    """Seconds from ``90``, ``90s``, ``15m``, ``2h`` or ``7d``: finite and not negative."""
    raw = text.strip().lower()
    unit = DURATION_UNITS.get(raw[-1:])
    number = raw[:-1] if unit is not None else raw
    try:
        seconds = float(number) * (unit or 1.0)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0:
        raise ConfigurationError(
            f"{where}: expected a number of seconds, or a number with s/m/h/d (90, 15m, 2h), "
            f"zero or more, found {shown(text)}"
        )
    return seconds


def parse_time(text: str, now: float, where: str = "time") -> float:
    """Unix seconds from ISO 8601 (UTC when no zone is given), Unix seconds, or an age such
    as ``90m``, ``24h``, ``7d`` (that long before ``now``; a leading ``-`` is allowed)."""
    raw = text.strip()
    age = _AGE.match(raw.lower())
    if age:
        return now - float(age.group(1)) * DURATION_UNITS[age.group(2)]
    try:
        stamp = datetime.fromisoformat(raw)
    except ValueError:
        pass
    else:
        if stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=UTC)
        return stamp.timestamp()
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds):
        raise ConfigurationError(
            f"{where}: expected ISO 8601 (2026-11-26T10:00), Unix seconds or an age (2h), "
            f"found {shown(text)}"
        )
    return seconds
