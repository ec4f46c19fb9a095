"""Work off the commit path: deleting objects the state no longer refers to (and reading
the runs a commit will merge, :class:`~objq_broker.engine.runs.MergeReads`).

A commit that finishes jobs whose payloads were kept out of line drops bodies objects (a
producer that sends one message per commit makes one per message). Deleting them one after
the other on the writer thread would make the next commit wait for every delete; here they
run on a few threads of their own while the writer goes on. A delete that fails or never runs
(the process died) leaves an unreferenced object behind: garbage, never a lost job.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for

from objq_broker.errors import ObjqError, StorageError
from objq_broker.storage.base import ObjectStore

log = logging.getLogger("objq_broker.engine")

#: Deletes in flight at once (object stores take parallel requests as fast as one).
DELETE_THREADS = 4


class Janitor:
    """Deletes objects in the background; :meth:`close` waits for those already asked for."""

    def __init__(self, store: ObjectStore, threads: int = DELETE_THREADS) -> None:
        self.store = store
        self.threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._pending: set[Future[None]] = set()

    def delete(self, keys: Iterable[str], what: str) -> None:
        for key in keys:
            if not self._submit(self.delete_now, key, what):
                self.delete_now(key, what)  # the interpreter is exiting: now, or never

    def sweep(self, find: Callable[[], list[str]], what: str) -> None:
        """Delete whatever ``find`` (which may list the store) returns, off the caller's
        thread; a listing that fails is tried again at the next sweep."""
        if not self._submit(self._sweep_now, find, what):
            log.debug("the interpreter is exiting: no sweep for %ss", what)

    def run(self, fn: Callable[[], None], what: str) -> None:
        """Run ``fn`` (reading ``what``) off the caller's thread; a failure is logged: what
        runs here is an optimisation, which the next try does again."""
        if not self._submit(self._run_now, fn, what):
            log.debug("the interpreter is exiting: %s is not read", what)

    def _run_now(self, fn: Callable[[], None], what: str) -> None:
        try:
            fn()
        except ObjqError as exc:
            log.warning("could not read %s: %s", what, exc)

    def _sweep_now(self, find: Callable[[], list[str]], what: str) -> None:
        try:
            doomed = find()
        except StorageError as exc:
            log.warning("could not look for %ss: %s", what, exc)
            return
        for key in doomed:
            self.delete_now(key, what)

    def _submit(self, fn: Callable[..., None], *args: object) -> bool:
        """Hand ``fn`` to a thread; False when no thread may start: the interpreter is
        exiting (a queue closed at exit commits what was pending, and tidies up after)."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="objq-janitor")
            try:
                future = self._pool.submit(fn, *args)
            except RuntimeError:  # that pool was shut down under us: work on a new one
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="objq-janitor")
                try:
                    future = self._pool.submit(fn, *args)
                except RuntimeError:  # no pool takes work once the interpreter is exiting
                    return False
            self._pending.add(future)
        future.add_done_callback(self._done)
        return True

    def _done(self, future: Future[None]) -> None:
        with self._lock:
            self._pending.discard(future)

    def wait(self, timeout: float | None = None) -> None:
        """Wait for the deletes asked for so far."""
        with self._lock:
            pending = list(self._pending)
        wait_for(pending, timeout)

    def delete_now(self, key: str, what: str) -> None:
        try:
            self.store.delete(key)
        except StorageError as exc:
            log.warning("could not remove %s %s: %s", what, key, exc)

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
