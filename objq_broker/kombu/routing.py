"""Kombu exchanges and their bindings, shared by every process that uses one store.

AMQP routing lives in the broker; kombu's virtual transports keep it in each process's memory
unless the transport stores it. Here each exchange is one small JSON object in the same store
as the queues (``kombu/exchanges/<name>.json``: its type and its ``[routing_key, pattern,
queue]`` bindings, :mod:`objq_broker.engine.bindings`), changed by compare-and-set. So a
publisher that never declared a queue still routes to it, and a broadcast (Celery remote
control) reaches every worker's queue. A deleted or expired queue's bindings are removed by
the commit that deleted it.

Readers keep a copy for ``ttl_seconds`` (a publish must not cost a storage read); fanout
deliveries read afresh. Nothing here imports kombu: the transport translates.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from objq_broker.engine.bindings import (
    EXCHANGE_PREFIX,
    Binding,
    ExchangeRecord,
    change_exchange,
    exchange_key,
    read_exchange,
    unbind_queues,
)
from objq_broker.storage import ObjectStore

__all__ = ["EXCHANGE_PREFIX", "Binding", "ExchangeRecord", "ExchangeTable", "exchange_key"]

#: How long a reader trusts its copy of an exchange before reading it again.
DEFAULT_TABLE_TTL_SECONDS = 1.0


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
        self.unbind_queues([queue])

    def unbind_queues(self, queues: Iterable[str]) -> None:
        for name, record in unbind_queues(self.store, queues).items():
            self._remember(name, record)

    # --- compare-and-set -------------------------------------------------------------------

    def _read(self, exchange: str) -> tuple[ExchangeRecord | None, str | None]:
        return read_exchange(self.store, exchange)

    def _change(
        self,
        exchange: str,
        type_: str | None,
        edit: Callable[[ExchangeRecord], bool],
    ) -> None:
        """Read, edit and write back with if-match; retry when another process won."""
        record = change_exchange(self.store, exchange, type_, edit)
        if record is not None:
            self._remember(exchange, record)

    def _remember(self, exchange: str, record: ExchangeRecord) -> None:
        with self._lock:
            self._cache[exchange] = (time.monotonic(), record)
