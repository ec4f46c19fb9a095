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

The class is built in layers, a module each (:mod:`~objq_broker.engine.base` lists them); this
module holds what callers use.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import TypeVar

from objq_broker.engine.batch import NOT_READIED, Pending, Readiness, ReadyMark, StandingClaims
from objq_broker.engine.loop import CommitLoop
from objq_broker.errors import QueueClosed, WriterFenced
from objq_broker.model.ops import Claim, Nothing, Op
from objq_broker.model.records import Job

T = TypeVar("T")


class Engine(CommitLoop):
    """Batches queue operations into conditional writes of one state object.

    >>> from objq_broker.model.ops import Declare
    >>> from objq_broker.storage import MemoryStore
    >>> engine = Engine(MemoryStore())
    >>> engine.call(Declare("emails"))
    True
    >>> engine.close()
    """

    def submit(self, op: Op[T]) -> Future[T]:
        """Queue ``op`` for the next commit. Its class says how fresh the state must be
        (``fresh`` for claims, ``latest`` for inspection) and whether its caller consumes
        (which turns on idle lease expiry)."""
        future: Future[T] = Future()
        pending = Pending.of(op, future)  # (its properties are read outside the lock)
        with self._batcher.cv:
            if self._fenced is not None:
                raise self._fenced
            if self._broken is not None:
                raise self._broken
            if self._closing:
                raise QueueClosed(f"the engine for {self.store.url} is closed")
            self._batcher.add(pending)
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
        with self._batcher.cv:
            if self._batcher.thread is None:
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
        with self._batcher.cv:
            self._closing = True
            self._batcher.cv.notify()
            thread = self._batcher.thread
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
