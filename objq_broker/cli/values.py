"""The kinds of option value the ``objq`` command line checks that click does not know: each
reads the text given, or raises ``ValueError`` saying what was expected and what was found, so a
value the store or the queue API would refuse is refused while the command line is parsed, with
the option it was given to; whole numbers are click's own ``IntRange``. Also the limits and the
queue settings the options take."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import click
import msgspec

from objq_broker.errors import ConfigurationError
from objq_broker.model import durations
from objq_broker.model.checks import MAX_SECONDS, MAX_WRITE_RATE
from objq_broker.model.settings import from_texts

#: Times ``--since`` and ``--until`` may name (UTC): what the archive's dated keys can write.
TIME_RANGE = (datetime(1970, 1, 1, tzinfo=UTC), datetime(9999, 1, 1, tzinfo=UTC))
#: Settings of ``config set`` and ``declare``: the short name and the stored field.
SETTINGS = {
    "max-attempts": "max_attempts",
    "backoff-base": "backoff_base_seconds",
    "backoff-cap": "backoff_cap_seconds",
    "lease": "lease_seconds",
    "dead-ttl": "dead_ttl_seconds",
    "idempotency": "idempotency_seconds",
    "expires": "expires_seconds",
    "group-concurrency": "group_concurrency",
    "fairness": "fairness",
}
#: What an on/off setting (``fairness``) may be given as.
FLAGS = {"on": True, "true": True, "yes": True, "off": False, "false": False, "no": False}
#: Queue settings that are durations (the others are counts), by their option names.
DURATION_SETTINGS = frozenset(
    name for name in SETTINGS if name not in ("max-attempts", "group-concurrency", "fairness")
)
#: Commands one ``objq worker`` runs at once, and ``objq demo`` worker threads, at most: each
#: is a thread (more workers scale further).
MAX_THREADS = 1024
#: Most jobs ``objq demo`` enqueues: they all live in one state object (100,000 job records
#: are about 28 MB of JSON, rewritten by every commit).
MAX_DEMO_JOBS = 100_000


class Checked(click.ParamType[Any, Any]):
    """An option value read by ``read``, a function of the text that raises ``ValueError``
    (``ConfigurationError`` is one) when the text is not such a value.

    >>> Checked("price", price).convert("0.005", None, None)
    0.005
    """

    def __init__(self, name: str, read: Callable[[str], Any]) -> None:
        self.name = name
        self._read = read

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):  # a default given as the value itself
            return value
        try:
            return self._read(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class Whole(click.IntRange):
    """A whole number in a range, named so in refusals ("'1.5' is not a valid whole number")
    and shown as ``N`` in the help."""

    name = "whole number"

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str:
        return "N"


def whole(low: int = 1, high: int | None = None) -> Whole:
    """A whole number from ``low`` to ``high`` (no limit if None)."""
    return Whole(low, high)


def setting(struct: type[msgspec.Struct], name: str) -> Checked:
    """Setting ``name`` of a component's settings ``struct``, read from text and checked as
    the environment's text is (one reading for both)."""

    def read(text: str) -> Any:
        try:
            return from_texts(struct, {name: text}, where="value")[name]
        except ConfigurationError as exc:
            raise ValueError(str(exc).split(": ", 2)[-1]) from None

    return Checked("value", read)


def price(text: str) -> float:
    """Dollars per 1,000 requests: a finite number, zero or more."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value < 1e6:
        raise ValueError(f"expected dollars per 1,000 requests, found {shown(text)}")
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
        raise ValueError(
            f"expected state writes per second above 0 and at most {MAX_WRITE_RATE:g}, or "
            f"off, found {shown(text)}"
        )
    return text


def seconds(text: str, *, above_zero: bool = False) -> float:
    """A duration (``90``, ``90s``, ``15m``, ``2h``, ``7d``) in seconds, at most about a
    century (what the store accepts), ``above_zero`` or zero or more."""
    seconds = durations.parse_duration(text)
    if above_zero and seconds == 0:
        raise ValueError(f"expected a duration above zero, found {shown(text)}")
    if seconds > MAX_SECONDS:
        raise ValueError(
            f"expected a duration of at most {MAX_SECONDS / 86400:.0f}d (about a century), "
            f"found {shown(text)}"
        )
    return seconds


def duration(*, above_zero: bool = False) -> Checked:
    """A duration as :func:`seconds` checks it, kept as the text it was given (the command
    parses it)."""

    def read(text: str) -> str:
        seconds(text, above_zero=above_zero)
        return text

    return Checked("duration", read)


def moment(text: str) -> str:
    """A time (ISO 8601, Unix seconds, or an age such as ``2h``) within :data:`TIME_RANGE`,
    kept as the text it was given (the command parses it)."""
    stamp = durations.parse_time(text, time.time())
    low, high = TIME_RANGE
    if not low.timestamp() <= stamp <= high.timestamp():
        raise ValueError(
            f"expected a time from {low:%Y-%m-%d} to {high:%Y-%m-%d} (UTC), found {shown(text)}"
        )
    return text


def listen_address(text: str) -> tuple[str, int]:
    """``(host, port)`` from ``HOST:PORT`` or ``[IPv6]:PORT``."""
    host, _, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(
            f"expected HOST:PORT (127.0.0.1:7701, 0.0.0.0:7701, [::1]:7701), found {text!r}"
        )
    return host, int(port)


def utf8_text(text: str) -> str:
    """Text UTF-8 can write. An argument whose bytes are not UTF-8 arrives with lone
    surrogates, which no stored JSON document can hold."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"expected UTF-8 text, found {shown(text)}") from None
    return text


def checked_setting(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """``config set``'s VALUE, checked as a duration when KEY (parsed just before it) names
    one, so that a refusal names the setting. Other keys are left to the command."""
    key = str(ctx.params.get("key", ""))
    stored = {field: name for name, field in SETTINGS.items()}
    name = stored.get(key) or key.replace("_", "-")
    if name in DURATION_SETTINGS:
        try:
            seconds(value, above_zero=True)
        except ValueError as exc:
            raise click.BadParameter(f"{key}: {exc}", ctx, param) from None
    return value


def shown(text: str) -> str:
    """``text`` quoted for an error line, cut if long."""
    return repr(text if len(text) <= 60 else text[:57] + "...")


#: The option values of more than one command.
DURATION = duration()
POSITIVE_DURATION = duration(above_zero=True)
#: A duration above zero, read as seconds.
POSITIVE_SECONDS = Checked("seconds", lambda text: seconds(text, above_zero=True))
MOMENT = Checked("time", moment)
UTF8 = Checked("text", utf8_text)
PRICE = Checked("usd", price)
RATE = Checked("rate", rate)
#: On or off (true/false, yes/no), as the ``fairness`` setting takes it.
FLAG = click.Choice(list(FLAGS), case_sensitive=False)
#: Where to serve.
LISTEN = Checked("host:port", listen_address)
