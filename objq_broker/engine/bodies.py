"""Reading payload bodies kept out of the state (see :mod:`objq_broker.model.bodies`), with a
cache bounded by bytes and parallel reads ahead of a consumer."""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor

import msgspec

from objq_broker.errors import ObjectNotFound, ObjqError, StateCorrupt
from objq_broker.model.bodies import BodyEntry, decode_bodies, split_ref
from objq_broker.model.checks import UNDECODABLE
from objq_broker.model.records import Job
from objq_broker.storage.base import ObjectStore

#: Bytes of decoded bodies a process keeps in memory. A consumer reads the bodies of what it
#: claims and the commit that finishes those jobs reads them again for the archive, so the
#: cache must hold every body in flight: a small producer's bodies objects hold one payload
#: each, and a worker may hold hundreds of them.
DEFAULT_CACHED_BYTES = 64 * 1024 * 1024
#: Bodies objects read at once by :meth:`BodyCache.prefetch` (object stores answer many
#: requests in parallel as fast as one).
PREFETCH_THREADS = 8

log = logging.getLogger("objq_broker.bodies")

_Entry = BodyEntry


class BodyCache:
    """Reads bodies by reference, keeping recently used bodies objects decoded, up to
    ``max_bytes`` of payload. Thread-safe."""

    def __init__(self, store: ObjectStore, max_bytes: int = DEFAULT_CACHED_BYTES) -> None:
        self.store = store
        self.max_bytes = max_bytes
        self._objects: collections.OrderedDict[str, tuple[list[_Entry], int]] = (
            collections.OrderedDict()
        )
        self._bytes = 0
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    def remember(self, key: str, entries: list[_Entry]) -> None:
        """Cache a bodies object this process just wrote or read."""
        size = sum(len(body) for body, _ in entries)
        with self._lock:
            old = self._objects.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._objects[key] = (entries, size)
            self._bytes += size
            while self._bytes > self.max_bytes and len(self._objects) > 1:
                _, (_, dropped) = self._objects.popitem(last=False)
                self._bytes -= dropped

    def forget(self, key: str) -> None:
        """Drop a bodies object that was deleted."""
        with self._lock:
            found = self._objects.pop(key, None)
            if found is not None:
                self._bytes -= found[1]

    def fill(self, job: Job, *, inline: bool = False, lenient: bool = False) -> Job:
        """``job`` with its payload in place when the state keeps it out of line (``job``
        itself otherwise). ``inline`` also drops the reference, for a record that must stand
        on its own (the archive). A missing or unreadable bodies object raises
        :class:`StateCorrupt`; ``lenient`` (for listings: one bad job must not hide the
        others) returns ``job`` as it is then, its body empty and its ``ref`` telling where
        the payload should have been."""
        if job.ref is None or job.body:
            return job
        try:
            body, b64 = self.load(job.ref)
        except ObjqError as exc:
            if not lenient:
                raise
            log.warning("job %s listed without its payload: %s", job.id, exc)
            return job
        if inline:
            return msgspec.structs.replace(job, body=body, b64=b64, ref=None)
        return msgspec.structs.replace(job, body=body, b64=b64)

    def load(self, ref: str) -> _Entry:
        key, index = split_ref(ref)
        with self._lock:
            found = self._objects.get(key)
            if found is not None:
                self._objects.move_to_end(key)
        entries = self._read(key, ref) if found is None else found[0]
        if not 0 <= index < len(entries):
            raise StateCorrupt(
                f"{self.store.url}/{key}: body {index} referenced, {len(entries)} stored"
            )
        return entries[index]

    def _read(self, key: str, ref: str) -> list[_Entry]:
        try:
            data = self.store.get(key)
        except ObjectNotFound as exc:
            raise StateCorrupt(
                f"{self.store.url}: the state refers to body {ref}, but {key} is missing"
            ) from exc
        try:
            entries = decode_bodies(data)
        except UNDECODABLE as exc:
            raise StateCorrupt(f"{self.store.url}/{key}: not a bodies object ({exc})") from exc
        self.remember(key, entries)
        return entries

    def prefetch(self, refs: Iterable[str]) -> Future[None]:
        """Read the bodies objects of ``refs`` that are not cached, in parallel on threads of
        this cache; the future is done when all reads have finished. A read that fails is left
        for :meth:`load` to raise, where the caller sees it."""
        done: Future[None] = Future()
        keys = {split_ref(ref)[0]: ref for ref in refs}
        with self._lock:
            missing = [(key, ref) for key, ref in keys.items() if key not in self._objects]
            if missing and self._pool is None:
                self._pool = ThreadPoolExecutor(PREFETCH_THREADS, thread_name_prefix="objq-bodies")
            pool = self._pool
        if not missing or pool is None:
            done.set_result(None)
            return done
        remaining = [len(missing)]
        count_lock = threading.Lock()

        def read(key: str, ref: str) -> None:
            try:
                self._read(key, ref)
            except Exception:  # load() reads again and raises it, to the caller that needs it
                log.debug("prefetch of %s failed", key, exc_info=True)
            finally:
                with count_lock:
                    remaining[0] -= 1
                    last = remaining[0] == 0
                if last:
                    done.set_result(None)

        for key, ref in missing:
            try:
                pool.submit(read, key, ref)
            except RuntimeError:  # closed meanwhile (its engine was): read here instead
                read(key, ref)
        return done

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=False)
