"""The group-commit engine: one writer thread per (process, namespace).

Callers submit operations (:class:`~objq_broker.model.ops.Op`, data applied to a
:class:`~objq_broker.model.state.QueueState`) and get futures. The writer drains everything
pending into one batch, applies it to its cached state, archives the jobs that finished, writes
the state once with ``if_version``, and only then resolves the futures. New operations queue
up while a write is in flight: that is the batching.

Failure handling, in order of likelihood:

* **Conflict** (another process committed first): re-read, re-apply the batch and retry at
  once (a few milliseconds of jitter). A conflict means another writer made progress, so it
  restarts the deadline: no call fails while the namespace as a whole is moving, and a writer
  that lost does not fall behind those that won by waiting longer after each loss.
* **Storage error**: retry until ``commit_deadline_seconds``, then fail the batch's futures. No
  future is ever resolved as a success before its effect is durable.
* **Ambiguous write** (the write may have landed although the call failed): re-read and look for
  the commit id of every failed try of this batch in ``recent_commits``. Found: that try's
  saved results are the true ones. Not found: the batch is applied afresh, so an enqueue is
  never doubled and an ack never lost. A write that failed may still be in flight and land
  later (a timed-out PUT), so every failed try is remembered until the batch settles: at most
  one of them can land, since each expects the version the one before it found.
* **Corrupt or unknown state**, missing bucket, denied access: every op of the batch fails with
  that error at once, and the state object is left untouched.
"""

from __future__ import annotations

import functools
import logging
import random
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from objq_broker.engine.archive import DEFAULT_ARCHIVE_TAIL_BYTES, plan_archive
from objq_broker.engine.bindings import unbind_queues
from objq_broker.engine.bodies import BodyCache
from objq_broker.engine.budget import budget_wait
from objq_broker.engine.garbage import (
    DEFAULT_GC_INTERVAL_SECONDS,
    DEFAULT_OLDER_THAN_SECONDS,
    Sweeper,
)
from objq_broker.engine.guard import STATE_KEY, StateGuard
from objq_broker.engine.janitor import Janitor
from objq_broker.engine.options import EngineLimits, check_engine_settings
from objq_broker.engine.runs import MERGE_AT, MergeReads, read_runs
from objq_broker.engine.timings import Durations
from objq_broker.errors import (
    AccessDenied,
    BucketNotFound,
    ConfigurationError,
    ObjqError,
    PreconditionFailed,
    QueueClosed,
    QueueError,
    StateCorrupt,
    StorageError,
    StorageUnavailable,
    WriterFenced,
)
from objq_broker.model.backoff import backoff_seconds
from objq_broker.model.bodies import bodies_key, encode_bodies
from objq_broker.model.ops import (
    Claim,
    Nothing,
    Op,
    Read,
    Session,
    SetWriteBudget,
    runs_needed,
)
from objq_broker.model.records import (
    DEFAULT_MAX_STATE_BYTES,
    RECENT_COMMITS,
    ArchiveRecord,
    Job,
    KeyRecord,
    KeyRunRef,
    RunRef,
    StateDoc,
    check_encoded,
    decode_state,
    encode_archive,
)
from objq_broker.model.runs import MAX_RUN_JOBS, RUNS_PREFIX, orphan_runs, run_key
from objq_broker.model.state import QueueState
from objq_broker.model.tally import JOB_EVENTS, job_events
from objq_broker.model.values import Finished
from objq_broker.storage.base import ObjectStore
from objq_broker.storage.notify import folder_of, watch_folder

T = TypeVar("T")

log = logging.getLogger("objq_broker.engine")

#: Most operations one commit applies.
DEFAULT_MAX_BATCH_OPS = 5000
#: Most payload bytes one commit adds.
DEFAULT_MAX_BATCH_BYTES = 16 * 1024 * 1024
#: How long a batch keeps retrying storage errors and conflicts before its ops fail.
DEFAULT_COMMIT_DEADLINE_SECONDS = 30.0
#: How old the cached state may be before a claim or a read fetches it again.
DEFAULT_MAX_STALENESS_SECONDS = 0.2
#: How often an idle consumer engine looks for stale leases to expire (at first: the interval
#: doubles while nothing happens, up to ``MAX_IDLE_TICK_SECONDS``).
DEFAULT_IDLE_TICK_SECONDS = 1.0
MAX_IDLE_TICK_SECONDS = 16.0
#: How long an exclusive engine (a broker) trusts its cached state without a write: it reads
#: again after this long idle, to see a direct writer's changes or a successor's epoch (and
#: at once for an inspection, such as ``stats``).
EXCLUSIVE_RECHECK_SECONDS = 30.0
#: Longest pause before retrying after a conflict (jitter, so losers do not collide again).
CONFLICT_JITTER_SECONDS = 0.003
#: For this long after a conflict, another writer is taken to be active: each commit reads
#: the state before writing (a read that finds it unchanged costs no decode) instead of
#: writing blind on its cached copy, losing, and reading anyway.
CONTENDED_SECONDS = 1.0
#: Longest adaptive wait for a batch to fill (see ``Engine._linger``).
ADAPTIVE_LINGER_MAX_SECONDS = 0.02
#: How many runs an engine keeps read beyond those its current batch needs.
RUN_CACHE_SIZE = 16
#: Ready (or delayed) jobs a queue keeps in the state's head before they move to a run; dead
#: letters and idempotency keys likewise (``docs/segments.md``).
DEFAULT_SPILL_AT = 1_000
#: While the state is smaller than this, payloads larger than the model's inline limit stay in
#: it too: a bodies object would cost a second write per commit and a read per consumer, more
#: than the bytes cost while the state is small. Past it, they go out of line (``bodies/``).
DEFAULT_INLINE_STATE_BYTES = 64 * 1024
#: What :attr:`Engine.readied` returns: the cached state's identity, the count of jobs it
#: readied, and the count of writes to it the store reported.
ReadyMark = tuple[int, int, int]
NOT_READIED: ReadyMark = (0, -1, 0)
#: How often an engine whose namespace has runs lists them to delete orphans (one LIST
#: request per thousand runs on S3 or GCS).
RUN_SWEEP_SECONDS = 600.0
#: Errors that no retry can fix: fail the batch at once (a store's SDK refusing the bucket
#: name or endpoint is a ``ConfigurationError``).
_FATAL = (StateCorrupt, AccessDenied, BucketNotFound, WriterFenced, ConfigurationError)


@dataclass(frozen=True)
class Readiness:
    """What the commits so far made claimable, per queue (:meth:`Engine.readiness`).
    ``state`` changes when the state was read again: every count starts over then."""

    state: int
    readied: dict[str, int]
    due: dict[str, float]  # when each queue's next timed job comes due (wall clock)


class StandingClaims(Protocol):
    """Claims that wait at an engine for jobs (a broker's parked claimers,
    :mod:`objq_broker.broker.parking`). A commit that readies jobs in their queues takes some
    of them into its own batch, after everything else: a waiting claimer gets its job in the
    very write that readied it, not in a commit of its own after it."""

    def waiting_on(self) -> Collection[str]:
        """The queues claims wait on now (empty: none, and a commit looks no further)."""

    def take(
        self, readied: Mapping[str, int], fits: Callable[[Op[Any]], bool]
    ) -> list[tuple[Op[Any], Future[Any]]]:
        """The waiting claims to apply in this try, each with the future its outcome goes
        to, given how many jobs the try readied per queue. ``fits(op)``: whether ``op`` can
        be applied without reading a run first (the runs a batch needs are read before it)."""


@dataclass
class EngineMetrics:
    """Counters since the engine started; ``state_writes / ops`` is the storage bill."""

    ops: int = 0
    batches: int = 0
    state_writes: int = 0
    state_reads: int = 0
    archive_writes: int = 0
    bodies_writes: int = 0
    conflicts: int = 0
    storage_errors: int = 0
    runs_merged: int = 0
    max_batch_ops: int = 0
    commit_seconds_total: float = 0.0
    # What this process's operations did to jobs (``model.tally``), and the leases its
    # commits expired.
    enqueued: int = 0
    claimed: int = 0
    acked: int = 0
    retried: int = 0
    failed: int = 0
    dead_lettered: int = 0
    released: int = 0
    expired: int = 0
    #: How long this process's own commits took (``engine.timings``).
    commit_durations: Durations = field(default_factory=Durations)

    def snapshot(self) -> dict[str, float]:
        """The counters (the durations histogram apart)."""
        return {k: v for k, v in self.__dict__.items() if k != "commit_durations"}

    def count(self, events: Mapping[str, int]) -> None:
        """Add job events (names of :data:`~objq_broker.model.tally.JOB_EVENTS`)."""
        for name, n in events.items():
            setattr(self, name, getattr(self, name) + n)

    def add_job_events(self, other: EngineMetrics) -> None:
        """Add ``other``'s job events to these."""
        self.count({name: getattr(other, name) for name in JOB_EVENTS})


@dataclass(slots=True)
class _Op:
    op: Op[Any]
    future: Future[Any]
    fresh: bool
    latest: bool
    size: int
    consumer: bool

    @classmethod
    def of(cls, op: Op[Any], future: Future[Any]) -> _Op:
        """``op`` as a batch holds it: its class says how fresh the state must be (``fresh``
        for claims, ``latest`` for inspection) and whether its caller consumes."""
        return cls(op, future, op.fresh or op.latest, op.latest, op.size, op.consumer)


@dataclass
class _Attempt:
    """One try at committing a batch, kept so an ambiguous write can be resolved."""

    commit_id: str
    results: list[tuple[_Op, bool, Any]]
    finished: list[Finished] = field(default_factory=list)
    #: Objects this attempt wrote (or reused) before the state: orphans if another try lands.
    written: list[str] = field(default_factory=list)
    #: What each of those objects holds, so a retry that would write the same reuses it.
    contents: dict[str, object] = field(default_factory=dict)
    #: Leases this try's state expired on its own (beside what its operations did).
    expired: int = 0


class Engine:
    """Batches queue operations into conditional writes of one state object.

    >>> from objq_broker.model.ops import Declare
    >>> from objq_broker.storage import MemoryStore
    >>> engine = Engine(MemoryStore())
    >>> engine.call(Declare("emails"))
    True
    >>> engine.close()
    """

    def __init__(
        self,
        store: ObjectStore,
        *,
        key: str = STATE_KEY,
        archive: bool = True,
        max_batch_ops: int = DEFAULT_MAX_BATCH_OPS,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        linger_seconds: float = 0.0,
        commit_deadline_seconds: float = DEFAULT_COMMIT_DEADLINE_SECONDS,
        max_staleness_seconds: float = DEFAULT_MAX_STALENESS_SECONDS,
        idle_tick_seconds: float = DEFAULT_IDLE_TICK_SECONDS,
        epoch: int | None = None,
        exclusive: bool = False,
        bodies: BodyCache | None = None,
        clock: Callable[[], float] = time.time,
        seed: int | None = None,
        spill_at: int | None = DEFAULT_SPILL_AT,
        run_jobs: int = MAX_RUN_JOBS,
        gc_interval_seconds: float | None = DEFAULT_GC_INTERVAL_SECONDS,
        gc_older_than_seconds: float = DEFAULT_OLDER_THAN_SECONDS,
        inline_state_bytes: int = DEFAULT_INLINE_STATE_BYTES,
        max_state_bytes: int = DEFAULT_MAX_STATE_BYTES,
        archive_tail_bytes: int = DEFAULT_ARCHIVE_TAIL_BYTES,
    ) -> None:
        check_engine_settings(
            {
                name: value
                for name, value in locals().items()
                if name in EngineLimits.__struct_fields__
            }
        )
        self.inline_state_bytes = inline_state_bytes
        #: A larger state is refused unread (a hostile one would exhaust memory).
        self.max_state_bytes = max_state_bytes
        # Sizes of the state as last read or written, and of the archive tail it holds.
        self._state_bytes = self._tail_bytes = 0
        self._contended_until = 0.0  # monotonic time until which other writers seem active
        self.store = store
        self.key = key
        #: Archive finished jobs (False: drop their records), through a tail kept in the state
        #: until it holds this many bytes (``engine.archive``).
        self.archive, self.archive_tail_bytes = archive, archive_tail_bytes
        self.max_batch_ops, self.max_batch_bytes = max_batch_ops, max_batch_bytes
        self.linger_seconds = linger_seconds
        self.commit_deadline_seconds = commit_deadline_seconds
        self.max_staleness_seconds = max_staleness_seconds
        self.idle_tick_seconds = idle_tick_seconds
        #: The epoch this engine writes under (an elected broker's); a state with a higher one
        #: means it was replaced, and it stops. None: not elected, never fenced.
        self.epoch = epoch
        #: This engine is the namespace's only writer (a broker): its cached state is the
        #: stored one, so it reads only after a conflict, never to look for others' changes.
        self.exclusive = exclusive
        #: Move a queue's ready or delayed jobs, dead letters and idempotency keys out of the
        #: head into runs past this many (``docs/segments.md``); None: never, so the state
        #: stays readable by releases before runs (format 1).
        self.spill_at = spill_at
        #: Most jobs in one run (small in tests, to make many).
        self.run_jobs = run_jobs
        self._run_cache: dict[str, list[Job]] = {}  # runs read or written; they never change
        self._key_cache: dict[str, dict[str, KeyRecord]] = {}  # the same for key runs
        self._runs_missing: list[str] | None = None  # runs found gone by the last try
        self._next_run_sweep = float("-inf")  # monotonic time to look for orphan runs again
        self.clock = clock
        self.metrics = EngineMetrics()
        #: Payload bodies kept out of the state, cached by bodies object.
        self.bodies = bodies if bodies is not None else BodyCache(store)
        self._janitor = Janitor(store)
        #: Refuses a state that went back or vanished (``engine.guard``).
        self._guard = StateGuard(store, key)
        self._merge_reads = MergeReads(store, self._janitor, run_jobs)
        #: Collects unreferenced objects now and then (``docs/deploy.md``); None: never.
        self.sweeper = (
            None
            if gc_interval_seconds is None
            else Sweeper(
                store,
                self._janitor,
                interval=gc_interval_seconds,
                older_than=gc_older_than_seconds,
            )
        )
        self._rng = random.Random(seed)
        self._state: QueueState | None = None
        self._version: str | None = None
        self._synced_at = float("-inf")  # monotonic time the cache last matched storage
        self._pending: deque[_Op] = deque()
        self._cv = threading.Condition()
        self._closing = False
        self._fenced: WriterFenced | None = None
        self._broken: QueueError | None = None  # why the writer thread stopped, if it did
        self._consumer = False
        self._thread: threading.Thread | None = None
        self._commit_listeners: list[Callable[[], None]] = []
        self._standing: StandingClaims | None = None
        #: This batch's tries whose state write failed: any one of them may yet have landed.
        self._failed_tries: list[_Attempt] = []
        self._committing = 0  # ops in the batch being committed
        self._callers = 0  # most ops pending or committing since the last batch was taken
        self._expected = 0  # ... as of the last commit: how many the next batch waits for
        self._last_commit_seconds = 0.0
        self._idle_tick = idle_tick_seconds
        self._lost_against: str | None = None  # the version a conflicting write expected
        self._others_moved = False  # the state changed since that conflict: progress
        self._watch_state()

    def _watch_state(self) -> None:
        # Writes to the state the store reported (a local folder does), and how many of them
        # the cache had seen when it was last read: a claim after a newer one reads again.
        self._told_changes = self._synced_changes = 0
        # The only writer learns nothing from reports of its own writes.
        self._watch = (
            None if self.exclusive else watch_folder(self.store, folder_of(self.key), self._told)
        )

    def _told(self, key: str | None) -> None:
        """The store reported a write under the state's folder (on its own thread): if it
        was the state, by another process or by this one, claims read it again and claimers
        look at once instead of at their next poll."""
        if key is not None and key != self.key:
            return
        self._told_changes += 1
        self._tell_listeners()

    def _tell_listeners(self) -> None:
        """Call the commit listeners (on the writer's or the store's thread); one that
        raises must stop neither."""
        for listener in self._commit_listeners:
            try:
                listener()
            except Exception:
                log.exception("a commit listener failed")

    def __repr__(self) -> str:
        role = "" if self.epoch is None else f", epoch={self.epoch}"
        return f"Engine({self.store.url!r}{role})"

    # --- public ----------------------------------------------------------------------------

    def submit(self, op: Op[T]) -> Future[T]:
        """Queue ``op`` for the next commit. Its class says how fresh the state must be
        (``fresh`` for claims, ``latest`` for inspection) and whether its caller consumes
        (which turns on idle lease expiry)."""
        future: Future[T] = Future()
        pending = _Op.of(op, future)  # (its properties are read outside the lock)
        with self._cv:
            if self._fenced is not None:
                raise self._fenced
            if self._broken is not None:
                raise self._broken
            if self._closing:
                raise QueueClosed(f"the engine for {self.store.url} is closed")
            self._pending.append(pending)
            self._callers = max(self._callers, len(self._pending) + self._committing)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"objq-writer {self.store.url}", daemon=True
                )
                self._thread.start()
            self._cv.notify()
        return future

    def call(self, op: Op[T]) -> T:
        """Submit ``op`` and wait until its effect is durable; return its result."""
        return self.submit(op).result()

    def claim_waiting(self, claim: Claim, wait_seconds: float) -> list[Job] | None:
        """None: an engine of its own has nobody to wait at; its caller claims and waits
        for commits itself."""
        return None

    def flush(self, timeout: float | None = None) -> None:
        """Wait until everything submitted so far is durable (or failed), and the objects
        its commits freed are deleted."""
        with self._cv:
            if self._thread is None:
                return
        self.submit(Nothing()).result(timeout)
        self._janitor.wait(timeout)

    def on_commit(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (on the writer thread) after each batch; it must not block."""
        self._commit_listeners.append(listener)

    def take_waiting_claims(self, source: StandingClaims) -> None:
        """Let each commit that readies jobs take claims waiting for them from ``source``."""
        self._standing = source

    def close(self, timeout: float | None = None) -> None:
        """Commit what is pending, then stop the writer thread."""
        with self._cv:
            self._closing = True
            self._cv.notify()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
        if self._watch is not None:
            self._watch.close()
        self._janitor.close()
        self.bodies.close()

    @property
    def closed(self) -> bool:
        return self._closing

    @property
    def readied(self) -> ReadyMark:
        """A mark that changes whenever a commit made jobs claimable, the state was read
        again, or the store reported a write to it: what tells a broker (or a queue) its
        waiting claimers have something to look for."""
        state = self._state
        if state is None:
            return (*NOT_READIED[:2], self._told_changes)
        return (id(state), state.readied, self._told_changes)

    def readiness(self, queues: Iterable[str]) -> Readiness:
        """How many jobs each of ``queues`` has had made claimable, and when the next timed
        one comes due. Call it only from a commit listener: the engine's thread, between
        commits, when the state holds still."""
        state = self._state
        if state is None:
            return Readiness(0, {}, {})
        counts = {name: state.readied_in.get(name, 0) for name in queues}
        due: dict[str, float] = {}
        for name in counts:
            # A claimer parked on a queue that expires claims again in time to keep it.
            times = (state.next_visible(name), state.touch_due(name))
            found = [at for at in times if at is not None]
            if found:
                due[name] = min(found)
        return Readiness(id(state), counts, due)

    @property
    def fenced(self) -> WriterFenced | None:
        """Why this engine stopped writing, if a writer with a newer epoch replaced it."""
        return self._fenced

    # --- writer thread ---------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                batch = self._next_batch()
                if batch is None:
                    return
                self._commit(batch)
        except BaseException as exc:
            # Nothing should get here (a commit fails its own batch); if something does, the
            # writer cannot go on, and no caller may wait for it for ever.
            self._stop_broken(exc)
            raise

    def _stop_broken(self, exc: BaseException) -> None:
        """Fail every pending op, and every later one, with why the writer stopped."""
        broken = QueueError(f"the writer for {self.store.url} stopped: {type(exc).__name__}: {exc}")
        broken.__cause__ = exc
        with self._cv:
            self._broken = broken
            pending, self._pending = list(self._pending), deque()
        self._fail(pending, broken)

    def _next_batch(self) -> list[_Op] | None:
        """Wait for work (or an idle tick) and take a batch; None when closed and drained."""
        with self._cv:
            while not self._pending:
                if self._closing:
                    return None
                tick = self._idle_tick if self._consumer else None
                if not self._cv.wait(tick) and not self._pending:
                    # Idle tick: expire stale leases. Each costs a read in direct mode, so
                    # they grow sparser while nothing happens (claims expire leases too).
                    self._idle_tick = min(self._idle_tick * 2, MAX_IDLE_TICK_SECONDS)
                    return []
            self._idle_tick = self.idle_tick_seconds
            self._linger()
            self._keep_to_budget()
            batch: list[_Op] = []
            size = 0
            while self._pending and len(batch) < self.max_batch_ops:
                op = self._pending[0]
                if batch and size + op.size > self.max_batch_bytes:
                    break
                batch.append(self._pending.popleft())
                size += op.size
            self._committing = self._callers = len(batch)
            return batch

    def _linger(self) -> None:
        """Let a batch fill before committing it (called holding ``_cv``).

        With ``linger_seconds`` set, always wait that long (or for a full batch). Otherwise
        adapt: as many ops were pending or committing at once during the last commit; the
        callers it released are still submitting their next ones, so wait (two commits' time
        at most, and at most ``ADAPTIVE_LINGER_MAX_SECONDS``) for all of them. 50 threads make
        batches of ~50, not 48 then 2, and a broker's clients, whose sessions come back after
        a network round trip each, share one commit instead of taking turns (waiting up to
        two commits measured best for 8 clients). One caller never waits.
        """
        if self._closing:
            return
        if self.linger_seconds > 0:
            target, span = self.max_batch_ops, self.linger_seconds
        else:
            target = self._expected
            if len(self._pending) >= target:
                return
            span = min(ADAPTIVE_LINGER_MAX_SECONDS, 2 * self._last_commit_seconds)
        end = time.monotonic() + span
        while len(self._pending) < target and not self._closing:
            remaining = end - time.monotonic()
            if remaining <= 0:
                return
            self._cv.wait(remaining)

    def _keep_to_budget(self) -> None:
        """Under a write budget (``engine.budget``), wait until the namespace may write again
        before taking a batch that may write (called holding ``_cv``); what is submitted
        meanwhile joins the batch. Reads and flushes never wait, nor does changing the budget
        (lifting one of a write a minute must not take a minute)."""
        state = self._state
        if state is None or state.doc.write_budget is None:
            return
        if all(isinstance(op.op, Read | Nothing) for op in self._pending) or any(
            isinstance(op.op, SetWriteBudget) for op in self._pending
        ):
            return
        wait = budget_wait(
            state.doc.write_budget, last_commit=state.doc.committed_at, now=self.clock()
        )
        end = time.monotonic() + wait
        while not self._closing and (remaining := end - time.monotonic()) > 0:
            self._cv.wait(remaining)

    def _commit(self, batch: list[_Op]) -> None:
        started = time.monotonic()
        if any(op.consumer for op in batch):
            self._consumer = True
        live = [op for op in batch if op.future.set_running_or_notify_cancel()]
        # Claims last (a stable sort): a claim sees the jobs enqueued in its own batch, so a
        # claimer that found nothing is woken by the next commit, never left waiting a poll.
        live.sort(key=lambda op: op.consumer)
        try:
            self._commit_with_retries(
                live,
                fresh=not batch or any(op.fresh for op in batch),
                latest=any(op.latest for op in batch),
            )
        finally:
            self.metrics.batches += 1
            self.metrics.ops += len(batch)
            self.metrics.max_batch_ops = max(self.metrics.max_batch_ops, len(batch))
            self._last_commit_seconds = time.monotonic() - started
            with self._cv:
                self._committing = 0
                self._expected = self._callers
            self.metrics.commit_seconds_total += self._last_commit_seconds
            self.metrics.commit_durations.observe(self._last_commit_seconds)
            self._tell_listeners()

    def _commit_with_retries(self, live: list[_Op], *, fresh: bool, latest: bool) -> None:
        deadline = time.monotonic() + self.commit_deadline_seconds
        # Left by a batch that gave up: those writes may still land, so their objects stay.
        self._failed_tries = []
        tries = 0
        while True:
            tries += 1
            started = time.monotonic()
            try:
                if self._try_commit(live, fresh, latest):
                    return
            except _FATAL as exc:
                self._invalidate()
                if isinstance(exc, WriterFenced):
                    self._fenced = exc
                self._fail(live, exc)
                return
            except (PreconditionFailed, StorageError) as exc:
                deadline = self._note_failure(exc, deadline)
                # A try as slow as this one (a storage call that timed out) would end past the
                # deadline: fail now rather than that late. Conflicts are quick to retry.
                took = 0.0 if isinstance(exc, PreconditionFailed) else time.monotonic() - started
                if time.monotonic() + took >= deadline:
                    self._fail(live, self._deadline_error(exc, tries))
                    return
                if isinstance(exc, PreconditionFailed):
                    # Re-read and go again: waiting longer only hands the lead to the others.
                    pause = self._rng.random() * CONFLICT_JITTER_SECONDS
                else:
                    pause = backoff_seconds(tries, 0.005, 1.0, self._rng.random())
                time.sleep(min(pause, max(deadline - time.monotonic(), 0.0)))
            except Exception as exc:
                # Not an objq error: a bug, or an SDK error objq does not translate. The try
                # may have been half applied: read afresh and try again, as after a storage
                # error, and fail the batch (never the writer) once its deadline has passed.
                log.warning(
                    "commit on %s failed unexpectedly, retrying", self.store.url, exc_info=True
                )
                self._invalidate()
                if time.monotonic() >= deadline:
                    self._fail(live, _unexpected(self.store.url, exc, bool(self._failed_tries)))
                    return
                time.sleep(
                    min(
                        backoff_seconds(tries, 0.005, 1.0, self._rng.random()),
                        max(deadline - time.monotonic(), 0.0),
                    )
                )

    def _note_failure(self, exc: StorageError, deadline: float) -> float:
        """Count a failed try and drop the cache; returns the batch's deadline, restarted when
        the previous conflict turned out to be another writer's progress."""
        if isinstance(exc, PreconditionFailed):
            self._lost_against = self._version
            self._contended_until = time.monotonic() + CONTENDED_SECONDS
            self.metrics.conflicts += 1
        else:
            self.metrics.storage_errors += 1
            log.warning("storage error on %s, retrying: %s", self.store.url, exc)
        self._invalidate()
        if self._others_moved:
            self._others_moved = False
            return time.monotonic() + self.commit_deadline_seconds
        return deadline

    def _try_commit(self, live: list[_Op], fresh: bool, latest: bool) -> bool:
        """One try; True when every op is settled, False to try again at once."""
        failed = self._failed_tries
        contended = not self.exclusive and time.monotonic() < self._contended_until
        state = self._load(force=bool(failed), fresh=fresh, latest=latest or contended)
        recent = set(state.doc.recent_commits)
        landed = next((a for a in failed if a.commit_id in recent), None)
        if landed is not None:
            log.info("commit %s landed although its write failed", landed.commit_id)
            self._settled(landed)
            return True
        # None has landed yet. What they wrote ahead of the state is kept: the next try
        # re-applies the same ops and usually writes the very same archive and bodies.
        attempt = self._apply(state, live)
        if attempt is None:
            return False  # an op crashed: it was failed and dropped; start again
        if state.dirty:
            try:
                self._write(state, attempt)
            except StorageError as exc:
                # Even a refused condition may hide a landed write: an SDK that retried a
                # timed-out PUT gets 412 from its own first attempt. Look before re-applying.
                if not isinstance(exc, _FATAL):
                    failed.append(attempt)
                raise
        self._settled(attempt)
        return True

    def _settled(self, landed: _Attempt) -> None:
        """``landed`` is the try whose state is stored: resolve its results, and delete what
        the other tries wrote ahead of theirs (none of them can land on top of it)."""
        self._resolve(landed.results)
        self._tally(landed)
        kept = set(landed.written)
        orphans = {key for a in self._failed_tries for key in a.written} - kept
        for key in sorted(orphans):
            self._delete_quietly(key, "orphan object")
        self._failed_tries = []

    def _tally(self, landed: _Attempt) -> None:
        """Count what the landed try did to jobs. A broker's sessions are left out: each
        client counts its own operations from the outcomes it gets back."""
        try:
            self.metrics.count({"expired": landed.expired})
            for op, ok, value in landed.results:
                if ok and not isinstance(op.op, Session):
                    self.metrics.count(job_events(op.op, value))
        except Exception:  # a counter must never fail a commit that landed
            log.exception("counting a commit's job events failed")

    def _deadline_error(self, exc: Exception, tries: int) -> ObjqError:
        what = (
            "could not confirm whether the last write landed" if self._failed_tries else "gave up"
        )
        # Whatever the last try met (a timeout, or a race lost after a slow write), the
        # storage could not take the commit in time: a transient storage error.
        return StorageUnavailable(
            f"{self.store.url}: commit {what} after {tries} tries in "
            f"{self.commit_deadline_seconds:g} s; last error: {exc}"
        )

    def _load(self, *, force: bool, fresh: bool, latest: bool = False) -> QueueState:
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
        state.run_contents = self._run_cache
        state.key_contents = self._key_cache
        self._state, self._version = state, version
        self._synced_at, self._synced_changes = time.monotonic(), told
        return state

    def _apply(self, state: QueueState, ops: list[_Op]) -> _Attempt | None:
        now = self.clock()
        self._read_runs(state, ops, now)
        waiting = self._standing.waiting_on() if self._standing is not None else ()
        before = {name: state.readied_in.get(name, 0) for name in waiting}
        results: list[tuple[_Op, bool, Any]] = []
        for op in ops:
            if not self._apply_one(state, op, now, results):
                ops.remove(op)
                return None
        expired = state.expire(now)
        if before and not self._join_waiting_claims(state, ops, results, before, now):
            return None
        return _Attempt(uuid.uuid4().hex, results, finished=list(state.finished), expired=expired)

    def _apply_one(
        self, state: QueueState, op: _Op, now: float, results: list[tuple[_Op, bool, Any]]
    ) -> bool:
        """Apply ``op`` and note its outcome; False (the op failed, the state dropped) when
        it crashed."""
        try:
            results.append((op, True, op.op.apply(state, now)))
        except ObjqError as exc:
            # Transitions check before they change anything: the state is intact.
            results.append((op, False, exc))
        except Exception as exc:
            # A bug may have left the state half-changed: fail this op, start again.
            log.exception("operation failed unexpectedly; re-reading the state")
            op.future.set_exception(exc)
            self._invalidate()
            return False
        return True

    def _join_waiting_claims(
        self,
        state: QueueState,
        ops: list[_Op],
        results: list[tuple[_Op, bool, Any]],
        before: dict[str, int],
        now: float,
    ) -> bool:
        """Apply the waiting claims this try readied jobs for, as members of the batch (a
        retry applies them again); False when one crashed (see :meth:`_apply_one`)."""
        assert self._standing is not None
        readied = {name: state.readied_in.get(name, 0) - n for name, n in before.items()}
        readied = {name: n for name, n in readied.items() if n > 0}
        if not readied:
            return True

        def fits(op: Op[Any]) -> bool:
            return all(_cached(state, ref) for _, ref in runs_needed(state, [op], now))

        for op, future in self._standing.take(readied, fits):
            if not future.set_running_or_notify_cancel():
                continue
            joined = _Op.of(op, future)
            ops.append(joined)
            if not self._apply_one(state, joined, now, results):
                ops.remove(joined)
                return False
        return True

    def _read_runs(self, state: QueueState, ops: list[_Op], now: float) -> None:
        """Read the runs ``ops`` may take from or look into, so the model stays pure. The
        cache keeps the runs read last (runs never change), up to :data:`RUN_CACHE_SIZE`
        besides those this batch needs."""
        needed = runs_needed(state, [op.op for op in ops], now)
        keep = {ref.key for _, ref in needed}
        for cache in (self._run_cache, self._key_cache):
            spare = [k for k in cache if k not in keep]
            for key in spare[: max(len(cache) - RUN_CACHE_SIZE, 0)]:
                del cache[key]  # the oldest read first
        missing = read_runs(self.store, state, needed) if needed else []
        if not missing:
            self._runs_missing = None
            return
        where = f"{self.store.url}: runs {', '.join(missing)}"
        if missing == self._runs_missing:
            raise StateCorrupt(f"{where}: expected as the state refers to them, found none")
        self._runs_missing = missing
        raise PreconditionFailed(f"{where} are gone: the state moved on; reading it again")

    def _write(self, state: QueueState, attempt: _Attempt) -> None:
        doc = state.doc
        now = self.clock()
        doc.version += 1
        if self.epoch is not None:
            doc.epoch = max(doc.epoch, self.epoch)
        doc.commit_id = attempt.commit_id
        doc.committed_at = now
        doc.recent_commits = [*doc.recent_commits, attempt.commit_id][-RECENT_COMMITS:]
        self._write_bodies(state, attempt)
        self._write_runs(state, attempt)
        if self.archive and (attempt.finished or doc.archive_tail is not None):
            self._write_archive(doc, attempt, now)
        data = state.encode()
        check_encoded(data, f"state {self.store.url}/{self.key}")
        self._state_bytes = len(data)
        if self._version is None:
            version = self.store.write(self.key, data, if_absent=True)
            self._guard.created()
        else:
            version = self.store.write(self.key, data, if_version=self._version)
        self._guard.wrote(doc)
        self.metrics.state_writes += 1
        self._version = version
        self._synced_at = time.monotonic()
        state.dirty = False
        state.finished.clear()
        try:
            self._after_write(state)
        except Exception:  # the commit landed: what follows only tidies up after it
            log.exception("tidying up after a commit on %s failed", self.store.url)

    def _write_archive(self, doc: StateDoc, attempt: _Attempt, now: float) -> None:
        """Put the records of the jobs this commit finishes in the state's archive tail, and
        write the archive objects its plan calls for (:func:`plan_archive`). Before the state:
        a job leaves the state only once its record is stored, here or in the state itself."""
        records = [
            ArchiveRecord(f.outcome, attempt.commit_id, self._inline(f.job))
            for f in attempt.finished
        ]
        plan = plan_archive(
            doc.archive_tail, records, attempt.commit_id, now, self.archive_tail_bytes
        )
        if plan is None:
            return
        doc.archive_tail = plan.tail
        self._tail_bytes = plan.tail_bytes
        for planned, held in plan.objects:
            content = [(r.outcome, r.job.id) for r in held]
            key = self._spare_holding(content) or planned
            if not self._reuse(key, attempt):
                self.store.write(key, encode_archive(held), if_absent=True)
                self._wrote(attempt, key, content)
                self.metrics.archive_writes += 1

    def _after_write(self, state: QueueState) -> None:
        """Forget and delete what the landed commit freed, and plan what comes next."""
        unused, state.unused_bodies = state.unused_bodies, []
        for key in unused:
            self.bodies.forget(key)
        self._janitor.delete(unused, "unused bodies object")
        consumed, state.unused_runs = state.unused_runs, []
        for key in consumed:
            self._run_cache.pop(key, None)
            self._key_cache.pop(key, None)
        self._janitor.delete(consumed, "consumed run")
        self._unbind_removed(state)
        self._sweep(state)
        if self.spill_at is not None:
            self._merge_reads.plan(state, self._run_cache)

    def _unbind_removed(self, state: QueueState) -> None:
        """The queues this commit deleted (or found expired) lose their kombu bindings, off
        the writer thread. If that fails, what those bindings route is dropped all the same
        (a routed message never brings its queue back), and the next delete retries."""
        removed, state.removed_queues = state.removed_queues, []
        if not removed:
            return

        def unbind() -> None:
            unbind_queues(self.store, removed)

        self._janitor.run(unbind, f"the bindings of removed queues {removed}")

    def _write_bodies(self, state: QueueState, attempt: _Attempt) -> None:
        """Move this commit's large payloads out of the state, unless it is small enough to
        keep them. Bodies first: the state must never refer to an object that is not stored."""
        if state.new_bodies and self._bodies_fit(state):
            state.keep_bodies_inline()
        if not state.new_bodies:
            return
        content = state.new_bodies_content()
        key = self._spare_holding(content) or bodies_key(attempt.commit_id)
        entries = state.externalize(key)
        if entries and not self._reuse(key, attempt):
            self.store.write(key, encode_bodies(entries), if_absent=True)
            self._wrote(attempt, key, content)
            self.bodies.remember(key, entries)
            self.metrics.bodies_writes += 1

    def _bodies_fit(self, state: QueueState) -> bool:
        """Whether this commit's large payloads may stay in the state: it stays under
        ``inline_state_bytes`` with them (as of its last size: close enough, and free)."""
        added = sum(len(job.body) for job in state.new_bodies)
        # The archive tail is not the state's to spend: it leaves for an object when it fills.
        return self._state_bytes - self._tail_bytes + added <= self.inline_state_bytes

    def _write_runs(self, state: QueueState, attempt: _Attempt) -> None:
        """Merge small runs and spill (when on), and write the runs this commit made: before
        the head, which must never refer to a run that is not stored. A try that did not land
        leaves them as orphans, deleted once a later try lands."""
        if self.spill_at is not None:
            key_for = functools.partial(run_key, state.doc.version, attempt.commit_id)
            self._merge_reads.hand_over(self._run_cache)
            self.metrics.runs_merged += state.merge_runs(key_for, self.run_jobs, MERGE_AT)
            state.spill(self.spill_at, key_for, run_jobs=self.run_jobs)
        for key, data in state.new_runs:
            self.store.write(key, data, if_absent=True)
            self._wrote(attempt, key, ("run", key))
        state.new_runs.clear()

    def _sweep(self, state: QueueState) -> None:
        """After a commit landed: look for orphan runs, and for garbage, when either is due."""
        self._sweep_runs(state)
        if self.sweeper is not None:
            self.sweeper.after_commit()

    def _sweep_runs(self, state: QueueState) -> None:
        """Now and then (first after this engine's first commit, so a process restarted after
        a crash cleans up after it), delete the runs no commit can refer to any more: those a
        process wrote before it died or lost its commit (:func:`orphan_runs`)."""
        if self.spill_at is None and not state.doc.has_runs():
            return
        now = time.monotonic()
        if now < self._next_run_sweep:
            return
        self._next_run_sweep = now + RUN_SWEEP_SECONDS
        version = state.doc.version
        referenced = state.doc.run_keys()

        def find() -> list[str]:
            return orphan_runs(self.store.list(RUNS_PREFIX), version, referenced)

        self._janitor.sweep(find, "orphan run")

    def _spare_holding(self, content: object) -> str | None:
        """The key of an object a failed try of this batch wrote with exactly ``content``."""
        for tried in self._failed_tries:
            for key, held in tried.contents.items():
                if held == content:
                    return key
        return None

    def _reuse(self, key: str, attempt: _Attempt) -> bool:
        """Let ``attempt`` refer to ``key``, if a failed try of this batch wrote it."""
        for tried in self._failed_tries:
            if key in tried.contents:
                self._wrote(attempt, key, tried.contents[key])
                return True
        return False

    @staticmethod
    def _wrote(attempt: _Attempt, key: str, content: object) -> None:
        attempt.written.append(key)
        attempt.contents[key] = content

    def _inline(self, job: Job) -> Job:
        """``job`` with its body in place, for an archive record that stands on its own."""
        try:
            return self.bodies.fill(job, inline=True)
        except ObjqError as exc:  # keep the reference rather than fail the commit
            log.warning("archiving job %s without its body: %s", job.id, exc)
            return job

    def _delete_quietly(self, key: str, what: str) -> None:
        self._janitor.delete_now(key, what)

    def _invalidate(self) -> None:
        self._state = None
        self._version = None
        self._synced_at = float("-inf")

    @staticmethod
    def _resolve(results: list[tuple[_Op, bool, Any]]) -> None:
        for op, ok, value in results:
            if op.future.done():
                continue
            if ok:
                op.future.set_result(value)
            else:
                op.future.set_exception(value)

    @staticmethod
    def _fail(ops: list[_Op], exc: BaseException) -> None:
        for op in ops:
            if not op.future.done():
                op.future.set_exception(exc)


def _cached(state: QueueState, ref: RunRef | KeyRunRef) -> bool:
    """Whether the run ``ref`` names has been read (a transition may use it)."""
    contents = state.run_contents if isinstance(ref, RunRef) else state.key_contents
    return ref.key in contents


def _unexpected(url: str, exc: Exception, unsure: bool) -> QueueError:
    """The error a batch fails with when its commit raised something objq does not expect;
    ``unsure``: an earlier try's write failed and may yet have landed."""
    landed = "; an earlier write of it may have landed" if unsure else ""
    error = QueueError(f"{url}: commit failed: {type(exc).__name__}: {exc}{landed}")
    error.__cause__ = exc
    return error
