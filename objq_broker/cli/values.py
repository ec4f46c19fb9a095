"""The types of the ``objq`` command line's option values: each turns the text given into the
value, or raises ``argparse.ArgumentTypeError`` naming what was expected and what was found, so
a value the store or the queue API would refuse is refused while arguments are parsed."""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec

from objq_broker.cli import operate
from objq_broker.errors import ConfigurationError
from objq_broker.model import durations
from objq_broker.model.checks import MAX_SECONDS, MAX_WRITE_RATE
from objq_broker.model.settings import from_texts

#: Times ``--since`` and ``--until`` may name (UTC): what the archive's dated keys can write.
TIME_RANGE = (datetime(1970, 1, 1, tzinfo=UTC), datetime(9999, 1, 1, tzinfo=UTC))
#: Queue settings that are durations (the others are counts), by their option names.
DURATION_SETTINGS = frozenset(
    name
    for name in operate.SETTINGS
    if name not in ("max-attempts", "group-concurrency", "fairness")
)


def setting(struct: type[msgspec.Struct], name: str) -> Callable[[str], Any]:
    """An argparse type: setting ``name`` of a component's settings ``struct``, read from
    text and checked as the environment's text is (one reading for both)."""

    def setting(text: str) -> Any:
        try:
            return from_texts(struct, {name: text}, where="value")[name]
        except ConfigurationError as exc:
            raise argparse.ArgumentTypeError(str(exc).split(": ", 2)[-1]) from None

    return setting


def seconds_above_zero(text: str) -> float:
    return seconds(text, above_zero=True)


def price(text: str) -> float:
    """Dollars per 1,000 requests: a finite number, zero or more."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value < 1e6:
        raise argparse.ArgumentTypeError(f"expected dollars per 1,000 requests, found {text!r}")
    return value


def rate(text: str) -> str:
    """A write budget: ``off``, or state writes per second above zero."""
    if text == "off":
        return text
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= MAX_WRITE_RATE:
        raise argparse.ArgumentTypeError(
            f"expected state writes per second above 0 and at most {MAX_WRITE_RATE:g}, or "
            f"off, found {text!r}"
        )
    return text


def flag(text: str) -> str:
    """An argparse type: on or off (true/false, yes/no), as given."""
    if text.lower() not in operate.FLAGS:
        raise argparse.ArgumentTypeError(f"expected on or off, found {shown(text)}")
    return text


def whole(low: int = 1, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number from ``low`` to ``high`` (no limit if None)."""

    def whole(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a whole number, found {shown(text)}"
            ) from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected {low} or more, found {value}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"expected {high} or less, found {value}")
        return value

    return whole


def seconds(text: str, *, above_zero: bool = False) -> float:
    """A duration (``90``, ``90s``, ``15m``, ``2h``, ``7d``) in seconds, at most about a
    century (what the store accepts), ``above_zero`` or zero or more."""
    try:
        seconds = durations.parse_duration(text)
    except ConfigurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if above_zero and seconds == 0:
        raise argparse.ArgumentTypeError(f"expected a duration above zero, found {shown(text)}")
    if seconds > MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"expected a duration of at most {MAX_SECONDS / 86400:.0f}d (about a century), "
            f"found {shown(text)}"
        )
    return seconds


def duration(*, above_zero: bool = False) -> Callable[[str], str]:
    """An argparse type: a duration as :func:`seconds` checks it, kept as the text it was
    given (the command parses it)."""

    def duration(text: str) -> str:
        seconds(text, above_zero=above_zero)
        return text

    return duration


def moment(text: str) -> str:
    """An argparse type: a time (ISO 8601, Unix seconds, or an age such as ``2h``) within
    :data:`TIME_RANGE`, kept as the text it was given (the command parses it)."""
    try:
        stamp = durations.parse_time(text, time.time())
    except ConfigurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    low, high = TIME_RANGE
    if not low.timestamp() <= stamp <= high.timestamp():
        raise argparse.ArgumentTypeError(
            f"expected a time from {low:%Y-%m-%d} to {high:%Y-%m-%d} (UTC), found {shown(text)}"
        )
    return text


def utf8_text(text: str) -> str:
    """An argparse type: text UTF-8 can write. An argument whose bytes are not UTF-8 arrives
    with lone surrogates, which no stored JSON document can hold."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError(f"expected UTF-8 text, found {shown(text)}") from None
    return text


class SettingValue(argparse.Action):
    """``config set``'s VALUE, checked as a duration when KEY (parsed just before it) names
    one, so that a refusal names the setting. Other keys are left to the command."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        key = str(getattr(namespace, "key", ""))
        stored = {field: name for name, field in operate.SETTINGS.items()}
        name = stored.get(key) or key.replace("_", "-")
        if name in DURATION_SETTINGS:
            try:
                seconds(str(values), above_zero=True)
            except argparse.ArgumentTypeError as exc:
                raise argparse.ArgumentError(self, f"{key}: {exc}") from None
        setattr(namespace, self.dest, values)


def shown(text: str) -> str:
    """``text`` quoted for an error line, cut if long."""
    return repr(text if len(text) <= 60 else text[:57] + "...")
