"""The writer thread: it takes a batch (lingering for the callers the last commit released,
and keeping to the namespace's write budget), commits it with retries, and resolves its futures
only once the state that holds their effect is stored. The failure handling is described in
:mod:`~objq_broker.engine.commit`.

:class:`CommitLoop` drives the engine's other parts: it takes batches from the
:class:`~objq_broker.engine.batcher.Batcher`, asks the
:class:`~objq_broker.engine.loading.StateCache` for the state of each try, applies the batch to
it (:func:`~objq_broker.engine.applying.apply_batch`) and hands the try to the
:class:`~objq_broker.engine.writing.TryWriter`."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

from objq_broker.engine.applying import apply_batch
from objq_broker.engine.batch import (
    Attempt,
    EngineMetrics,
    Pending,
    Settles,
    StandingClaims,
    Waiter,
)
from objq_broker.engine.batcher import Batcher
from objq_broker.engine.budget import budget_wait
from objq_broker.engine.loading import StateCache
from objq_broker.engine.oversize import StateTooLarge, refuse_largest
from objq_broker.engine.writing import TryWriter
from objq_broker.errors import (
    AccessDenied,
    BucketNotFound,
    ConfigurationError,
    ObjqError,
    PreconditionFailed,
    QueueClosed,
    QueueError,
    StateCorrupt,
    StateFull,
    StorageError,
    StorageUnavailable,
    WriterFenced,
)
from objq_broker.model.backoff import backoff_seconds
from objq_broker.model.ops import Nothing, Op, Read, Session, SetWriteBudget
from objq_broker.model.state import QueueState
from objq_broker.model.tally import job_events
from objq_broker.storage.base import ObjectStore

T = TypeVar("T")
log = logging.getLogger("objq_broker.engine")

#: Longest pause before retrying after a conflict (jitter, so losers do not collide again).
CONFLICT_JITTER_SECONDS = 0.003
#: For this long after a conflict, another writer is taken to be active: each commit reads
#: the state before writing (a read that finds it unchanged costs no decode) instead of
#: writing blind on its cached copy, losing, and reading anyway.
CONTENDED_SECONDS = 1.0
#: Longest adaptive wait for a batch to fill (see ``CommitLoop._linger``).
ADAPTIVE_LINGER_MAX_SECONDS = 0.02
#: Longest interval between an idle consumer engine's looks for stale leases.
MAX_IDLE_TICK_SECONDS = 16.0
#: Why a batch that adds nothing still cannot be stored.
_NO_ROOM = (
    "though nothing in its batch adds to it: raise max_state_bytes for every process, or "
    "restore the state from a backup"
)
#: Errors that no retry can fix: fail the batch at once (a store's SDK refusing the bucket
#: name or endpoint is a ``ConfigurationError``).
_FATAL = (StateCorrupt, AccessDenied, BucketNotFound, WriterFenced, ConfigurationError)


class CommitLoop:
    """The writer thread of an :class:`~objq_broker.engine.commit.Engine`: :meth:`run` is
    the work of its ``batcher``.

    ``linger_seconds``: how long a batch waits to fill (0: adapt, see :meth:`_linger`).
    ``commit_deadline_seconds``: how long a batch keeps retrying storage errors and conflicts
    before its ops fail. ``idle_tick_seconds``: how often an idle consumer engine looks for
    stale leases to expire (at first). ``seed``: of the retry jitter. ``on_commit``: called
    after each batch."""

    def __init__(
        self,
        store: ObjectStore,
        batcher: Batcher[Pending],
        cache: StateCache,
        writer: TryWriter,
        metrics: EngineMetrics,
        *,
        linger_seconds: float,
        commit_deadline_seconds: float,
        idle_tick_seconds: float,
        seed: int | None,
        on_commit: Callable[[], None],
    ) -> None:
        self.store = store
        self._batcher = batcher
        self._cache = cache
        self._writer = writer
        self.metrics = metrics
        self.linger_seconds = linger_seconds
        self.commit_deadline_seconds = commit_deadline_seconds
        self.idle_tick_seconds = idle_tick_seconds
        self._on_commit = on_commit
        self._rng = random.Random(seed)
        self._stopped: WriterFenced | QueueError | None = None
        self._consumer = False  # a consumer's op was seen: idle ticks expire leases
        self._standing: StandingClaims | None = None
        self._last_commit_seconds = 0.0
        self._committed_at = float("-inf")  # monotonic time the last commit ended
        self._idle_tick = idle_tick_seconds
        self._contended_until = 0.0  # monotonic time until which other writers seem active

    @property
    def stopped(self) -> WriterFenced | QueueError | None:
        """Why no op may be committed any more, if so: a writer with a newer epoch replaced
        this one (:class:`WriterFenced`), or something the writer thread did not expect
        stopped it."""
        return self._stopped

    def take_waiting_claims(self, source: StandingClaims) -> None:
        """Let each commit that readies jobs take claims waiting for them from ``source``."""
        self._standing = source

    def run(self) -> None:
        """Commit batch after batch, until the batcher is closed and drained."""
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
        with self._batcher.cv:
            if self._stopped is None:  # fenced before: that stays the reason
                self._stopped = broken
            pending = self._batcher.drain()
        self._fail(pending, broken)

    def _next_batch(self) -> list[Pending] | None:
        """Wait for work (or an idle tick) and take a batch; None when closed and drained."""
        batcher = self._batcher
        with batcher.cv:
            # A caller committing its own op (see ``commit_alone``) holds the batcher busy.
            while batcher.busy or not batcher.pending:
                if batcher.closing and not batcher.pending and not batcher.busy:
                    return None
                tick = None
                if self._consumer and not batcher.busy:
                    # An idle tick after the last commit, whoever made it (callers commit
                    # their own ops too, expiring leases as they do).
                    tick = max(self._committed_at + self._idle_tick - time.monotonic(), 0.0)
                woken = batcher.cv.wait(tick)
                if tick is None or woken or batcher.busy or batcher.pending:
                    continue
                if time.monotonic() < self._committed_at + self._idle_tick:
                    continue  # a caller committed while this waited: the tick starts over
                # Idle tick: expire stale leases. Each costs a read in direct mode, so they
                # grow sparser while nothing happens (claims expire leases too).
                self._idle_tick = min(self._idle_tick * 2, MAX_IDLE_TICK_SECONDS)
                batcher.begin()
                return []
            self._linger()
            self._keep_to_budget()
            return batcher.take()

    # --- what callers submit -------------------------------------------------------------

    def submit_to(self, items: list[tuple[Op[Any], Settles]]) -> None:
        """Queue the ops of ``items`` for the writer; each outcome is settled with its op's
        result."""
        batch = [Pending(op, outcome) for op, outcome in items]  # (read outside the lock)
        with self._batcher.cv:
            self.check_open()
            self._batcher.add(*batch)

    def call(self, op: Op[T]) -> T:
        """Commit ``op`` and wait until its effect is durable; return its result. When
        nothing else is pending or committing, the caller commits it in its own thread:
        there is no batch to form, and handing it to the writer thread and back would cost
        two thread switches."""
        future: Waiter[T] = Waiter()
        self._commit_alone([Pending(op, future)], else_queue=True)
        return future.result()

    def commit_here(self, items: list[tuple[Op[Any], Settles]]) -> bool:
        """Commit ``items`` as one batch in the caller's thread if nothing else is pending or
        committing and they fit in one (each outcome is settled when this returns True); else
        do nothing and return False."""
        batch = [Pending(op, outcome) for op, outcome in items]
        batcher = self._batcher
        if len(batch) > batcher.max_items or sum(p.size for p in batch) > batcher.max_bytes:
            return False
        return self._commit_alone(batch, else_queue=False)

    def check_open(self) -> None:
        """Why no op may be submitted now, if so (holding the batcher's ``cv``)."""
        if self._stopped is not None:
            raise self._stopped
        if self._batcher.closing:
            raise QueueClosed(f"the engine for {self.store.url} is closed")

    def _commit_alone(self, batch: list[Pending], *, else_queue: bool) -> bool:
        """Commit ``batch`` in the caller's thread when the engine is idle (True); else queue
        it for the writer (``else_queue``) or leave it (False). Not under a write budget (the
        writer keeps to it), nor before the state was first read."""
        batcher = self._batcher
        with batcher.cv:
            self.check_open()
            state = self._cache.state
            alone = (
                state is not None
                and state.doc.write_budget is None
                and batcher.take_nothing_alone(len(batch))
            )
            if not alone and else_queue:
                batcher.add(*batch)
        if not alone:
            return False
        # What is submitted meanwhile waits for the writer.
        try:
            self._commit(batch)
        except BaseException as exc:  # an interrupted caller: the writer itself goes on
            log.warning("a commit on %s was interrupted: %r", self.store.url, exc)
            raise
        return True

    def _linger(self) -> None:
        """Let a batch fill before committing it (called holding the batcher's ``cv``).

        With ``linger_seconds`` set, always wait that long (or for a full batch). Otherwise
        adapt: as many ops were pending or committing at once during the last commit; the
        callers it released are still submitting their next ones, so wait (two commits' time
        at most, and at most ``ADAPTIVE_LINGER_MAX_SECONDS``) for all of them. 50 threads make
        batches of ~50, not 48 then 2, and a broker's clients, whose sessions come back after
        a network round trip each, share one commit instead of taking turns (waiting up to
        two commits measured best for 8 clients). One caller never waits.
        """
        batcher = self._batcher
        if batcher.closing:
            return
        if self.linger_seconds > 0:
            batcher.linger(self.linger_seconds, target=batcher.max_items)
        elif not batcher.full:
            span = min(ADAPTIVE_LINGER_MAX_SECONDS, 2 * self._last_commit_seconds)
            batcher.linger(span)

    def _keep_to_budget(self) -> None:
        """Under a write budget (``engine.budget``), wait until the namespace may write again
        before taking a batch that may write (called holding the batcher's ``cv``); what is
        submitted meanwhile joins the batch. Reads and flushes never wait, nor does changing
        the budget (lifting one of a write a minute must not take a minute)."""
        state = self._cache.state
        if state is None or state.doc.write_budget is None:
            return
        pending = self._batcher.pending
        if all(isinstance(op.op, Read | Nothing) for op in pending) or any(
            isinstance(op.op, SetWriteBudget) for op in pending
        ):
            return
        wait = budget_wait(
            state.doc.write_budget, last_commit=state.doc.committed_at, now=self._cache.clock()
        )
        end = time.monotonic() + wait
        while not self._batcher.closing and (remaining := end - time.monotonic()) > 0:
            self._batcher.cv.wait(remaining)

    def _commit(self, batch: list[Pending]) -> None:
        started = time.monotonic()
        if batch:  # work, by the writer or a caller: idle ticks start over at their shortest
            self._idle_tick = self.idle_tick_seconds
        if any(op.consumer for op in batch):
            self._consumer = True
        live = [op for op in batch if op.future.set_running_or_notify_cancel()]
        if len(live) > 1:
            # Claims last (a stable sort): a claim sees the jobs enqueued in its own batch, so
            # a claimer that found nothing is woken by the next commit, never left waiting.
            live.sort(key=_consumes)
        try:
            self._commit_with_retries(
                live,
                fresh=not batch or any(op.fresh for op in batch),
                latest=any(op.latest for op in batch),
            )
        except BaseException as exc:
            # Stopped mid-try (a signal in a caller committing its own op): the cache may hold
            # a half-applied state, and the ops joined to this batch would wait for ever.
            self._cache.invalidate()
            self._fail(live, QueueError(f"{self.store.url}: commit interrupted: {exc!r}"))
            raise
        finally:
            self.metrics.batches += 1
            self.metrics.ops += len(batch)
            self.metrics.max_batch_ops = max(self.metrics.max_batch_ops, len(batch))
            self._committed_at = time.monotonic()
            self._last_commit_seconds = self._committed_at - started
            self.metrics.commit_seconds_total += self._last_commit_seconds
            self.metrics.commit_durations.observe(self._last_commit_seconds)
            try:
                self._on_commit()
            finally:
                # After the listeners: they read the state between commits, before the next.
                self._batcher.done()

    def _commit_with_retries(self, live: list[Pending], *, fresh: bool, latest: bool) -> None:
        deadline = time.monotonic() + self.commit_deadline_seconds
        self._writer.start_batch()
        tries = 0
        while True:
            tries += 1
            started = time.monotonic()
            try:
                if self._try_commit(live, fresh, latest):
                    return
            # Each clause's variable has a name of its own: compiled (``setup.py``), a variable
            # keeps the type of the clause that first binds it.
            except _FATAL as final:
                self._cache.invalidate()
                if isinstance(final, WriterFenced):
                    self._stopped = final
                self._fail(live, final)
                return
            except (PreconditionFailed, StorageError) as failure:
                deadline = self._note_failure(failure, deadline)
                # A try as slow as this one (a storage call that timed out) would end past the
                # deadline: fail now rather than that late. Conflicts are quick to retry.
                conflict = isinstance(failure, PreconditionFailed)
                took = 0.0 if conflict else time.monotonic() - started
                if time.monotonic() + took >= deadline:
                    self._fail(live, self._deadline_error(failure, tries))
                    return
                if conflict:
                    # Re-read and go again: waiting longer only hands the lead to the others.
                    pause = self._rng.random() * CONFLICT_JITTER_SECONDS
                else:
                    pause = backoff_seconds(tries, 0.005, 1.0, self._rng.random())
                time.sleep(min(pause, max(deadline - time.monotonic(), 0.0)))
            except Exception as crash:
                # Not an objq error: a bug, or an SDK error objq does not translate. The try
                # may have been half applied: read afresh and try again, as after a storage
                # error, and fail the batch (never the writer) once its deadline has passed.
                log.warning(
                    "commit on %s failed unexpectedly, retrying", self.store.url, exc_info=True
                )
                self._cache.invalidate()
                if time.monotonic() >= deadline:
                    self._fail(live, _unexpected(self.store.url, crash, self._writer.in_doubt))
                    return
                time.sleep(
                    min(
                        backoff_seconds(tries, 0.005, 1.0, self._rng.random()),
                        max(deadline - time.monotonic(), 0.0),
                    )
                )

    def _make_room(self, live: list[Pending], exc: StateTooLarge) -> None:
        """After a try whose state was too large: refuse what grew it
        (:func:`~objq_broker.engine.oversize.refuse_largest`). When nothing left in ``live``
        adds to the state, fail it all (``live`` is emptied)."""
        self._cache.invalidate()
        if refuse_largest(live, exc, self.store.url) == 0:  # no try can do better
            self._fail(live, StateFull(f"{self.store.url}: {exc}, {_NO_ROOM}"))
            live.clear()

    def _note_failure(self, exc: StorageError, deadline: float) -> float:
        """Count a failed try and drop the cache; returns the batch's deadline, restarted when
        the previous conflict turned out to be another writer's progress."""
        if isinstance(exc, PreconditionFailed):
            self._cache.lost_race()
            self._contended_until = time.monotonic() + CONTENDED_SECONDS
            self.metrics.conflicts += 1
        else:
            self.metrics.storage_errors += 1
            log.warning("storage error on %s, retrying: %s", self.store.url, exc)
        self._cache.invalidate()
        if self._cache.others_moved():
            return time.monotonic() + self.commit_deadline_seconds
        return deadline

    def _try_commit(self, live: list[Pending], fresh: bool, latest: bool) -> bool:
        """One try; True when every op is settled, False to try again at once."""
        writer = self._writer
        contended = not self._cache.exclusive and time.monotonic() < self._contended_until
        state = self._cache.load(force=writer.in_doubt, fresh=fresh, latest=latest or contended)
        landed = writer.landed_in(state)
        if landed is not None:
            log.info("commit %s landed although its write failed", landed.commit_id)
            self._settled(landed)
            return True
        attempt = self._apply(state, live)
        if attempt is None:
            return False  # an op crashed: it was failed and dropped; start again
        if state.dirty:
            try:
                writer.write(state, attempt)
            except StateTooLarge as too_large:
                self._make_room(live, too_large)
                return not live  # settled when nothing is left to commit
            except StorageError as failure:
                # Even a refused condition may hide a landed write: an SDK that retried a
                # timed-out PUT gets 412 from its own first attempt. Look before re-applying.
                if not isinstance(failure, _FATAL):
                    writer.failed(attempt)
                raise
        self._settled(attempt)
        return True

    def _apply(self, state: QueueState, live: list[Pending]) -> Attempt | None:
        """Apply ``live`` (with the runs it needs read first) as one try; None when an op
        crashed (it was failed and dropped, and the state is read again)."""
        now = self._cache.clock()
        self._cache.read_runs(state, live, now)
        attempt = apply_batch(state, live, now, self._standing)
        if attempt is None:
            self._cache.invalidate()
        return attempt

    def _settled(self, landed: Attempt) -> None:
        """``landed`` is the try whose state is stored: resolve its results, and delete what
        the other tries wrote ahead of theirs (none of them can land on top of it)."""
        self._resolve(landed.results)
        self._tally(landed)
        self._writer.settled(landed)

    def _tally(self, landed: Attempt) -> None:
        """Count what the landed try did to jobs. A broker's sessions are left out: each
        client counts its own operations from the outcomes it gets back."""
        try:
            if landed.expired:
                self.metrics.count({"expired": landed.expired})
            for op, ok, value in landed.results:
                if ok and not isinstance(op.op, Session):
                    self.metrics.count(job_events(op.op, value))
        except Exception:  # a counter must never fail a commit that landed
            log.exception("counting a commit's job events failed")

    def _deadline_error(self, exc: Exception, tries: int) -> ObjqError:
        what = (
            "could not confirm whether the last write landed"
            if self._writer.in_doubt
            else "gave up"
        )
        # Whatever the last try met (a timeout, or a race lost after a slow write), the
        # storage could not take the commit in time: a transient storage error.
        return StorageUnavailable(
            f"{self.store.url}: commit {what} after {tries} tries in "
            f"{self.commit_deadline_seconds:g} s; last error: {exc}"
        )

    @staticmethod
    def _resolve(results: list[tuple[Pending, bool, Any]]) -> None:
        for op, ok, value in results:
            if op.future.done():
                continue
            if ok:
                op.future.set_result(value)
            else:
                op.future.set_exception(value)

    @staticmethod
    def _fail(ops: list[Pending], exc: BaseException) -> None:
        for op in ops:
            if not op.future.done():
                op.future.set_exception(exc)


def _consumes(op: Pending) -> bool:
    return op.consumer


def _unexpected(url: str, exc: Exception, unsure: bool) -> QueueError:
    """The error a batch fails with when its commit raised something objq does not expect;
    ``unsure``: an earlier try's write failed and may yet have landed."""
    landed = "; an earlier write of it may have landed" if unsure else ""
    error = QueueError(f"{url}: commit failed: {type(exc).__name__}: {exc}{landed}")
    error.__cause__ = exc
    return error
