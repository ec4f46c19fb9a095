"""Exchange bindings as stored: what the kombu transport routes by, and what a deleted or
expired queue must leave behind with it.

Each exchange is one small JSON object beside the state (``kombu/exchanges/<name>.json``: its
type and its ``[routing_key, pattern, queue]`` bindings), changed by compare-and-set. The
transport (:mod:`objq_broker.kombu.routing`) caches and edits them; the engine removes the
bindings of the queues a commit deleted (``Queue.delete_queue``, or a queue that expired),
once that commit landed. Removing them is tidying, not what keeps a queue gone: a message
routed by a binding whose queue no longer exists is dropped, never enqueued
(:class:`~objq_broker.model.ops.Enqueue` with ``to_declared``).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable
from urllib.parse import quote, unquote

import msgspec

from objq_broker.errors import ConfigurationError, PreconditionFailed, StorageError
from objq_broker.model.backoff import backoff_seconds
from objq_broker.model.checks import UNDECODABLE
from objq_broker.storage import ObjectStore
from objq_broker.storage.base import write_if_unchanged

#: Where exchange objects live under the store's prefix.
EXCHANGE_PREFIX = "kombu/exchanges/"
#: Compare-and-set attempts before a binding change gives up (each loses to a concurrent one).
MAX_TRIES = 50

Binding = tuple[str, str | None, str]  # (routing key, pattern, queue)


class ExchangeRecord(msgspec.Struct):
    """One exchange as stored."""

    type: str = "direct"
    bindings: list[tuple[str, str | None, str]] = msgspec.field(default_factory=list)


_decoder = msgspec.json.Decoder(ExchangeRecord)
_encoder = msgspec.json.Encoder()


def exchange_key(exchange: str) -> str:
    # Quoting keeps '/' and other odd characters of AMQP names out of the key's structure.
    return f"{EXCHANGE_PREFIX}{quote(exchange, safe='')}.json"


def exchange_name(key: str) -> str:
    return unquote(key[len(EXCHANGE_PREFIX) : -len(".json")])


def read_exchange(store: ObjectStore, exchange: str) -> tuple[ExchangeRecord | None, str | None]:
    """The exchange's record and its version; (None, None) when no process stored it."""
    key = exchange_key(exchange)
    blob = store.read(key)
    if blob is None:
        return None, None
    try:
        record = _decoder.decode(blob.data)
    except UNDECODABLE as exc:
        raise ConfigurationError(
            f"{store.url}, key {key}: expected a kombu exchange record "
            f'({{"type": ..., "bindings": [...]}}), found {blob.data[:80]!r} ({exc})'
        ) from exc
    return record, blob.version


def change_exchange(
    store: ObjectStore,
    exchange: str,
    type_: str | None,
    edit: Callable[[ExchangeRecord], bool],
) -> ExchangeRecord | None:
    """Read, ``edit`` (True: it changed the record) and write back with if-match, again when
    another process won; an exchange not stored is created with ``type_`` (None: left
    absent). Returns the record as stored now (None: absent)."""
    key = exchange_key(exchange)
    for attempt in range(MAX_TRIES):
        record, version = read_exchange(store, exchange)
        created = record is None
        if record is None:
            if type_ is None:
                return None  # nothing stored: nothing to unbind
            record = ExchangeRecord(type=type_)
        if not (edit(record) or created):
            return record
        try:
            write_if_unchanged(store, key, _encoder.encode(record), version)
        except PreconditionFailed:
            time.sleep(backoff_seconds(attempt + 1, 0.005, 0.32, random.random()))
            continue
        return record
    raise StorageError(
        f"{store.url}, key {key}: gave up changing exchange {exchange!r} after "
        f"{MAX_TRIES} compare-and-set conflicts"
    )


def unbind_queues(store: ObjectStore, queues: Iterable[str]) -> dict[str, ExchangeRecord]:
    """Remove every binding of ``queues``, in every exchange of the store; returns the
    exchanges changed, as stored now. Costs one listing, and a read of each exchange."""
    doomed = set(queues)
    changed: dict[str, ExchangeRecord] = {}
    if not doomed:
        return changed
    for key in store.list(EXCHANGE_PREFIX):
        blob = store.read(key)
        if blob is None or not any(_encoder.encode(q) in blob.data for q in doomed):
            continue

        def drop(record: ExchangeRecord) -> bool:
            kept = [b for b in record.bindings if b[2] not in doomed]
            removed = len(kept) != len(record.bindings)
            record.bindings = kept
            return removed

        name = exchange_name(key)
        record = change_exchange(store, name, None, drop)
        if record is not None:
            changed[name] = record
    return changed
