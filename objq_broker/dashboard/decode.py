"""Payloads as people read them: JSON pretty-printed, and a Dramatiq or Celery message decoded
into its actor or task, arguments and options.

The recognition is :func:`objq_broker.model.messages.describe`'s (the one shared by the
CLI and the Spark reader); this module adds the arguments. A Celery body in any serializer but
JSON (pickle, YAML, msgpack) is never decoded: unpickling a payload would run whatever code a
producer put in it. Its ``argsrepr`` and ``kwargsrepr`` headers, which Celery writes for every
serializer, are shown instead.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from objq_broker.model.messages import MessageInfo, describe

#: Characters of a payload shown on a job page; a longer one is cut, and says so.
MAX_SHOWN_CHARS = 65_536
#: Bytes of a binary payload shown (as hexadecimal).
MAX_SHOWN_BYTES = 4096
_JSON_TYPES = ("application/json", "json")


@dataclass(frozen=True)
class ShownPayload:
    """A payload as the job page prints it."""

    text: str
    #: "json", "text" or "binary".
    kind: str
    size_bytes: int
    #: True when ``text`` shows only the start of the payload.
    cut: bool


@dataclass(frozen=True)
class DecodedMessage:
    """A framework's message: who runs it, with what."""

    #: "Dramatiq" or "Celery".
    framework: str
    #: The actor's or task's name.
    task: str
    message_id: str | None
    #: The positional and keyword arguments, pretty-printed (or Celery's own repr of them).
    args: str
    kwargs: str
    #: Everything else worth showing, in order: (label, value).
    fields: list[tuple[str, str]]


def show_payload(payload: bytes) -> ShownPayload:
    """``payload`` pretty-printed when it is JSON, as text when it is UTF-8, else in hex."""
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        shown = payload[:MAX_SHOWN_BYTES]
        lines = [shown[i : i + 32].hex(" ") for i in range(0, len(shown), 32)]
        return ShownPayload("\n".join(lines), "binary", len(payload), len(payload) > len(shown))
    kind = "text"
    try:
        text = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
        kind = "json"
    except ValueError:
        pass
    cut = len(text) > MAX_SHOWN_CHARS
    return ShownPayload(text[:MAX_SHOWN_CHARS], kind, len(payload), cut)


def task_name(payload: bytes) -> str | None:
    """The actor or task a payload is for, if it is a Dramatiq or Celery message."""
    info = describe(payload)
    return None if info is None else info.task


def decode_message(payload: bytes) -> DecodedMessage | None:
    """The Dramatiq or Celery message in ``payload``; None for any other payload."""
    info = describe(payload)
    if info is None:
        return None
    data = json.loads(payload)
    if info.kind == "dramatiq":
        return _dramatiq(data, info)
    return _celery(data, info)


def _dramatiq(data: dict[str, Any], info: MessageInfo) -> DecodedMessage:
    fields = [("queue", str(data.get("queue_name")))]
    stamp = data.get("message_timestamp")
    if isinstance(stamp, int | float):
        fields.append(("sent at", _utc(stamp / 1000)))
    options = data.get("options")
    if isinstance(options, dict):
        eta = options.get("eta")
        if isinstance(eta, int | float):
            fields.append(("eta", _utc(eta / 1000)))
        fields += [(f"option {name}", _pretty(value)) for name, value in sorted(options.items())]
    return DecodedMessage(
        "Dramatiq",
        info.task,
        info.message_id,
        _pretty(data.get("args", [])),
        _pretty(data.get("kwargs", {})),
        fields,
    )


def _celery(envelope: dict[str, Any], info: MessageInfo) -> DecodedMessage:
    headers = envelope.get("headers") or {}
    properties = envelope.get("properties") or {}
    body = _celery_body(envelope)
    fields: list[tuple[str, str]] = [("content type", str(envelope.get("content-type")))]
    if isinstance(body, list) and len(body) == 3:  # protocol 2: [args, kwargs, embed]
        args, kwargs = _pretty(body[0]), _pretty(body[1])
        embed = body[2] if isinstance(body[2], dict) else {}
        fields += [(name, _pretty(value)) for name, value in embed.items() if value]
    elif isinstance(body, dict) and "task" in body:  # protocol 1: everything in the body
        args, kwargs = _pretty(body.get("args", [])), _pretty(body.get("kwargs", {}))
        headers = {**body, **headers}
    else:  # a serializer this page does not decode: Celery's own repr of the arguments
        args = str(headers.get("argsrepr", "(not shown: not JSON)"))
        kwargs = str(headers.get("kwargsrepr", "(not shown: not JSON)"))
    for name in ("retries", "eta", "expires", "root_id", "parent_id", "group", "origin"):
        value = headers.get(name)
        if value not in (None, "", 0) or (name == "retries" and value == 0):
            fields.append((name, str(value)))
    route = properties.get("delivery_info") if isinstance(properties, dict) else None
    if isinstance(route, dict):
        fields.append(("exchange", str(route.get("exchange") or "(default)")))
        fields.append(("routing key", str(route.get("routing_key"))))
    return DecodedMessage("Celery", info.task, info.message_id, args, kwargs, fields)


def _celery_body(envelope: dict[str, Any]) -> object:
    """The body of a kombu envelope when it is JSON; None otherwise (never unpickled)."""
    body = envelope.get("body")
    content_type = str(envelope.get("content-type") or "")
    if not isinstance(body, str) or not content_type.endswith(_JSON_TYPES):
        return None
    properties = envelope.get("properties") or {}
    try:
        raw = base64.b64decode(body) if properties.get("body_encoding") == "base64" else body
        return json.loads(raw)
    except (binascii.Error, ValueError):
        return None


def _pretty(value: object) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=repr)


def _utc(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%SZ")
