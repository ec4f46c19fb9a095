"""Settings declared once: one msgspec struct per component, and the one way to read them.

A component (the engine and ``Queue``, the elected broker, the kombu transport, the Dramatiq
broker, the dashboard, the Celery result backend) declares its settings as the fields of one
``msgspec.Struct``. A field is a setting:

* its name is the keyword, the URL query parameter and the option name;
* its default is the setting's default (every field has one);
* its ``Annotated[..., Meta(...)]`` type is what the setting must be;
* ``Meta(extra={"env": "OBJQ_..."})`` (:data:`ENV`) names the environment variable that gives
  it when the caller did not, read when the component is built, never at import;
  ``{"secret": True}`` (:data:`SECRET`) keeps its value out of every refusal;
  ``{"text": False}`` (:data:`TEXT`) keeps it out of URLs; ``{"unit": "ms"}`` (:data:`UNIT`)
  reads a span of time in milliseconds.

The list of accepted names (:func:`option_names`), the environment variables
(:func:`env_names`) and the defaults the docs show (:func:`defaults`) are read from the
struct. :func:`read_settings` turns what a caller gave (keywords, option dicts, the
environment) into the struct; :func:`from_texts` reads the settings a URL's query gives.
Text is converted by the field's type, once, here (:func:`from_text`): a number of seconds
also as a duration (``250ms``, ``5s``, ``15m``, ``2h``, ``7d``), a whole number also as
``5.0``, a switch as true/false, yes/no, on/off or 1/0, and ``none`` where a setting may be
None. Every value is then checked by the struct's constraints, in one conversion that raises
one :class:`~objq_broker.errors.ConfigurationError` naming the setting, what it must be and
what was found.

>>> positive_seconds("2.5", "heartbeat_interval", where="objq transport")
2.5
>>> positive_seconds(0, "heartbeat_interval", where="objq transport")
Traceback (most recent call last):
...
objq_broker.errors.ConfigurationError: objq transport: option heartbeat_interval: expected a \
positive number of seconds, at most about a century, found 0
"""

from __future__ import annotations

import functools
import os
import re
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

import msgspec
from msgspec import inspect

from objq_broker.errors import ConfigurationError
from objq_broker.model.checks import MAX_SECONDS, PositiveSeconds, shown
from objq_broker.model.durations import parse_duration

__all__ = [
    "ENV",
    "SECRET",
    "TEXT",
    "UNIT",
    "check_fields",
    "defaults",
    "env_names",
    "from_text",
    "from_texts",
    "option_count",
    "option_names",
    "option_seconds",
    "positive_count",
    "positive_seconds",
    "read_settings",
    "seconds_from_env",
    "text_names",
]

S = TypeVar("S", bound=msgspec.Struct)

#: The key of ``Meta(extra=...)`` that names a setting's environment variable.
ENV = "env"
#: The key of ``Meta(extra=...)`` that gives a span of time in another unit than seconds:
#: ``"ms"`` (Dramatiq's unit), so text such as ``"7d"`` is read in that unit.
UNIT = "unit"
#: The key of ``Meta(extra=...)`` that marks a secret (a token): a refusal never shows it.
SECRET = "secret"
#: The key of ``Meta(extra=...)`` that keeps a setting out of text (``{"text": False}``): one
#: that code alone may give, as it changes what every reader of a shared URL would see.
TEXT = "text"
#: Words a switch accepts in text, lower case.
TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off"})
#: Words that mean None where a setting may be None.
NONE_WORDS = frozenset({"none", "null"})
#: Where msgspec's message says the refused value was.
_PATH = re.compile(r" - at `\$\.(?P<name>\w+)[^`]*`$")


def option_names(struct: type[msgspec.Struct]) -> frozenset[str]:
    """The settings ``struct`` declares: every name a caller may give."""
    return frozenset(struct.__struct_fields__)


def env_names(struct: type[msgspec.Struct]) -> dict[str, str]:
    """Setting name -> the environment variable that gives it, for the fields that have one."""
    return {name: kind.env for name, kind in _kinds(struct).items() if kind.env}


def defaults(struct: type[msgspec.Struct]) -> dict[str, Any]:
    """Setting name -> its default."""
    found: dict[str, Any] = {}
    for field in inspect.type_info(struct).fields:  # type: ignore[attr-defined]
        if field.default_factory is not msgspec.NODEFAULT:
            found[field.name] = field.default_factory()
        else:
            found[field.name] = field.default
    return found


def from_text(struct: type[msgspec.Struct], name: str, text: str, *, where: str) -> Any:
    """Setting ``name`` of ``struct`` from text (a URL's query, the environment, the command
    line), as its field's type reads it; not yet checked against its constraints."""
    kind = _kinds(struct)[name]
    word = text.strip().lower()
    if kind.none and word in NONE_WORDS:
        return None
    if kind.is_bool:
        if word in TRUE_WORDS:
            return True
        if word in FALSE_WORDS:
            return False
        raise ConfigurationError(
            f"{where}: option {name}: expected true/false, found {shown(text)}"
        )
    if kind.is_float:
        try:
            return _seconds(word) * (1000.0 if kind.millis else 1.0)
        except ConfigurationError:
            unit = "milliseconds" if kind.millis else "seconds"
            raise ConfigurationError(
                f"{where}: option {name}: expected a number of {unit} or a duration (250ms, "
                f"5s, 15m, 2h, 7d), found {shown(text)}"
            ) from None
    if kind.is_int:
        number = _whole(word)
        if number is None:
            raise ConfigurationError(
                f"{where}: option {name}: expected a whole number, found {shown(text)}"
            )
        return number
    return text


def read_settings(
    struct: type[S],
    given: Mapping[str, Any] | None = None,
    *,
    where: str,
    environ: Mapping[str, str] | None = None,
    lax: bool = False,
) -> S:
    """``struct`` from the settings a caller gave, checked, defaults for the rest.

    ``given``: values from code (keywords, an option dict), checked as they are unless
    ``lax``, with which text in them is read as :func:`from_text` reads it and a whole float
    counts as a whole number (option dicts that come from configuration files). ``environ``
    (default ``os.environ``): read, when the struct is built, for a setting with an
    environment variable that ``given`` does not give. A name the struct does not declare is
    refused, naming the accepted ones."""
    given = given or {}
    names = option_names(struct)
    unknown = sorted(set(given) - names)
    if unknown:
        raise ConfigurationError(
            f"{where}: unknown option(s) {', '.join(unknown)}; accepted: {', '.join(sorted(names))}"
        )
    environ = os.environ if environ is None else environ
    values = {
        name: _loosened(struct, name, raw, where) if lax else raw for name, raw in given.items()
    }
    for name, kind in _kinds(struct).items():
        if name not in values and kind.env and environ.get(kind.env):
            values[name] = _text_value(struct, name, environ[kind.env], f"{where} (${kind.env})")
    return _convert(struct, values, where)


def _convert(struct: type[S], values: Mapping[str, Any], where: str) -> S:
    """``values`` as ``struct``, every constraint checked, or :class:`ConfigurationError` saying
    which setting, what it must be and what was found."""
    try:
        return msgspec.convert(values, struct)
    except msgspec.ValidationError as exc:
        path = _PATH.search(str(exc))
        name = path["name"] if path else None
        raise _refusal(struct, name, values.get(name or ""), str(exc), where) from None


def check_fields(settings: msgspec.Struct, *, where: str) -> None:
    """:class:`ConfigurationError` if a field of ``settings`` breaks its constraint: for a
    settings struct built in code (``Struct(...)`` checks no constraint; call this from its
    ``__post_init__``)."""
    struct = type(settings)
    for name, type_ in _hints(struct).items():
        value = getattr(settings, name)
        try:
            msgspec.convert(value, type_)
        except msgspec.ValidationError as exc:
            raise _refusal(struct, name, value, str(exc), where) from None


@functools.cache
def _hints(struct: type[msgspec.Struct]) -> dict[str, Any]:
    hints = typing.get_type_hints(struct, include_extras=True)
    return {name: hints[name] for name in struct.__struct_fields__}


def _refusal(
    struct: type[msgspec.Struct], name: str | None, value: Any, text: str, where: str
) -> ConfigurationError:
    kind = _kinds(struct).get(name or "")
    expected = kind.expected if kind and kind.expected else _expected(text)
    if name is None:
        return ConfigurationError(f"{where}: expected {expected}")
    found = f"a {type(value).__name__}" if kind and kind.secret else shown(value)
    return ConfigurationError(f"{where}: option {name}: expected {expected}, found {found}")


def _expected(text: str) -> str:
    """What msgspec's message says was expected, without its path and markup."""
    cut = _PATH.search(text)
    found = text[: cut.start()] if cut else text
    return re.sub(r", got `?\w+`?$", "", found.replace("Expected ", "", 1)).replace("`", "")


def from_texts(
    struct: type[msgspec.Struct], text: Mapping[str, str], *, where: str
) -> dict[str, Any]:
    """The settings ``text`` gives (a URL's query), each read by :func:`from_text` and checked
    against its constraint."""
    return {name: _text_value(struct, name, raw, where) for name, raw in text.items()}


def text_names(struct: type[msgspec.Struct]) -> frozenset[str]:
    """The settings of ``struct`` that text can give: not those only code can (a clock, or
    one marked ``Meta(extra={"text": False})``)."""
    return frozenset(name for name, kind in _kinds(struct).items() if kind.readable)


def _text_value(struct: type[msgspec.Struct], name: str, raw: str, where: str) -> Any:
    """A setting read from text, checked on its own so a refusal names where it came from."""
    value = from_text(struct, name, raw, where=where)
    _convert(struct, {name: value}, where)
    return value


def _loosened(struct: type[msgspec.Struct], name: str, raw: Any, where: str) -> Any:
    kind = _kinds(struct)[name]
    if isinstance(raw, str) and (kind.is_bool or kind.is_float or kind.is_int):
        return from_text(struct, name, raw, where=where)
    if kind.is_int and not kind.is_float and isinstance(raw, float) and raw.is_integer():
        return int(raw)
    return raw


class _Kind(msgspec.Struct, frozen=True):
    """What text a field reads: which scalar types it holds, and its environment variable."""

    is_bool: bool = False
    is_int: bool = False
    is_float: bool = False
    none: bool = False
    env: str | None = None
    #: Never shown (``Meta(extra={"secret": True})``).
    secret: bool = False
    #: A span of time in milliseconds (``Meta(extra={"unit": "ms"})``), not seconds.
    millis: bool = False
    #: Text can say it (a switch, a number or a string).
    readable: bool = False
    #: What a value must be, in words; "" where msgspec's own words will do.
    expected: str = ""


@functools.cache
def _kinds(struct: type[msgspec.Struct]) -> dict[str, _Kind]:
    return {
        field.name: _kind(field.type)
        for field in inspect.type_info(struct).fields  # type: ignore[attr-defined]
    }


_READABLE = {
    inspect.BoolType,
    inspect.IntType,
    inspect.FloatType,
    inspect.StrType,
    inspect.NoneType,
}


def _kind(type_: inspect.Type) -> _Kind:
    scalars: set[type[inspect.Type]] = set()
    numbers: list[inspect.IntType | inspect.FloatType] = []
    env: str | None = None
    millis = secret = False
    text = True
    pending = [type_]
    while pending:
        current = pending.pop()
        if isinstance(current, inspect.Metadata):
            env = (current.extra or {}).get(ENV, env)
            millis = millis or (current.extra or {}).get(UNIT) == "ms"
            secret = secret or bool((current.extra or {}).get(SECRET))
            text = text and (current.extra or {}).get(TEXT, True)
            pending.append(current.type)
        elif isinstance(current, inspect.UnionType):
            pending.extend(current.types)
        else:
            scalars.add(type(current))
            if isinstance(current, inspect.IntType | inspect.FloatType):
                numbers.append(current)
    expected = _in_words(numbers[0]) if len(numbers) == 1 else ""
    if millis:
        expected = expected.replace("seconds", "milliseconds").replace(
            ", at most about a century", ""
        )
    if inspect.BoolType in scalars and len(scalars - {inspect.NoneType}) == 1:
        expected = "true or false"
    if expected and inspect.NoneType in scalars:
        expected += ", or None"
    return _Kind(
        secret=secret,
        millis=millis,
        expected=expected,
        is_bool=inspect.BoolType in scalars,
        is_int=inspect.IntType in scalars,
        is_float=inspect.FloatType in scalars,
        none=inspect.NoneType in scalars,
        env=env,
        readable=text and bool(scalars) and scalars <= _READABLE,
    )


def _in_words(number: inspect.IntType | inspect.FloatType) -> str:
    """A number's constraints as an error message says them."""
    unit = "number of seconds" if isinstance(number, inspect.FloatType) else "whole number"
    if number.gt == 0 or (number.ge == 1 and isinstance(number, inspect.IntType)):
        words = f"a positive {unit}"
    elif number.ge == 0:
        words = f"a {unit}, zero or more"
    elif number.ge is not None:
        words = f"a {unit}, {number.ge:g} or more"
    else:
        words = f"a {unit}"
    if number.le == MAX_SECONDS:
        words += ", at most about a century"
    elif number.le is not None:
        words += f", at most {number.le:g}"
    return words


def _seconds(word: str) -> float:
    """Seconds from ``90``, ``250ms`` or a duration :func:`parse_duration` reads."""
    if word.endswith("ms"):
        return parse_duration(word[:-2]) / 1000.0
    return parse_duration(word)


def _whole(word: str) -> int | None:
    try:
        return int(word)
    except ValueError:
        pass
    try:
        number = float(word)
    except ValueError:
        return None
    return int(number) if number.is_integer() else None


# --- one setting at a time, for callers that take a few numbers from an option bag ---------


class _Seconds(msgspec.Struct):
    value: PositiveSeconds = 1.0


class _Count(msgspec.Struct):
    value: int = 1


def positive_seconds(raw: object, name: str, *, where: str, label: str = "option") -> float:
    """``raw`` as a finite number of seconds above zero and at most about a century (numbers
    and text accepted as :func:`from_text` reads it; bools, zero, negatives, NaN, infinity and
    spans past a century refused: one that long is a mistake, and may overflow a timer)."""
    try:
        if isinstance(raw, bool) or not isinstance(raw, int | float | str):
            raise ConfigurationError("not a number")
        value = _loosened(_Seconds, "value", raw, where)
        return read_settings(_Seconds, {"value": value}, where=where).value
    except ConfigurationError:
        raise ConfigurationError(
            f"{where}: {label} {name}: expected a positive number of seconds, at most about "
            f"a century, found {shown(raw)}"
        ) from None


def positive_count(raw: object, name: str, *, where: str, label: str = "option") -> int:
    """``raw`` as a whole number of at least one (``5``, ``5.0`` and ``"5"`` accepted)."""
    try:
        value = None if isinstance(raw, bool) else _loosened(_Count, "value", raw, where)
    except ConfigurationError:
        value = None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigurationError(
            f"{where}: {label} {name}: expected a positive whole number, found {shown(raw)}"
        )
    return value


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
