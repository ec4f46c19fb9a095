"""Counting what a process asks of its store: requests by kind and bytes each way.

Object storage bills per request and per byte, so these are the numbers an operator watches
(``objq_storage_requests_total`` and ``objq_storage_bytes_total``). :class:`MeteredStore` wraps
any store and counts each call as it returns, failed ones included (a failed request is billed
too): one increment under a lock, nothing else.

>>> from objq_broker.storage.memory import MemoryStore
>>> store = MeteredStore(MemoryStore())
>>> _ = store.write("k", b"abc")
>>> _ = store.read("k")
>>> store.meter.snapshot().requests["read"], store.meter.snapshot().bytes_read
(1, 3)
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from objq_broker.storage.base import Blob, Listing, ObjectStore
from objq_broker.storage.locks import STALE_LOCK_SECONDS, sweep_locks
from objq_broker.storage.memory import MemoryStore
from objq_broker.storage.notify import OnChange, Subscription, version, watch_folder

T = TypeVar("T")

#: The kinds of request counted: a conditional read, a conditional or create-only write, a
#: plain put and get (immutable objects), a delete, and a listing (with or without metadata).
REQUEST_KINDS = ("read", "write", "put", "get", "delete", "list")


@dataclass(frozen=True)
class MeterReading:
    """The counts at one moment."""

    requests: dict[str, int]
    bytes_read: int
    bytes_written: int


@dataclass
class StorageMeter:
    """Requests and bytes counted since it was made; thread-safe."""

    _requests: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REQUEST_KINDS, 0))
    _bytes_read: int = 0
    _bytes_written: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, kind: str, *, read: int = 0, written: int = 0) -> None:
        with self._lock:
            self._requests[kind] += 1
            self._bytes_read += read
            self._bytes_written += written

    def snapshot(self) -> MeterReading:
        with self._lock:
            return MeterReading(dict(self._requests), self._bytes_read, self._bytes_written)


class MeteredStore:
    """``inner`` with every request counted in ``meter`` (a new one unless given)."""

    def __init__(self, inner: ObjectStore, meter: StorageMeter | None = None) -> None:
        self.inner = inner
        self.meter = meter if meter is not None else StorageMeter()

    @property
    def url(self) -> str:
        return self.inner.url

    def _counted(self, kind: str, call: Callable[[], T], *, written: int = 0) -> T:
        try:
            result = call()
        except BaseException:
            self.meter.count(kind, written=written)
            raise
        if isinstance(result, Blob):
            self.meter.count(kind, read=len(result.data), written=written)
        elif isinstance(result, bytes):
            self.meter.count(kind, read=len(result), written=written)
        else:
            self.meter.count(kind, written=written)
        return result

    def read(self, key: str) -> Blob | None:
        return self._counted("read", lambda: self.inner.read(key))

    def write(
        self, key: str, data: bytes, *, if_version: str | None = None, if_absent: bool = False
    ) -> str:
        try:
            return self.inner.write(key, data, if_version=if_version, if_absent=if_absent)
        finally:  # a refused write is a request all the same
            self.meter.count("write", written=len(data))

    def put(self, key: str, data: bytes) -> str:
        return self._counted("put", lambda: self.inner.put(key, data), written=len(data))

    def get(self, key: str) -> bytes:
        return self._counted("get", lambda: self.inner.get(key))

    def delete(self, key: str) -> None:
        self._counted("delete", lambda: self.inner.delete(key))

    def list(self, prefix: str = "") -> list[str]:
        return self._counted("list", lambda: self.inner.list(prefix))

    def list_meta(self, prefix: str = "") -> Listing:
        return self._counted("list", lambda: self.inner.list_meta(prefix))

    def watch_folder(self, folder: str, on_change: OnChange) -> Subscription | None:
        """The inner store's reports of writes, when it makes them (no request is made)."""
        return watch_folder(self.inner, folder, on_change)

    def version(self, key: str) -> str | None:
        """The inner store's version of ``key``, when it can tell without a request."""
        return version(self.inner, key)

    def sweep_locks(self, older_than: float = STALE_LOCK_SECONDS, *, dry_run: bool = False) -> int:
        """The inner store's sweep of its lock files, when it keeps any (no request is made
        of an object store)."""
        return sweep_locks(self.inner, older_than, dry_run=dry_run)

    def close(self) -> None:
        self.inner.close()


def never_waits(store: ObjectStore) -> bool:
    """Whether ``store``'s calls never wait on I/O (memory, metered or not): an event loop
    may make them in its own thread."""
    inner = store.inner if isinstance(store, MeteredStore) else store
    return isinstance(inner, MemoryStore)
