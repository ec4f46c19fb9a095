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
  the commit id of every failed try of this batch in this writer's mark (``writers``: each
  writer's last commit, however many others committed since). Found: that try's
  saved results are the true ones. Not found: the batch is applied afresh, so an enqueue is
  never doubled and an ack never lost. A write that failed may still be in flight and land
  later (a timed-out PUT), so every failed try is remembered until the batch settles: at most
  one of them can land, since each expects the version the one before it found.
* **Corrupt or unknown state**, missing bucket, denied access: every op of the batch fails with
  that error at once, and the state object is left untouched.

:class:`Engine` is what callers use. It holds its parts, each the only owner of what it keeps:

* a :class:`~objq_broker.engine.loading.StateCache`: the cached state and the version a commit
  writes over, when to read it again, the runs read, and the store's reports of writes;
* a :class:`~objq_broker.engine.writing.TryWriter`: one try's objects and state written, the
  tidying after a commit, and the failed tries of the batch being committed;
* a :class:`~objq_broker.engine.batcher.Batcher`: the operations pending, the writer thread,
  and whether the engine is closing;
* a :class:`~objq_broker.engine.loop.CommitLoop`: that thread's work, taking batches and
  committing each with the retries and failure handling above; and a caller's commit of its
  own op, in its own thread, when nothing else is pending or committing.

Its defaults are in :mod:`~objq_broker.engine.base`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any, TypeVar

from objq_broker.engine.archive import DEFAULT_ARCHIVE_TAIL_BYTES
from objq_broker.engine.base import (
    DEFAULT_COMMIT_DEADLINE_SECONDS,
    DEFAULT_IDLE_TICK_SECONDS,
    DEFAULT_INLINE_STATE_BYTES,
    DEFAULT_MAX_BATCH_BYTES,
    DEFAULT_MAX_BATCH_OPS,
    DEFAULT_MAX_STALENESS_SECONDS,
    DEFAULT_SPILL_AT,
)
from objq_broker.engine.batch import (
    EngineMetrics,
    Listeners,
    Pending,
    Readiness,
    ReadyMark,
    Settles,
    StandingClaims,
)
from objq_broker.engine.batcher import Batcher
from objq_broker.engine.bodies import BodyCache
from objq_broker.engine.garbage import (
    DEFAULT_GC_INTERVAL_SECONDS,
    DEFAULT_OLDER_THAN_SECONDS,
    Sweeper,
)
from objq_broker.engine.guard import STATE_KEY
from objq_broker.engine.loading import StateCache
from objq_broker.engine.loop import CommitLoop
from objq_broker.engine.options import EngineLimits, check_engine_settings
from objq_broker.engine.parts import Forwarded
from objq_broker.engine.writing import TryWriter
from objq_broker.errors import WriterFenced
from objq_broker.model.encoding import DEFAULT_MAX_STATE_BYTES
from objq_broker.model.ops import Claim, Nothing, Op
from objq_broker.model.records import Job
from objq_broker.model.runs import MAX_RUN_JOBS
from objq_broker.storage.base import ObjectStore

T = TypeVar("T")


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
        self.store = store
        self.metrics = EngineMetrics()
        #: Payload bodies kept out of the state, cached by bodies object.
        self.bodies = bodies if bodies is not None else BodyCache(store)
        self._listeners = Listeners()
        self._cache = StateCache(
            store,
            key=key,
            metrics=self.metrics,
            epoch=epoch,
            exclusive=exclusive,
            clock=clock,
            max_staleness_seconds=max_staleness_seconds,
            max_state_bytes=max_state_bytes,
            on_change=self._listeners.tell,
        )
        self._writer = TryWriter(
            store,
            self._cache,
            self.bodies,
            self.metrics,
            archive=archive,
            archive_tail_bytes=archive_tail_bytes,
            inline_state_bytes=inline_state_bytes,
            spill_at=spill_at,
            run_jobs=run_jobs,
            gc_interval_seconds=gc_interval_seconds,
            gc_older_than_seconds=gc_older_than_seconds,
        )
        #: Operations waiting for the writer thread, which it takes a batch at a time.
        self._batcher: Batcher[Pending] = Batcher(
            f"objq-writer {store.url}",
            self._write_batches,
            size=_size,
            max_items=max_batch_ops,
            max_bytes=max_batch_bytes,
        )
        self._loop = CommitLoop(
            store,
            self._batcher,
            self._cache,
            self._writer,
            self.metrics,
            linger_seconds=linger_seconds,
            commit_deadline_seconds=commit_deadline_seconds,
            idle_tick_seconds=idle_tick_seconds,
            seed=seed,
            on_commit=self._listeners.tell,
        )

    def _write_batches(self) -> None:
        """The writer thread."""
        self._loop.run()

    def __repr__(self) -> str:
        role = "" if self.epoch is None else f", epoch={self.epoch}"
        return f"Engine({self.store.url!r}{role})"

    def submit(self, op: Op[T]) -> Future[T]:
        """Queue ``op`` for the next commit. Its class says how fresh the state must be
        (``fresh`` for claims, ``latest`` for inspection) and whether its caller consumes
        (which turns on idle lease expiry)."""
        future: Future[T] = Future()
        self.submit_to([(op, future)])
        return future

    def submit_to(self, items: list[tuple[Op[Any], Settles]]) -> None:
        """Queue the ops of ``items`` for the next commit; each outcome is settled with its
        op's result."""
        self._loop.submit_to(items)

    def call(self, op: Op[T]) -> T:
        """Commit ``op`` and wait until its effect is durable; return its result. When
        nothing else is pending or committing, the caller commits it in its own thread (see
        :meth:`CommitLoop.call`)."""
        return self._loop.call(op)

    def commit_here(self, items: list[tuple[Op[Any], Settles]]) -> bool:
        """Commit ``items`` as one batch in the caller's thread if nothing else is pending or
        committing and they fit in one (each outcome is settled when this returns True); else
        do nothing and return False. For an event loop on a store that never waits (memory):
        a commit there is work for the loop's own thread, and a hand-off to the writer and
        back would cost more than the commit."""
        return self._loop.commit_here(items)

    def claim_waiting(self, claim: Claim, wait_seconds: float) -> list[Job] | None:
        """None: an engine of its own has nobody to wait at; its caller claims and waits
        for commits itself."""
        return None

    def flush(self, timeout: float | None = None) -> None:
        """Wait until everything submitted so far is durable (or failed), and the objects
        its commits freed are deleted."""
        with self._batcher.cv:
            if self._batcher.thread is None:
                return
        self.submit(Nothing()).result(timeout)
        self._writer.wait_tidied(timeout)

    def on_commit(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (on the writer thread) after each batch; it must not block."""
        self._listeners.add(listener)

    def take_waiting_claims(self, source: StandingClaims) -> None:
        """Let each commit that readies jobs take claims waiting for them from ``source``."""
        self._loop.take_waiting_claims(source)

    def close(self, timeout: float | None = None) -> None:
        """Commit what is pending, then stop the writer thread."""
        with self._batcher.cv:
            self._batcher.close()
            thread = self._batcher.thread
        if thread is not None:
            thread.join(timeout)
        self._cache.close()
        self._writer.close()
        self.bodies.close()

    @property
    def closed(self) -> bool:
        return self._batcher.closing

    @property
    def readied(self) -> ReadyMark:
        """A mark that changes whenever a commit made jobs claimable, the state was read
        again, or the store reported a write to it: what tells a broker (or a queue) its
        waiting claimers have something to look for."""
        return self._cache.readied

    def readiness(self, queues: Iterable[str]) -> Readiness:
        """How many jobs each of ``queues`` has had made claimable, and when the next timed
        one comes due. Call it only from a commit listener: the engine's thread, between
        commits, when the state holds still."""
        state = self._cache.state
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
        stopped = self._loop.stopped
        return stopped if isinstance(stopped, WriterFenced) else None

    # --- the settings, each kept by the part that uses it --------------------------------

    key = Forwarded[str]("_cache", "The state object's key under the store's prefix.")

    @property
    def epoch(self) -> int | None:
        """The epoch this engine writes under (an elected broker's); None: not elected."""
        return self._cache.epoch

    @epoch.setter
    def epoch(self, epoch: int | None) -> None:
        self._cache.epoch = epoch

    exclusive = Forwarded[bool](
        "_cache", "Whether this engine is the namespace's only writer (a broker)."
    )
    clock = Forwarded[Callable[[], float]]("_cache", "The wall clock the engine's commits go by.")
    max_staleness_seconds = Forwarded[float](
        "_cache", "How old the cached state may be before a claim or a read fetches it again."
    )
    max_state_bytes = Forwarded[int]("_cache", "The largest state this engine reads or writes.")
    archive = Forwarded[bool](
        "_writer", "Whether finished jobs are archived (False: their records are dropped)."
    )
    archive_tail_bytes = Forwarded[int](
        "_writer",
        "How large the archive tail kept in the state grows before it leaves for an object.",
    )
    inline_state_bytes = Forwarded[int](
        "_writer", "Below this size of the state, large payloads stay in it."
    )
    spill_at = Forwarded[int | None](
        "_writer", "How many jobs a queue keeps in the state's head before they move to runs."
    )
    run_jobs = Forwarded[int]("_writer", "Most jobs in one run.")
    sweeper = Forwarded[Sweeper | None](
        "_writer",
        "Collects unreferenced objects now and then (``docs/deploy.md``); None: never.",
    )
    linger_seconds = Forwarded[float](
        "_loop",
        "How long a batch waits to fill (0: as long as the callers of the last one take).",
    )
    commit_deadline_seconds = Forwarded[float](
        "_loop",
        "How long a batch keeps retrying storage errors and conflicts before its ops fail.",
    )
    idle_tick_seconds = Forwarded[float](
        "_loop",
        "How often an idle consumer engine looks for stale leases to expire (at first).",
    )


def _size(pending: Pending) -> int:
    return pending.size
