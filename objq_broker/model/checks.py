"""What a value must be before it may enter the state: msgspec constraints, checked at the door.

The state is decoded by every process that shares a namespace, and a corrupt state is refused,
never overwritten. So one bad value that got in (a NaN lease, which JSON writes as ``null``; an
``int`` field holding 2.5) would stop every process at once. Every value an operation carries is
therefore one of the constrained types below, and :func:`checked` converts what a caller gave
into them, raising one :class:`~objq_broker.errors.ConfigurationError` that names the field,
what was expected and what was found. The same constraints hold when an operation is decoded
from the wire, and when the state itself is decoded.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, TypeVar

import msgspec
from msgspec import Meta

from objq_broker.errors import ConfigurationError

T = TypeVar("T")

#: Longest queue name accepted (SQS allows 80, Celery's pidbox names run longer).
MAX_QUEUE_NAME = 255
#: Longest idempotency key, owner name or other identifier accepted.
MAX_IDENTIFIER = 1024
#: Longest span of time accepted, in seconds (about a century). Bounding it keeps infinity
#: out: JSON has no way to write it.
MAX_SECONDS = 100 * 365 * 24 * 3600.0
#: Most attempts a job may be given.
MAX_ATTEMPTS = 1_000_000
#: Priorities are 32-bit signed integers, lower first.
PRIORITY_RANGE = (-(2**31), 2**31 - 1)
#: Most jobs one claim may ask for.
MAX_CLAIM = 100_000
#: Most entries one staged bodies object may hold (a Spark partition writes several objects).
MAX_STAGED_ENTRIES = 1_000_000
#: Longest error text a job keeps. The frameworks cut theirs to 2,000 characters; the API cuts a
#: longer one in the middle (:func:`cut_text`), keeping its start and its end, where a
#: traceback's cause is.
MAX_ERROR_TEXT = 8192
#: Most operations one broker session carries.
MAX_SESSION_OPS = 5000
#: Most items one operation lists: jobs enqueued at once, leases renewed or released, ids of
#: dead letters, staged objects or runs.
MAX_ITEMS = 1_000_000
#: Highest number a client may give a session (a signed 64-bit integer, as every reader holds).
MAX_SEQ = 2**63 - 1

# Lone surrogates (a file name decoded with ``surrogateescape``) are refused: UTF-8 cannot
# hold them, and a state that cannot be encoded fails every operation of its commit.
_QUEUE_NAME_PATTERN = r"^[^/\x00-\x1f\x7f-\x9f\ud800-\udfff]+$"
_TEXT_PATTERN = r"^[^\ud800-\udfff]*$"
QueueName = Annotated[
    str, Meta(min_length=1, max_length=MAX_QUEUE_NAME, pattern=_QUEUE_NAME_PATTERN)
]
Identifier = Annotated[str, Meta(min_length=1, max_length=MAX_IDENTIFIER, pattern=_TEXT_PATTERN)]


def plain_identifier(value: object) -> bool:
    """Whether ``value`` is an :data:`Identifier` for sure, without a conversion: ASCII text
    (no surrogates, then) of an allowed length, as the ids and tokens objq makes are. False
    says nothing: check it as an ``Identifier``."""
    return type(value) is str and 0 < len(value) <= MAX_IDENTIFIER and value.isascii()


#: Where objects written ahead of a staged write live (the Spark writer's layout): the state
#: deletes them once their jobs are gone, so a staged write may name nothing else (not the
#: state, not another queue's run), and no ``.`` or ``..`` step.
STAGING_PREFIX = "staging/"
_STAGED_PATTERN = r"^(?!.*(?:^|/)\.{1,2}(?:/|$))staging/[^\ud800-\udfff]+$"
StagedKey = Annotated[
    str,
    Meta(
        max_length=MAX_IDENTIFIER,
        pattern=_STAGED_PATTERN,
    ),
]
#: A finite time or order position (a NaN or an infinity would be written as null).
Finite = Annotated[float, Meta(ge=-1e18, le=1e18)]
#: Where a job sorts in its run: (priority or time, sequence number).
OrderPosition = tuple[Finite, Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]]
#: A job's error text, as it may enter the state.
ErrorText = Annotated[str, Meta(max_length=MAX_ERROR_TEXT, pattern=_TEXT_PATTERN)]
#: The random draw a nack's backoff uses (``backoff_seconds``): 0 to 1.
Jitter = Annotated[float, Meta(ge=0.0, le=1.0)]
#: A session's number.
Seq = Annotated[int, Meta(ge=0, le=MAX_SEQ)]
#: A job id with the lease token that proves its holder.
Held = tuple[Identifier, Identifier]
#: A span of time that must be positive: leases, backoffs, retention.
PositiveSeconds = Annotated[float, Meta(gt=0, le=MAX_SECONDS)]
#: A wait of zero or more seconds.
Seconds = Annotated[float, Meta(ge=0, le=MAX_SECONDS)]
#: A delay that may lie in the past (an ETA already passed runs at once).
SignedSeconds = Annotated[float, Meta(ge=-MAX_SECONDS, le=MAX_SECONDS)]
Attempts = Annotated[int, Meta(ge=1, le=MAX_ATTEMPTS)]
Priority = Annotated[int, Meta(ge=PRIORITY_RANGE[0], le=PRIORITY_RANGE[1])]
ClaimCount = Annotated[int, Meta(ge=1, le=MAX_CLAIM)]
#: How many jobs of one group may be in flight at once (``group_concurrency``).
GroupConcurrency = Annotated[int, Meta(ge=1, le=MAX_CLAIM)]
#: A claim's weight for one of the queues it takes from.
ClaimWeight = Annotated[int, Meta(ge=1, le=1000)]
#: Most state writes per second a write budget may allow (more is no budget at all).
MAX_WRITE_RATE = 1000.0
#: A namespace's write budget: state writes per second, above zero.
WriteRate = Annotated[float, Meta(gt=0, le=MAX_WRITE_RATE)]

#: What decoding stored or received bytes may raise besides success: msgspec's own errors, and
#: those that escape it on hostile bytes (an invalid UTF-8 byte in a string decoded to ``Any``
#: raises ``UnicodeDecodeError``; bad base64, ``binascii.Error``; both are ``ValueError``s) or
#: on deep nesting. Every decoder of untrusted bytes catches exactly these.
UNDECODABLE: tuple[type[BaseException], ...] = (msgspec.DecodeError, ValueError, RecursionError)

_PATH = re.compile(r" - at `\$(?P<path>[^`]*)`$")
#: What a pattern means, for error messages (a regex says little to a user).
_PATTERNS = {
    _QUEUE_NAME_PATTERN: f"a queue name (1-{MAX_QUEUE_NAME} printable characters without '/')",
    _TEXT_PATTERN: "text UTF-8 can hold (no lone surrogates)",
    _STAGED_PATTERN: ("a key under staging/ (no '.' or '..' steps)"),
}


def cut_text(text: str, limit: int = MAX_ERROR_TEXT) -> str:
    """``text`` if it has at most ``limit`` characters; otherwise its start and its end with
    a note of how much was cut between them, at most ``limit`` characters in all."""
    if len(text) <= limit:
        return text
    # The note is no longer than this (its count has at most as many digits as the length).
    longest_note = len("\n... [ characters cut] ...\n") + len(str(len(text)))
    keep = limit - longest_note
    head = keep // 2
    note = f"\n... [{len(text) - keep} characters cut] ...\n"
    return text[:head] + note + text[len(text) - (keep - head) :]


def shown(value: object, limit: int = 200) -> str:
    """``repr(value)``, cut to about ``limit`` characters, for an error message: a refused
    value of megabytes must not make a message of megabytes."""
    if isinstance(value, str | bytes) and len(value) > limit:
        kind = "characters" if isinstance(value, str) else "bytes"
        return f"{value[: limit - 40]!r}... ({len(value)} {kind} in all)"
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[: limit - 40]}... ({len(text)} characters in all)"


class Where:
    """The opening of an error message naming a call and its subject (``"enqueue to 'q'"``),
    made only when a message needs it. Most calls raise nothing, and making it for each would
    cost a ``repr`` of the subject per enqueue, claim and ack."""

    __slots__ = ("_limit", "_subject", "_template")

    def __init__(self, template: str, subject: object, limit: int = 80) -> None:
        """``template``: the text, with ``{}`` where :func:`shown` puts ``subject``."""
        self._template, self._subject, self._limit = template, subject, limit

    def __str__(self) -> str:
        return self._template.format(shown(self._subject, self._limit))

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    def __eq__(self, other: object) -> bool:
        # Equal when they would say the same: a key of a cache of checked arguments.
        return isinstance(other, Where) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def _key(self) -> tuple[str, type, object, int]:
        return self._template, type(self._subject), self._subject, self._limit

    def then(self, part: str) -> Where:
        """This place narrowed to one of its parts (``": delay"``), made as late."""
        return Where(self._template + part, self._subject, self._limit)


#: Where an error happened, for its message: the text, or a :class:`Where` that makes it.
Place = str | Where


def narrowed(where: Place, part: str) -> Place:
    """``where`` narrowed to one of its parts (``": delay"``), made as late as ``where``."""
    return where.then(part) if isinstance(where, Where) else where + part


def checked(data: Mapping[str, Any], type_: type[T], where: Place) -> T:
    """``data`` converted to ``type_`` with every constraint checked (no coercion: ``"3"`` is
    not 3, ``True`` is not 1, 2.5 is not an ``int``), or :class:`ConfigurationError` saying
    which field, what it must be, and what was found."""
    try:
        return msgspec.convert(data, type_)
    except msgspec.ValidationError as exc:
        raise ConfigurationError(_describe(exc, data, where)) from None


def _describe(exc: msgspec.ValidationError, data: Mapping[str, Any], where: Place) -> str:
    text = str(exc)
    match = _PATH.search(text)
    expected = text[: match.start()] if match else text
    expected = re.sub(r", got `?\w+`?$", "", expected.replace("Expected", "expected", 1))
    expected = expected.replace("`", "")
    for pattern, meaning in _PATTERNS.items():
        expected = expected.replace(f"str matching regex {pattern!r}", meaning)
    if not match or not match["path"]:
        return f"{where}: {expected}"
    path = match["path"]
    field = path.lstrip(".").split(".")[0].split("[")[0]
    found = _lookup(data, path)
    return f"{where}: {field}: {expected}, found {shown(found)}"


def _lookup(data: Any, path: str) -> Any:
    """The value at a msgspec error path such as ``.items[3].key``."""
    value = data
    for part in re.findall(r"\.([^.\[]+)|\[(\d+)\]", path):
        name, index = part
        try:
            value = value[name] if name else value[int(index)]
        except (KeyError, IndexError, TypeError):
            return "(missing)"
    return value


class _Wait(msgspec.Struct, frozen=True):
    timeout: Seconds | None


def checked_timeout(timeout: object, where: Place) -> float | None:
    """``timeout`` as a number of seconds (or None: no wait), or :class:`ConfigurationError`:
    a NaN would make a waiting call never return."""
    if timeout is None:
        return None
    return checked({"timeout": timeout}, _Wait, where).timeout
