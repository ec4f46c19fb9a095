"""Building and recognising the messages that Dramatiq and Celery workers consume.

A job's payload is opaque to the queue. Two shapes are common enough to know about, so that a
bulk producer (the Spark writer) can build messages existing workers run, and a reader can say
which task a job was for:

* **Dramatiq**: ``Message.encode()`` of Dramatiq's default JSON encoder, an object with
  ``queue_name``, ``actor_name``, ``args``, ``kwargs``, ``options``, ``message_id`` and
  ``message_timestamp`` (milliseconds).
* **Celery** (task protocol 2) in kombu's JSON envelope, as a virtual transport stores it:
  ``{"body": <base64 of [args, kwargs, embed]>, "headers": {"task": ..., "id": ...},
  "properties": {...}, "content-type": "application/json", ...}``. Protocol 1 bodies (the
  task name and id inside the body) are recognised too.

Nothing here imports Dramatiq, Celery or kombu.
"""

from __future__ import annotations

import base64
import binascii
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from objq_broker.errors import ConfigurationError
from objq_broker.model.checks import UNDECODABLE, shown

_encoder = msgspec.json.Encoder()
_LANG = "py"


class MessageInfo(msgspec.Struct, frozen=True):
    """What a payload says about itself: its framework, task name and message id."""

    kind: str  # "dramatiq" or "celery"
    task: str
    message_id: str | None


def _plain_args(args: object, where: str) -> list[Any]:
    if args is None:
        return []
    if isinstance(args, str | bytes) or not isinstance(args, Sequence):
        raise ConfigurationError(f"{where}: expected a list of arguments, found {shown(args)}")
    return list(args)


def _plain_kwargs(kwargs: object, where: str) -> dict[str, Any]:
    if kwargs is None:
        return {}
    if not isinstance(kwargs, Mapping):
        raise ConfigurationError(
            f"{where}: expected a mapping of keyword arguments, found {shown(kwargs)}"
        )
    return dict(kwargs)


def dramatiq_message(
    queue: str,
    actor: str,
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    *,
    options: Mapping[str, Any] | None = None,
    message_id: str | None = None,
    timestamp_ms: int | None = None,
) -> bytes:
    """A Dramatiq message for ``actor`` on ``queue``, as ``Message.encode()`` writes it."""
    where = f"Dramatiq message for actor {actor!r}"
    data = {
        "queue_name": queue,
        "actor_name": actor,
        "args": _plain_args(args, where),
        "kwargs": _plain_kwargs(kwargs, where),
        "options": dict(options or {}),
        "message_id": message_id or str(uuid.uuid4()),
        "message_timestamp": timestamp_ms if timestamp_ms is not None else int(time.time() * 1000),
    }
    return _encoder.encode(data)


def celery_message(
    queue: str,
    task: str,
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    *,
    task_id: str | None = None,
    exchange: str = "",
    retries: int = 0,
) -> bytes:
    """A Celery task message (protocol 2) for ``task`` in kombu's JSON envelope."""
    where = f"Celery message for task {task!r}"
    positional = _plain_args(args, where)
    named = _plain_kwargs(kwargs, where)
    ident = task_id or str(uuid.uuid4())
    embed = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
    body = _encoder.encode([positional, named, embed])
    headers = {
        "lang": _LANG,
        "task": task,
        "id": ident,
        "shadow": None,
        "eta": None,
        "expires": None,
        "group": None,
        "group_index": None,
        "retries": retries,
        "timelimit": [None, None],
        "root_id": ident,
        "parent_id": None,
        "argsrepr": repr(tuple(positional)),
        "kwargsrepr": repr(named),
        "origin": "objq",
        "ignore_result": False,
    }
    envelope = {
        "body": base64.b64encode(body).decode("ascii"),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": headers,
        "properties": {
            "correlation_id": ident,
            "reply_to": "",
            "delivery_mode": 2,
            "delivery_info": {"exchange": exchange, "routing_key": queue},
            "priority": 0,
            "body_encoding": "base64",
            "delivery_tag": str(uuid.uuid4()),
        },
    }
    return _encoder.encode(envelope)


def describe(payload: bytes) -> MessageInfo | None:
    """The framework, task and message id of a Dramatiq or Celery payload; None otherwise."""
    if not payload.startswith(b"{"):
        return None
    try:
        data = msgspec.json.decode(payload)
    except UNDECODABLE:
        return None
    if not isinstance(data, dict):
        return None
    actor = data.get("actor_name")
    if isinstance(actor, str) and "queue_name" in data:
        return MessageInfo("dramatiq", actor, _text(data.get("message_id")))
    headers = data.get("headers")
    if isinstance(headers, dict) and isinstance(headers.get("task"), str):
        return MessageInfo("celery", headers["task"], _text(headers.get("id")))
    return _celery_protocol_one(data)


def _celery_protocol_one(envelope: dict[str, Any]) -> MessageInfo | None:
    """Protocol 1 keeps the task name and id in the body itself."""
    body = envelope.get("body")
    properties = envelope.get("properties")
    if not isinstance(body, str) or not isinstance(properties, dict):
        return None
    try:
        raw = base64.b64decode(body) if properties.get("body_encoding") == "base64" else body
        inner = msgspec.json.decode(raw)
    except (binascii.Error, ValueError, msgspec.DecodeError):
        return None
    if isinstance(inner, dict) and isinstance(inner.get("task"), str):
        return MessageInfo("celery", inner["task"], _text(inner.get("id")))
    return None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None
