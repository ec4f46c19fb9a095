"""A seeded fault-injecting wrapper around a real store, for tests of everything above storage.

It injects three kinds of trouble, each with its own probability, drawn from one seeded
``random.Random`` so a failing run can be replayed:

* ``error_rate`` — the call fails with :class:`StorageUnavailable` *before* reaching the store;
* ``landed_rate`` — a write reaches the store and lands, then the caller sees
  :class:`StorageUnavailable` anyway (a timeout after the server committed): the nasty case a
  retry must not turn into a duplicate or a lost update;
* ``latency_seconds`` — a uniform random delay ``(low, high)`` before each call;
* ``ignore_conditions`` — every write drops its condition (``if_version``, ``if_absent``) and
  overwrites, as some S3-compatible stores do while answering 200: what the store probe
  (:mod:`objq_broker.storage.probe`) must refuse.

``fail_next(n, landed=False, conflict=False)`` scripts the next ``n`` writes to fail
deterministically; ``conflict`` makes a landed write report :class:`PreconditionFailed`, as an
SDK does when it retries a timed-out conditional PUT that had in fact succeeded.

>>> from objq_broker.storage.memory import MemoryStore
>>> store = FaultyStore(MemoryStore(), seed=7, error_rate=0.0)
>>> store.fail_next(1, landed=True)
>>> try:
...     store.write("k", b"v")
... except Exception as exc:
...     print(type(exc).__name__, store.read("k").data)
StorageUnavailable b'v'
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field

from objq_broker.errors import ConfigurationError, PreconditionFailed, StorageUnavailable
from objq_broker.storage.base import Blob, Listing, ObjectStore


@dataclass
class FaultCounts:
    """How many faults of each kind were injected, for tests to assert the run was hostile."""

    errors: int = 0
    landed_then_failed: int = 0
    calls: int = 0
    by_op: dict[str, int] = field(default_factory=dict)


class FaultyStore:
    """Wraps ``inner`` and injects seeded faults (see the module docstring)."""

    def __init__(
        self,
        inner: ObjectStore,
        *,
        seed: int = 0,
        error_rate: float = 0.0,
        landed_rate: float = 0.0,
        latency_seconds: tuple[float, float] = (0.0, 0.0),
        ops: frozenset[str] = frozenset({"read", "write", "put", "get", "delete", "list"}),
        ignore_conditions: bool = False,
    ) -> None:
        for name, rate in (("error_rate", error_rate), ("landed_rate", landed_rate)):
            if not 0.0 <= rate <= 1.0:
                raise ConfigurationError(f"FaultyStore: {name} must be in [0, 1], found {rate}")
        self.inner = inner
        self.error_rate = error_rate
        self.landed_rate = landed_rate
        self.latency_seconds = latency_seconds
        self.ops = ops
        self.ignore_conditions = ignore_conditions
        self.counts = FaultCounts()
        self._rng = random.Random(seed)
        self._conflict = False
        self._lock = threading.Lock()
        # (landed, conflict) per scripted write failure
        self._scripted: list[tuple[bool, bool]] = []

    @property
    def url(self) -> str:
        return self.inner.url

    def fail_next(self, n: int = 1, *, landed: bool = False, conflict: bool = False) -> None:
        """Make the next ``n`` writes fail (after landing, if ``landed``)."""
        with self._lock:
            self._scripted.extend([(landed, conflict)] * n)

    def _draw(self, op: str) -> tuple[float, bool, bool]:
        """Decide this call's fate: (delay, fail before, fail after landing)."""
        with self._lock:
            self.counts.calls += 1
            if op not in self.ops:
                return 0.0, False, False
            low, high = self.latency_seconds
            delay = self._rng.uniform(low, high) if high > 0 else 0.0
            if op in ("write", "put") and self._scripted:
                landed, self._conflict = self._scripted.pop(0)
                return delay, not landed, landed
            before = self._rng.random() < self.error_rate
            after = not before and op in ("write", "put") and self._rng.random() < self.landed_rate
            return delay, before, after

    def _fault(self, op: str, key: str, landed: bool) -> StorageUnavailable | PreconditionFailed:
        with self._lock:
            self.counts.by_op[op] = self.counts.by_op.get(op, 0) + 1
            if landed:
                self.counts.landed_then_failed += 1
            else:
                self.counts.errors += 1
        what = "landed, then the response was lost" if landed else "did not reach the store"
        if landed and self._conflict:
            self._conflict = False
            return PreconditionFailed(
                f"injected fault on {self.url}, {op} {key!r}: landed, then a retry lost its CAS"
            )
        return StorageUnavailable(f"injected fault on {self.url}, {op} {key!r}: {what}")

    def _before(self, op: str, key: str) -> bool:
        delay, before, after = self._draw(op)
        if delay:
            time.sleep(delay)
        if before:
            raise self._fault(op, key, landed=False)
        return after

    def read(self, key: str) -> Blob | None:
        self._before("read", key)
        return self.inner.read(key)

    def write(
        self, key: str, data: bytes, *, if_version: str | None = None, if_absent: bool = False
    ) -> str:
        after = self._before("write", key)
        if self.ignore_conditions:
            version = self.inner.write(key, data)
        else:
            version = self.inner.write(key, data, if_version=if_version, if_absent=if_absent)
        if after:
            raise self._fault("write", key, landed=True)
        return version

    def put(self, key: str, data: bytes) -> str:
        after = self._before("put", key)
        version = self.inner.put(key, data)
        if after:
            raise self._fault("put", key, landed=True)
        return version

    def get(self, key: str) -> bytes:
        self._before("get", key)
        return self.inner.get(key)

    def delete(self, key: str) -> None:
        self._before("delete", key)
        self.inner.delete(key)

    def list(self, prefix: str = "") -> list[str]:
        self._before("list", prefix)
        return self.inner.list(prefix)

    def list_meta(self, prefix: str = "") -> Listing:
        self._before("list", prefix)
        return self.inner.list_meta(prefix)

    def close(self) -> None:
        self.inner.close()
