"""Kombu exchanges and their bindings, shared by every process that uses one store.

AMQP routing lives in the broker; kombu's virtual transports keep it in each process's memory
unless the transport stores it. Here each exchange is one small JSON object in the same store
as the queues (``kombu/exchanges/<name>.json``: its type and its ``[routing_key, pattern,
queue]`` bindings), changed by compare-and-set. So a publisher that never declared a queue still
routes to it, and a broadcast (Celery remote control) reaches every worker's queue.

Readers keep a copy for ``ttl_seconds`` (a publish must not cost a storage read); fanout
deliveries read afresh. Nothing here imports kombu: the transport translates.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from urllib.parse import quote, unquote

import msgspec

from objq_broker.errors import ConfigurationError, PreconditionFailed, StorageError
from objq_broker.model.backoff import backoff_seconds
from objq_broker.storage import ObjectStore

#: Where exchange objects live under the store's prefix.
EXCHANGE_PREFIX = "kombu/exchanges/"
#: How long a reader trusts its copy of an exchange before reading it again.
DEFAULT_TABLE_TTL_SECONDS = 1.0
#: Compare-and-set attempts before a binding change gives up (each loses to a concurrent one).
_MAX_TRIES = 50

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


class ExchangeTable:
    """Exchanges of one store, cached per process for ``ttl_seconds``. Thread-safe."""

    def __init__(self, store: ObjectStore, *, ttl_seconds: float = DEFAULT_TABLE_TTL_SECONDS):
        self.store = store
        self.ttl_seconds = ttl_seconds
        self._cache: dict[str, tuple[float, ExchangeRecord | None]] = {}
        self._lock = threading.Lock()

    def lookup(self, exchange: str, *, fresh: bool = False) -> ExchangeRecord | None:
        """The exchange's record (None if no process stored it), at most ``ttl_seconds`` old."""
        now = time.monotonic()
        with self._lock:
            cached = self._cache.get(exchange)
        if cached is not None and not fresh and now - cached[0] < self.ttl_seconds:
            return cached[1]
        record = self._read(exchange)[0]
        with self._lock:
            self._cache[exchange] = (now, record)
        return record

    def declare(self, exchange: str, type_: str) -> None:
        """Store the exchange's type, unless it is stored already."""
        self._change(exchange, type_, lambda record: False)

    def bind(self, exchange: str, type_: str, binding: Binding) -> None:
        def add(record: ExchangeRecord) -> bool:
            if binding in record.bindings:
                return False
            record.bindings.append(binding)
            return True

        self._change(exchange, type_, add)

    def unbind(self, exchange: str, binding: Binding) -> None:
        def drop(record: ExchangeRecord) -> bool:
            kept = [b for b in record.bindings if b != binding]
            changed = len(kept) != len(record.bindings)
            record.bindings = kept
            return changed

        self._change(exchange, None, drop)

    def unbind_queue(self, queue: str) -> None:
        """Remove every binding of ``queue``, in every exchange (a deleted queue, or one a
        killed process left bound)."""
        for key in self.store.list(EXCHANGE_PREFIX):
            blob = self.store.read(key)
            if blob is None or not _mentions(blob.data, queue):
                continue
            name = _name_of(key)

            def drop(record: ExchangeRecord) -> bool:
                kept = [b for b in record.bindings if b[2] != queue]
                changed = len(kept) != len(record.bindings)
                record.bindings = kept
                return changed

            self._change(name, None, drop)

    # --- compare-and-set -------------------------------------------------------------------

    def _read(self, exchange: str) -> tuple[ExchangeRecord | None, str | None]:
        key = exchange_key(exchange)
        blob = self.store.read(key)
        if blob is None:
            return None, None
        try:
            record = _decoder.decode(blob.data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise ConfigurationError(
                f"{self.store.url}, key {key}: expected a kombu exchange record "
                f'({{"type": ..., "bindings": [...]}}), found {blob.data[:80]!r} ({exc})'
            ) from exc
        return record, blob.version

    def _change(
        self,
        exchange: str,
        type_: str | None,
        edit: Callable[[ExchangeRecord], bool],
    ) -> None:
        """Read, edit and write back with if-match; retry when another process won."""
        key = exchange_key(exchange)
        for attempt in range(_MAX_TRIES):
            record, version = self._read(exchange)
            created = record is None
            if record is None:
                if type_ is None:
                    return  # nothing stored: nothing to unbind
                record = ExchangeRecord(type=type_)
            changed = edit(record) or created
            if not changed:
                self._remember(exchange, record)
                return
            try:
                if version is None:
                    self.store.write(key, _encoder.encode(record), if_absent=True)
                else:
                    self.store.write(key, _encoder.encode(record), if_version=version)
            except PreconditionFailed:
                time.sleep(backoff_seconds(attempt + 1, 0.005, 0.32, random.random()))
                continue
            self._remember(exchange, record)
            return
        raise StorageError(
            f"{self.store.url}, key {key}: gave up changing exchange {exchange!r} after "
            f"{_MAX_TRIES} compare-and-set conflicts"
        )

    def _remember(self, exchange: str, record: ExchangeRecord) -> None:
        with self._lock:
            self._cache[exchange] = (time.monotonic(), record)


def _mentions(data: bytes, queue: str) -> bool:
    return _encoder.encode(queue) in data


def _name_of(key: str) -> str:
    return unquote(key[len(EXCHANGE_PREFIX) : -len(".json")])
