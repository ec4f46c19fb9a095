"""Reading numeric settings from the environment or an option bag.

Every integration takes a few durations and counts (a lease, a heartbeat interval, a polling
interval, a batch size), and the broker its takeover time, from keyword arguments, ``OBJQ_*``
environment variables or a framework's option dict. They are parsed here, once, with one
kind of refusal: a :class:`~objq_broker.errors.ConfigurationError` that names the setting,
says what was expected and shows what was found.

>>> positive_seconds("2.5", "heartbeat_interval", where="objq transport")
2.5
>>> positive_seconds(0, "heartbeat_interval", where="objq transport")
Traceback (most recent call last):
...
objq_broker.errors.ConfigurationError: objq transport: option heartbeat_interval: expected a \
positive number of seconds, at most about a century, found 0
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

from objq_broker.errors import ConfigurationError
from objq_broker.model.checks import MAX_SECONDS, shown

__all__ = [
    "option_count",
    "option_seconds",
    "positive_count",
    "positive_seconds",
    "seconds_from_env",
]


def positive_seconds(raw: object, name: str, *, where: str, label: str = "option") -> float:
    """``raw`` as a finite number of seconds above zero and at most :data:`MAX_SECONDS`
    (numbers and numeric text accepted; bools, zero, negatives, NaN, infinity and spans past a
    century refused: one that long is a mistake, and may overflow a timer or a deadline)."""
    value = _number(raw)
    if value is None or not 0 < value <= MAX_SECONDS:
        raise ConfigurationError(
            f"{where}: {label} {name}: expected a positive number of seconds, at most about "
            f"a century, found {shown(raw)}"
        )
    return value


def positive_count(raw: object, name: str, *, where: str, label: str = "option") -> int:
    """``raw`` as a whole number of at least one (``5``, ``5.0`` and ``"5"`` accepted)."""
    value = _number(raw)
    if value is None or value < 1 or not value.is_integer():
        raise ConfigurationError(
            f"{where}: {label} {name}: expected a positive whole number, found {shown(raw)}"
        )
    return int(value)


def option_seconds(options: Mapping[str, Any], name: str, default: float, *, where: str) -> float:
    """``options[name]`` as positive seconds; ``default`` when absent or None."""
    raw = options.get(name)
    return float(default) if raw is None else positive_seconds(raw, name, where=where)


def option_count(options: Mapping[str, Any], name: str, default: int, *, where: str) -> int:
    """``options[name]`` as a positive whole number; ``default`` when absent or None."""
    raw = options.get(name)
    return default if raw is None else positive_count(raw, name, where=where)


def seconds_from_env(
    name: str, default: float, *, environ: Mapping[str, str] | None = None
) -> float:
    """The positive seconds in environment variable ``name`` (read now, never at import);
    ``default`` when it is not set."""
    raw = (os.environ if environ is None else environ).get(name)
    if raw is None:
        return default
    return positive_seconds(raw, f"${name}", where="environment", label="variable")


def _number(raw: object) -> float | None:
    """A finite float from a number or numeric text; None for anything else."""
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) else None
