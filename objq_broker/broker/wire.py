"""What a broker client and a broker say to each other: the frames, and the operations and
their outcomes as JSON inside them.

Every message, either way, is one frame: :data:`PROTOCOL` (6 bytes), a kind (1 byte), a
request id (8 bytes) that the answer repeats, and a JSON body (:func:`frame`, :func:`parse`).
One frame, not four: pyzmq's multipart calls cost ten times a single send. A client sends
``h`` hello (:class:`ClientHello`), ``a`` apply (a :class:`~objq_broker.model.ops.Session`),
``c`` claim (a :class:`WaitingClaim`) or ``w`` watch (empty); the broker answers ``H`` hello
(:class:`Hello`), ``D`` done (a list of :data:`Outcome`, one per operation) or ``R`` refused
(one :class:`Refused` for the whole request: malformed, too large, fenced, another protocol),
and sends ``N`` notice (empty) to its watchers after each commit that made jobs claimable.
``docs/protocol.md`` publishes the messages with the JSON Schema of every body (:func:`schema`).

A request is a :class:`~objq_broker.model.ops.Session`: the client's id, the request's number,
and its operations (:mod:`objq_broker.model.ops`, tagged msgspec structs); the broker decodes
them with every constraint checked again, as if they had been built locally. A
response is one outcome per operation, in order: its result, encoded as the operation's result
type says, or the error that refused it (its class name, from the one tree in
:mod:`objq_broker.errors`, and its message), which the client raises again as the same class.
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Sequence
from typing import Annotated, Any, TypeVar

import msgspec

from objq_broker import errors
from objq_broker.model import ops
from objq_broker.model.checks import UNDECODABLE

T = TypeVar("T")

#: The start of every message: the protocol and its version. A broker answers a client of
#: another version with one ``refused`` message that names both.
PROTOCOL = b"objq/1"
#: What a client asks.
HELLO, APPLY, CLAIM, WATCH = b"h", b"a", b"c", b"w"
#: What a broker answers.
ANSWER_HELLO, DONE, REFUSED, NOTICE = b"H", b"D", b"R", b"N"
#: Bytes before the body: the protocol, the kind, the request id.
HEADER_BYTES = len(PROTOCOL) + 1 + 8


def frame(kind: bytes, rid: bytes, body: bytes) -> bytes:
    """One message: ``kind`` (1 byte) of request ``rid`` (8 bytes) with ``body``."""
    return b"".join((PROTOCOL, kind, rid, body))


def parse(message: bytes) -> tuple[bytes, bytes, bytes]:
    """``(kind, rid, body)`` of a message; :class:`ConfigurationError` naming the protocol
    spoken when it is not this one (or no message of any protocol)."""
    if len(message) < HEADER_BYTES or not message.startswith(PROTOCOL):
        spoken = message[: len(PROTOCOL)].decode("utf-8", "replace")
        raise errors.ConfigurationError(
            f"objq broker speaks {PROTOCOL.decode()}, the client {spoken!r}: upgrade the older side"
        )
    start = len(PROTOCOL)
    return message[start : start + 1], message[start + 1 : HEADER_BYTES], message[HEADER_BYTES:]


#: Largest request a broker takes unless told otherwise; its hello says what it takes.
MAX_REQUEST_BYTES = 64 * 1024 * 1024
_encoder = msgspec.json.Encoder()
_request_decoder = msgspec.json.Decoder(ops.Session)


class Done(msgspec.Struct, tag=True, frozen=True):
    """The operation succeeded; ``value`` is its result, encoded."""

    value: msgspec.Raw


class Refused(msgspec.Struct, tag=True, frozen=True):
    """The operation failed with ``error`` (a class of :mod:`objq_broker.errors`)."""

    error: str
    message: str


Outcome = Done | Refused
_response_decoder = msgspec.json.Decoder(list[Outcome])


def encode_request(session: ops.Session) -> bytes:
    return _encoder.encode(session)


def decode_request(data: bytes) -> ops.Session:
    """A request; :class:`~objq_broker.errors.RequestRefused` if any operation is malformed
    or out of range (nothing of the request is applied then)."""
    try:
        return _request_decoder.decode(data)
    except UNDECODABLE as exc:
        raise errors.RequestRefused(f"broker request: {exc}") from None


#: Longest a claim may wait at the broker in one request (a client waiting longer asks again).
MAX_CLAIM_WAIT_SECONDS = 60.0


class WaitingClaim(msgspec.Struct, frozen=True):
    """A claim that may wait at the broker: ``session`` holds one claim, which the broker
    commits again as jobs come, for up to ``wait_seconds``."""

    session: ops.Session
    wait_seconds: Annotated[float, msgspec.Meta(ge=0, le=MAX_CLAIM_WAIT_SECONDS)]


_claim_decoder = msgspec.json.Decoder(WaitingClaim)


def encode_claim(session: ops.Session, wait_seconds: float) -> bytes:
    return _encoder.encode(WaitingClaim(session, min(wait_seconds, MAX_CLAIM_WAIT_SECONDS)))


def decode_claim(data: bytes) -> WaitingClaim:
    """A waiting claim; :class:`~objq_broker.errors.ConfigurationError` if it is malformed
    or its session holds anything but one claim."""
    decoded = _decode(_claim_decoder, data, "broker claim request")
    kinds = [type(op).__name__ for op in decoded.session.ops]
    if kinds != ["Claim"]:
        raise errors.ConfigurationError(
            f"broker claim request: expected one Claim operation, found {kinds}"
        )
    return decoded


def _decode(decoder: msgspec.json.Decoder[T], data: bytes, what: str) -> T:
    """``data`` decoded with every constraint checked, or :class:`ConfigurationError`."""
    try:
        return decoder.decode(data)
    except UNDECODABLE as exc:
        raise errors.ConfigurationError(f"{what}: {exc}") from None


def encode_outcomes(outcomes: ops.Outcomes) -> bytes:
    """A session's results, as a response."""
    return encode_response(
        [outcome_of(value) if ok else outcome_of(error=value) for ok, value in outcomes]
    )


class ClientHello(msgspec.Struct, frozen=True):
    """A client's greeting: the protocol version it speaks."""

    protocol: int


class Hello(msgspec.Struct, frozen=True):
    """What a broker says about itself: which broker of which namespace, at which epoch, the
    protocol version it speaks and the largest request it takes."""

    broker: str
    namespace: str
    epoch: int | None
    protocol: int = 1
    max_request_bytes: int = MAX_REQUEST_BYTES


def encode(value: object) -> bytes:
    return _encoder.encode(value)


def encode_hello(hello: Hello) -> bytes:
    return _encoder.encode(hello)


def request_id(number: int) -> bytes:
    return number.to_bytes(8, "big")


def decode_hello(data: bytes) -> Hello:
    try:
        return msgspec.json.decode(data, type=Hello)
    except UNDECODABLE as exc:
        raise errors.StorageError(f"broker hello: {exc}") from None


def outcome_of(value: object = None, error: BaseException | None = None) -> Outcome:
    if error is None:
        return Done(msgspec.Raw(_encoder.encode(value)))
    name = type(error).__name__ if isinstance(error, errors.ObjqError) else "ObjqError"
    return Refused(name, str(error) or type(error).__name__)


def encode_response(outcomes: Sequence[Outcome]) -> bytes:
    return _encoder.encode(list(outcomes))


def decode_response(data: bytes, batch: Sequence[ops.Op[Any]]) -> list[tuple[bool, Any]]:
    """``(True, result)`` or ``(False, exception)`` per operation of ``batch``."""
    outcomes = _response_decoder.decode(data)
    if len(outcomes) != len(batch):
        raise errors.StorageError(
            f"broker response: expected {len(batch)} outcomes, found {len(outcomes)}"
        )
    decoded: list[tuple[bool, Any]] = []
    for op, outcome in zip(batch, outcomes, strict=True):
        if isinstance(outcome, Done):
            decoded.append((True, _result_decoder(type(op)).decode(outcome.value)))
        else:
            decoded.append((False, error_of(outcome)))
    return decoded


@functools.cache
def _result_decoder(op_type: type[ops.Op[Any]]) -> msgspec.json.Decoder[Any]:
    return msgspec.json.Decoder(result_type(op_type))


def decode_refused(data: bytes) -> errors.ObjqError:
    """The exception a ``refused`` frame stands for."""
    try:
        return error_of(msgspec.json.decode(data, type=Refused))
    except UNDECODABLE as exc:
        return errors.BrokerUnreachable(f"broker refusal unreadable: {exc}")


def error_of(refused: Refused) -> errors.ObjqError:
    """The exception a refusal stands for: the same class when it is one of objq's."""
    kind = getattr(errors, refused.error, None)
    if not (isinstance(kind, type) and issubclass(kind, errors.ObjqError)):
        kind = errors.ObjqError
    return kind(refused.message)


def result_type(op_type: type[ops.Op[Any]]) -> Any:
    """The result type ``T`` an operation class declares as ``Op[T]`` (or ``Read[T]``)."""
    for klass in op_type.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            if typing.get_origin(base) in (ops.Op, ops.Read):
                (argument,) = typing.get_args(base)
                if not isinstance(argument, typing.TypeVar):
                    return argument
    raise TypeError(f"{op_type.__name__} does not declare its result type")


def schema() -> dict[str, Any]:
    """The JSON Schema of every body, by kind (what ``docs/protocol.md`` publishes)."""
    kinds = {
        "hello (client)": ClientHello,
        "apply": ops.Session,
        "claim": WaitingClaim,
        "hello (broker)": Hello,
        "done": list[Outcome],
        "refused": Refused,
    }
    schemas, refs = msgspec.json.schema_components(
        list(kinds.values()), ref_template="#/$defs/{name}"
    )
    return {
        "protocol": PROTOCOL.decode(),
        "kinds": {
            "client": {"h": "hello", "a": "apply", "c": "claim", "w": "watch"},
            "broker": {"H": "hello", "D": "done", "R": "refused", "N": "notice"},
        },
        "bodies": dict(zip(kinds, schemas, strict=True)),
        "$defs": refs,
    }
