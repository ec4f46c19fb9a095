"""Results and counters on object storage: one small object each, never in the queue's state.

A task's result is written once, as its own object, by the worker that ran the task; whoever
waits for it reads that object. Nothing goes through the queue's commit loop: a result costs
one PUT and never makes the queue's state object bigger or its commits slower. Counters (a
chord's progress, a rate limiter's window) are objects changed only by compare-and-set, so
any number of processes may change them at once without losing an update.

Each object holds a :class:`Record`: the bytes a framework gave (its own encoding of the
result), when they were stored, and when they expire. An expired record reads as absent, and
:meth:`ResultStore.purge` deletes it. An object that does not decode as a record is reported
(:class:`~objq_broker.errors.StateCorrupt`, saying what was found where) and never
overwritten.

Waiting: a process that stores a result wakes its own threads waiting for it at once. On a
local folder (on Linux) the kernel reports every other process's write as well
(:mod:`~objq_broker.storage.notify`), so a waiter wakes when the result is stored, and reads at
intervals only to make sure. Elsewhere (S3, GCS) results stored by other processes are found
by reading again, at intervals that start at a few milliseconds and grow by a quarter each
time to the caller's ``interval`` (:class:`~objq_broker.consume.pacing.Pacer`): a result that
took 100 ms is in hand by about 125 ms.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable

import msgspec

from objq_broker.consume.pacing import Pacer
from objq_broker.errors import ObjqError, PreconditionFailed, StateCorrupt
from objq_broker.model.checks import UNDECODABLE
from objq_broker.storage import ObjectStore
from objq_broker.storage.base import check_key, write_if_unchanged
from objq_broker.storage.locks import sweep_locks
from objq_broker.storage.notify import Subscription, folder_of, watch_folder

log = logging.getLogger("objq_broker.results")

#: The record format this code reads and writes.
RECORD_FORMAT = 1
#: Where results live under a store's prefix, unless told otherwise.
DEFAULT_PREFIX = "results/"
#: Stores read in well under a millisecond (a local directory, memory): a waiter looks again
#: this soon at first. A round trip through a worker takes a few milliseconds there, and a
#: first pause of 2 ms (right for a storage server) would miss its end by up to another 2 ms.
LOCAL_SCHEMES = ("file://", "memory://")
LOCAL_FIRST_PAUSE_SECONDS = 0.0005
#: A store that reports writes as they happen (a local folder, on Linux) wakes a waiter itself;
#: reads at intervals from this long on only make sure no report was missed.
WATCHED_FIRST_PAUSE_SECONDS = 0.05
#: Compare-and-set tries before a counter update gives up (each loses only to another update).
UPDATE_TRIES = 1000


class Record(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A stored result or counter: ``data`` as its framework encoded it."""

    format: int
    stored_at: float
    expires_at: float | None = None
    data: bytes = b""

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and self.expires_at <= now


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Record)


class ResultStore:
    """Results and counters under ``prefix`` of ``store``.

    >>> from objq_broker.storage import MemoryStore
    >>> results = ResultStore(MemoryStore())
    >>> results.set("task-1", b'{"value": 42}', ttl=60)
    >>> results.get("task-1")
    b'{"value": 42}'
    """

    def __init__(
        self,
        store: ObjectStore,
        prefix: str = DEFAULT_PREFIX,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.prefix = prefix if not prefix or prefix.endswith("/") else f"{prefix}/"
        self.clock = clock

    def key(self, name: str) -> str:
        """The object that holds ``name``."""
        return check_key(f"{self.prefix}{name}", f"result {name!r}")

    # --- one result --------------------------------------------------------------------------

    def get(self, name: str) -> bytes | None:
        """The bytes stored as ``name``; None when there are none or they expired."""
        record = self._read(name)
        return None if record is None else record.data

    def set(self, name: str, data: bytes, ttl: float | None) -> None:
        """Store ``data`` as ``name`` for ``ttl`` seconds (None: until deleted), replacing what
        was there (a task run again stores its new result)."""
        self.store.put(self.key(name), self._encode(data, ttl))
        _wakeups.stored(self.store.url, self.key(name))

    def add(self, name: str, data: bytes, ttl: float | None) -> bool:
        """Store ``data`` as ``name`` unless something unexpired is there; whether it was."""
        return self.update(name, lambda old: data if old is None else None, ttl) is not None

    def delete(self, name: str) -> None:
        self.store.delete(self.key(name))

    def update(
        self, name: str, change: Callable[[bytes | None], bytes | None], ttl: float | None
    ) -> bytes | None:
        """Replace the bytes of ``name`` (None when absent or expired) by ``change(old)``, by
        compare-and-set, trying again when another process changed them first; returns the
        bytes stored, or None when ``change`` returned None (nothing is written then).

        ``change`` may be called several times: it must compute from ``old`` alone."""
        key = self.key(name)
        for _ in range(UPDATE_TRIES):
            blob = self.store.read(key)
            record = None if blob is None else self._decode(blob.data, key)
            live = record if record is not None and not record.expired(self.clock()) else None
            new = change(None if live is None else live.data)
            if new is None:
                return None
            data = self._encode(new, ttl)
            try:
                write_if_unchanged(self.store, key, data, None if blob is None else blob.version)
            except PreconditionFailed:
                time.sleep(random.uniform(0, 0.002))  # another update won: read it, go again
                continue
            _wakeups.stored(self.store.url, key)
            return new
        raise ObjqError(
            f"{self.store.url}/{key}: {UPDATE_TRIES} compare-and-set tries all lost to other "
            "writers; try again"
        )

    # --- waiting -----------------------------------------------------------------------------

    def wait(
        self,
        names: Iterable[str],
        ready: Callable[[dict[str, bytes]], bool],
        timeout: float | None,
        interval: float = 0.5,
    ) -> dict[str, bytes]:
        """Read ``names`` until ``ready`` says what was found is enough, or ``timeout`` seconds
        passed (None: no limit); returns what was found (absent names left out). A result
        stored by this process wakes the wait at once; others are read again at intervals
        growing from a few milliseconds to ``interval``."""
        wanted = list(names)
        deadline = None if timeout is None else time.monotonic() + timeout
        url, keys = self.store.url, [self.key(name) for name in wanted]
        _wakeups.watch(url, keys)
        watches = self._watch_folders(keys)
        if watches:  # told of every write: reads at intervals only make sure
            pacer = Pacer(interval, WATCHED_FIRST_PAUSE_SECONDS)
        elif url.startswith(LOCAL_SCHEMES):
            pacer = Pacer(interval, LOCAL_FIRST_PAUSE_SECONDS)
        else:
            pacer = Pacer(interval)
        try:
            while True:
                seen = _wakeups.seen(url, keys)
                found = {name: data for name in wanted if (data := self.get(name)) is not None}
                if ready(found):
                    return found
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return found
                pause = pacer.next()
                _wakeups.sleep(url, keys, seen, pause if left is None else min(pause, left))
        finally:
            for watch in watches:
                watch.close()
            _wakeups.unwatch(url, keys)

    def _watch_folders(self, keys: list[str]) -> list[Subscription]:
        """Watches that wake this process's waits on a write to ``keys`` by any process, when
        the store reports writes (a local folder); none when it cannot for every key."""
        url, watches = self.store.url, list[Subscription]()
        for folder in sorted({folder_of(key) for key in keys}):
            watch = watch_folder(self.store, folder, lambda key: _wakeups.stored(url, key))
            if watch is None:
                for made in watches:
                    made.close()
                return []
            watches.append(watch)
        return watches

    # --- housekeeping ------------------------------------------------------------------------

    def names(self) -> list[str]:
        """Every name stored (expired ones too)."""
        return [key[len(self.prefix) :] for key in self.store.list(self.prefix)]

    def purge(self, older_than: float | None = None) -> int:
        """Delete the expired records, and those stored more than ``older_than`` seconds ago;
        how many were deleted. Objects that are not records are left alone (and logged by
        nobody: they are not ours to judge)."""
        now = self.clock()
        deleted = 0
        for key in self.store.list(self.prefix):
            blob = self.store.read(key)
            if blob is None:
                continue
            try:
                record = self._decode(blob.data, key)
            except StateCorrupt:
                continue
            old = older_than is not None and record.stored_at <= now - older_than
            if record.expired(now) or old:
                self.store.delete(key)
                deleted += 1
        # A directory store deletes a result's lock file with it; releases before 2026-11-28
        # left one behind for every result they ever stored.
        swept = sweep_locks(self.store)
        if swept:
            log.info("%s: deleted %d lock files of deleted keys", self.store.url, swept)
        return deleted

    # --- the record --------------------------------------------------------------------------

    def _read(self, name: str) -> Record | None:
        key = self.key(name)
        blob = self.store.read(key)
        if blob is None:
            return None
        record = self._decode(blob.data, key)
        return None if record.expired(self.clock()) else record

    def _encode(self, data: bytes, ttl: float | None) -> bytes:
        now = self.clock()
        expires = None if ttl is None or ttl <= 0 else now + ttl
        return _encoder.encode(
            Record(format=RECORD_FORMAT, stored_at=now, expires_at=expires, data=data)
        )

    def _decode(self, raw: bytes, key: str) -> Record:
        try:
            record = _decoder.decode(raw)
        except UNDECODABLE as exc:
            raise StateCorrupt(
                f"{self.store.url}/{key}: expected a result record of format {RECORD_FORMAT}, "
                f"found {len(raw)} bytes that do not decode as one ({exc})"
            ) from exc
        if record.format != RECORD_FORMAT:
            raise StateCorrupt(
                f"{self.store.url}/{key}: expected a result record of format {RECORD_FORMAT}, "
                f"found format {record.format}; a newer objq wrote it"
            )
        return record


# --- waking this process's waiters ---------------------------------------------------------------


class _Wakeups:
    """Which keys this process's threads wait for, and a count of stores to each since: a
    store by this process wakes them without a read of storage. Keys nobody waits for are not
    kept."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._stores: dict[tuple[str, str], int] = {}  # (url, key) -> stores seen while waited
        self._waiters: dict[tuple[str, str], int] = {}

    def stored(self, url: str, key: str | None) -> None:
        """``key`` was stored (None: any key of ``url`` may have been)."""
        with self._changed:
            hits = [k for k in self._waiters if k[0] == url] if key is None else [(url, key)]
            hits = [hit for hit in hits if hit in self._waiters]
            for hit in hits:
                self._stores[hit] = self._stores.get(hit, 0) + 1
            if hits:
                self._changed.notify_all()

    def watch(self, url: str, keys: list[str]) -> None:
        with self._changed:
            for key in keys:
                self._waiters[(url, key)] = self._waiters.get((url, key), 0) + 1

    def unwatch(self, url: str, keys: list[str]) -> None:
        with self._changed:
            for key in keys:
                left = self._waiters[(url, key)] - 1
                if left:
                    self._waiters[(url, key)] = left
                else:
                    del self._waiters[(url, key)]
                    self._stores.pop((url, key), None)

    def seen(self, url: str, keys: list[str]) -> int:
        with self._changed:
            return self._count(url, keys)

    def sleep(self, url: str, keys: list[str], seen: int, seconds: float) -> None:
        """Sleep up to ``seconds``, or until this process stores one of ``keys`` (when it has
        not since :meth:`seen` said ``seen``)."""
        with self._changed:
            self._changed.wait_for(lambda: self._count(url, keys) != seen, max(seconds, 0.0))

    def _count(self, url: str, keys: list[str]) -> int:
        return sum(self._stores.get((url, key), 0) for key in keys)


_wakeups = _Wakeups()
