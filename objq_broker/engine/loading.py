"""The engine's cached state: the state object as last read or written, the version a commit
writes over, and when to read it again (a conflict, a report of another writer, staleness for
claims, an inspection); and the runs a batch needs, read into a cache of their own (a run
never changes once written).

:class:`StateCache` alone reads the state object and keeps its version: the
:class:`~objq_broker.engine.writing.TryWriter` stores a state through it
(:meth:`StateCache.write`), and the writer thread asks it for the state of each try
(:meth:`StateCache.load`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from objq_broker.engine.batch import NOT_READIED, EngineMetrics, Pending, ReadyMark
from objq_broker.engine.guard import StateGuard
from objq_broker.engine.runs import check_staged, read_runs
from objq_broker.errors import PreconditionFailed, StorageError, WriterFenced
from objq_broker.model.encoding import decode_state
from objq_broker.model.ops import EnqueueRuns, Session, runs_needed
from objq_broker.model.records import Job, KeyRecord, StateDoc
from objq_broker.model.state import QueueState
from objq_broker.storage.base import ObjectStore, write_if_unchanged
from objq_broker.storage.notify import folder_of, version, watch_folder
from objq_broker.storage.probe import require_conditions

log = logging.getLogger("objq_broker.engine")

#: How long an exclusive engine (a broker) trusts its cached state without a write: it reads
#: again after this long idle, to see a direct writer's changes or a successor's epoch (and
#: at once for an inspection, such as ``stats``).
EXCLUSIVE_RECHECK_SECONDS = 30.0
#: How many runs an engine keeps read beyond those its current batch needs.
RUN_CACHE_SIZE = 16


class StateCache:
    """One engine's copy of a namespace's state, and the version it writes over.

    >>> from objq_broker.storage import MemoryStore
    >>> cache = StateCache(
    ...     MemoryStore(), key="state.json", metrics=EngineMetrics(), epoch=None,
    ...     exclusive=False, clock=time.time, max_staleness_seconds=0.2,
    ...     max_state_bytes=1 << 20, on_change=lambda: None,
    ... )
    >>> cache.load(force=False, fresh=True).doc.version
    0
    >>> cache.close()
    """

    def __init__(
        self,
        store: ObjectStore,
        *,
        key: str,
        metrics: EngineMetrics,
        epoch: int | None,
        exclusive: bool,
        clock: Callable[[], float],
        max_staleness_seconds: float,
        max_state_bytes: int,
        on_change: Callable[[], None],
    ) -> None:
        self.store = store
        #: The state object's key under the store's prefix.
        self.key = key
        self.metrics = metrics
        #: The epoch this engine writes under (an elected broker's); a state with a higher one
        #: means it was replaced, and it stops. None: not elected, never fenced.
        self.epoch = epoch
        #: This engine is the namespace's only writer (a broker): its cached state is the
        #: stored one, so it reads only after a conflict, never to look for others' changes.
        self.exclusive = exclusive
        #: The wall clock the engine's commits are stamped with (a test's stand-in for
        #: ``time.time``).
        self.clock = clock
        #: How old the cached state may be before a claim or a read fetches it again.
        self.max_staleness_seconds = max_staleness_seconds
        #: A larger state is refused unread (a hostile one would exhaust memory).
        self.max_state_bytes = max_state_bytes
        #: Refuses a state that went back or vanished (``engine.guard``).
        self._guard = StateGuard(store, key)
        self._state: QueueState | None = None
        self._version: str | None = None
        self._synced_at = float("-inf")  # monotonic time the cache last matched storage
        self._state_bytes = 0  # size of the state as last read or written
        self._runs: dict[str, list[Job]] = {}  # runs read or written; they never change
        self._key_runs: dict[str, dict[str, KeyRecord]] = {}  # the same for key runs
        self._runs_missing: list[str] | None = None  # runs found gone by the last try
        self._lost_against: str | None = None  # the version a conflicting write expected
        self._others_moved = False  # the state changed since that conflict: progress
        # Writes to the state the store reported (a local folder does), and how many of them
        # the cache had seen when it was last read: a claim after a newer one reads again.
        self._told_changes = self._synced_changes = 0
        # The reports that come while this engine writes the state wait until its version is
        # known: the report of its own write is then no news (most come before the write
        # returns).
        self._reports_lock = threading.Lock()
        self._writing = False
        self._held_reports = 0
        self._on_change = on_change
        # The only writer learns nothing from reports of its own writes.
        self._watch = None if exclusive else watch_folder(store, folder_of(key), self._told)

    @property
    def state(self) -> QueueState | None:
        """The cached state; None before the first read and after :meth:`invalidate`."""
        return self._state

    @property
    def size(self) -> int:
        """The state's size in bytes, as last read or written."""
        return self._state_bytes

    @property
    def readied(self) -> ReadyMark:
        """The mark :attr:`Engine.readied` gives: it moves when a commit made jobs claimable,
        the state was read again, or the store reported a write to it."""
        state = self._state
        if state is None:
            return (*NOT_READIED[:2], self._told_changes)
        return (id(state), state.readied, self._told_changes)

    @property
    def told_changes(self) -> int:
        """How many writes to the state the store has reported."""
        return self._told_changes

    @property
    def runs(self) -> dict[str, list[Job]]:
        """The runs read or written so far, by key: what the state takes their jobs from."""
        return self._runs

    def load(self, *, force: bool, fresh: bool, latest: bool = False) -> QueueState:
        """The cached state, re-read when unknown, forced, asked for, reported written, or
        too old."""
        told = self._told_changes
        # The store reported a write since the cache was read (maybe this engine's own): a
        # write from the cache would likely lose its race, so every op reads first.
        changed = told != self._synced_changes
        too_old = fresh and time.monotonic() - self._synced_at > self.max_staleness_seconds
        if self._state is not None and not (force or latest or changed or too_old):
            return self._state
        recheck = time.monotonic() - self._synced_at >= EXCLUSIVE_RECHECK_SECONDS
        # The only writer trusts its cache, except for inspection: a write that bypassed it
        # (a process committing directly while this one was being elected, say) shows in the
        # answer at once, and the re-read wakes the claims parked here for its jobs.
        if self._state is not None and not force and self.exclusive and not recheck and not latest:
            return self._state
        blob = self.store.read(self.key)
        self.metrics.state_reads += 1
        if self._lost_against is not None:
            self._others_moved = blob is not None and blob.version != self._lost_against
            self._lost_against = None
        if blob is None:
            blob = self._guard.missing()  # None, or a state another process just created
        if blob is None:
            state, version = QueueState(), None
        elif self._state is not None and blob.version == self._version and not force:
            state, version = self._state, self._version  # unchanged since we last saw it
        else:
            doc = decode_state(
                blob.data, f"state {self.store.url}/{self.key}", self.max_state_bytes
            )
            self._guard.read(doc)
            fenced = self.epoch is not None and doc.epoch > self.epoch
            if fenced and not self._guard.forged_epoch(doc, self.epoch or 0):
                raise WriterFenced(
                    f"{self.store.url}/{self.key}: writer epoch {doc.epoch} took over from this "
                    f"writer's epoch {self.epoch}; this writer stops"
                )
            state, version = QueueState(doc), blob.version
        self._state_bytes = 0 if blob is None else len(blob.data)
        if self.exclusive and state is not self._state:
            state.hold_marks(self.clock())  # the only writer: use costs no write of its own
        state.run_contents = self._runs
        state.key_contents = self._key_runs
        self._state, self._version = state, version
        self._synced_at, self._synced_changes = time.monotonic(), told
        return state

    def invalidate(self) -> None:
        """Forget the cached state: the next :meth:`load` reads it."""
        self._state = None
        self._version = None
        self._synced_at = float("-inf")

    def lost_race(self) -> None:
        """A write over the cached version was refused: another writer got there first. The
        next read tells whether the state moved on since (:meth:`others_moved`)."""
        self._lost_against = self._version

    def others_moved(self) -> bool:
        """Whether the read after the last lost race found the state changed: another writer
        made progress. Says so once."""
        moved, self._others_moved = self._others_moved, False
        return moved

    def check_writable(self) -> None:
        """Before a try writes anything: a namespace's first state is created only on a store
        that honours write conditions."""
        if self._version is None:
            require_conditions(self.store, self.key)

    def write(self, doc: StateDoc, data: bytes) -> None:
        """Store ``data`` (``doc`` encoded) over the cached version (created if there was
        none), and take it as the cached state's version."""
        self._state_bytes = len(data)
        with self._reports_lock:
            self._writing = True
        wrote = False
        try:
            version = write_if_unchanged(self.store, self.key, data, self._version)
            if self._version is None:
                self._guard.created()
            self._guard.wrote(doc)
            self.metrics.state_writes += 1
            self._version = version
            self._synced_at = time.monotonic()
            wrote = True
        finally:
            self._tell_held(wrote=wrote)

    def forget_runs(self, keys: Iterable[str]) -> None:
        """Drop runs a landed commit consumed (they are being deleted)."""
        for key in keys:
            self._runs.pop(key, None)
            self._key_runs.pop(key, None)

    def read_runs(self, state: QueueState, ops: list[Pending], now: float) -> None:
        """Read the runs ``ops`` may take from or look into, so the model stays pure. The
        cache keeps the runs read last (runs never change), up to :data:`RUN_CACHE_SIZE`
        besides those this batch needs."""
        # A head that refers to no run needs none read (what the batch adds is written after).
        needed = runs_needed(state, [op.op for op in ops], now) if state.doc.has_runs() else []
        keep = {ref.key for _, ref in needed}
        for cache in (self._runs, self._key_runs):
            if len(cache) > RUN_CACHE_SIZE:
                spare = [k for k in cache if k not in keep]
                for key in spare[: len(cache) - RUN_CACHE_SIZE]:
                    del cache[key]  # the oldest read first
        missing, broken = read_runs(self.store, state, needed) if needed else ([], {})
        state.unreadable_runs = _check_staged(self.store, ops)
        for key, reason in broken.items():
            self._lose_run(state, key, reason, now)
        if not missing:
            self._runs_missing = None
            return
        if missing != self._runs_missing:
            self._runs_missing = missing
            where = f"{self.store.url}: runs {', '.join(missing)}"
            raise PreconditionFailed(f"{where} are gone: the state moved on; reading it again")
        # Read again from storage, the state still refers to them: they are lost, not taken.
        self._runs_missing = None
        for key in missing:
            self._lose_run(state, key, "the state refers to it, storage holds no such object", now)

    def _lose_run(self, state: QueueState, key: str, reason: str, now: float) -> None:
        log.error(
            "%s: run %s cannot be read (%s); its jobs are dropped, an archived record names it",
            self.store.url,
            key,
            reason,
        )
        state.lose_run(key, reason, now)

    def _told(self, key: str | None) -> None:
        """The store reported a write under the state's folder (on its own thread): if it
        was the state, and not a version the cache holds already, claims read it again and
        claimers look at once instead of at their next poll."""
        if key is not None and key != self.key:
            return
        if key is not None:
            with self._reports_lock:
                if self._writing:  # told when the write's version is known
                    self._held_reports += 1
                    return
            if self._holds_current(key):
                return
        self._note_report()

    def _tell_held(self, *, wrote: bool) -> None:
        """This engine's write ended: the reports that came meanwhile are news unless the
        state's version is the one it ``wrote`` (each write of its own is reported too)."""
        with self._reports_lock:
            self._writing = False
            held, self._held_reports = self._held_reports, 0
        if held and not (wrote and self._holds_current(self.key)):
            self._note_report()

    def _note_report(self) -> None:
        self._told_changes += 1
        self._on_change()

    def _holds_current(self, key: str) -> bool:
        """Whether the state's version in the store is the cached one: no news."""
        held = self._version
        if held is None:
            return False
        try:
            return version(self.store, key) == held
        except StorageError:
            return False  # news, then: the read that follows tells

    def close(self) -> None:
        """Stop watching the store for writes to the state."""
        if self._watch is not None:
            self._watch.close()


def _check_staged(store: ObjectStore, ops: list[Pending]) -> dict[str, str]:
    """Why each run a staged write of ``ops`` names cannot be added (see
    :func:`~objq_broker.engine.runs.check_staged`)."""
    unreadable: dict[str, str] = {}
    for pending in ops:
        # (No list per operation: this runs for every operation of every commit.)
        for op in pending.op.ops if isinstance(pending.op, Session) else (pending.op,):
            if isinstance(op, EnqueueRuns):
                unreadable |= check_staged(store, op.queue, op.runs)
    return unreadable
