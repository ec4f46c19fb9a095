"""The cached state and a batch applied to it: when to read the state again (a conflict, a
report of another writer, staleness for claims, an inspection), the runs a batch needs read
first, and the claims waiting at a broker joined into the commit that readies their jobs."""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from objq_broker.engine.batch import Attempt, Pending
from objq_broker.engine.runs import check_staged, read_runs
from objq_broker.engine.writing import StateWriter
from objq_broker.errors import ObjqError, PreconditionFailed, WriterFenced
from objq_broker.model.encoding import decode_state
from objq_broker.model.ops import EnqueueRuns, Op, Session, runs_needed
from objq_broker.model.records import KeyRunRef, RunRef
from objq_broker.model.state import QueueState

log = logging.getLogger("objq_broker.engine")

#: How long an exclusive engine (a broker) trusts its cached state without a write: it reads
#: again after this long idle, to see a direct writer's changes or a successor's epoch (and
#: at once for an inspection, such as ``stats``).
EXCLUSIVE_RECHECK_SECONDS = 30.0
#: How many runs an engine keeps read beyond those its current batch needs.
RUN_CACHE_SIZE = 16


class StateLoader(StateWriter):
    """The layer of :class:`~objq_broker.engine.commit.Engine` that keeps the state cached and
    applies batches to it."""

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

    def _invalidate(self) -> None:
        self._state = None
        self._version = None
        self._synced_at = float("-inf")

    def _apply(self, state: QueueState, ops: list[Pending]) -> Attempt | None:
        now = self.clock()
        self._read_runs(state, ops, now)
        waiting = self._standing.waiting_on() if self._standing is not None else ()
        before = {name: state.readied_in.get(name, 0) for name in waiting}
        results: list[tuple[Pending, bool, Any]] = []
        for op in ops:
            if not self._apply_one(state, op, now, results):
                ops.remove(op)
                return None
        expired = state.expire(now)
        if before and not self._join_waiting_claims(state, ops, results, before, now):
            return None
        return Attempt(uuid.uuid4().hex, results, finished=list(state.finished), expired=expired)

    def _apply_one(
        self, state: QueueState, op: Pending, now: float, results: list[tuple[Pending, bool, Any]]
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
        ops: list[Pending],
        results: list[tuple[Pending, bool, Any]],
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
            joined = Pending.of(op, future)
            ops.append(joined)
            if not self._apply_one(state, joined, now, results):
                ops.remove(joined)
                return False
        return True

    def _read_runs(self, state: QueueState, ops: list[Pending], now: float) -> None:
        """Read the runs ``ops`` may take from or look into, so the model stays pure. The
        cache keeps the runs read last (runs never change), up to :data:`RUN_CACHE_SIZE`
        besides those this batch needs."""
        needed = runs_needed(state, [op.op for op in ops], now)
        keep = {ref.key for _, ref in needed}
        for cache in (self._run_cache, self._key_cache):
            spare = [k for k in cache if k not in keep]
            for key in spare[: max(len(cache) - RUN_CACHE_SIZE, 0)]:
                del cache[key]  # the oldest read first
        missing, broken = read_runs(self.store, state, needed) if needed else ([], {})
        state.unreadable_runs = self._check_staged(ops)
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

    def _check_staged(self, ops: list[Pending]) -> dict[str, str]:
        """Why each run a staged write of ``ops`` names cannot be added (see
        :func:`~objq_broker.engine.runs.check_staged`)."""
        unreadable: dict[str, str] = {}
        for pending in ops:
            inner = pending.op.ops if isinstance(pending.op, Session) else [pending.op]
            for op in inner:
                if isinstance(op, EnqueueRuns):
                    unreadable |= check_staged(self.store, op.queue, op.runs)
        return unreadable


def _cached(state: QueueState, ref: RunRef | KeyRunRef) -> bool:
    """Whether the run ``ref`` names has been read (a transition may use it)."""
    contents = state.run_contents if isinstance(ref, RunRef) else state.key_contents
    return ref.key in contents
