"""What the engine's commits are made of: the operations pending with their futures, one try
at committing a batch, the marks and counts that tell claimers jobs are ready, the claims a
broker parks at its engine, and the counters every engine keeps."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field, fields
from typing import Any, Generic, Protocol, TypeVar

from objq_broker.engine.timings import Durations
from objq_broker.model.ops import Op
from objq_broker.model.tally import JOB_EVENTS
from objq_broker.model.values import Finished

#: What :attr:`Engine.readied` returns: the cached state's identity, the count of jobs it
#: readied, and the count of writes to it the store reported.
ReadyMark = tuple[int, int, int]
NOT_READIED: ReadyMark = (0, -1, 0)
log = logging.getLogger("objq_broker.engine")


class Listeners:
    """The callables an engine calls after each commit, and when its store reports a write
    to the state (on the writer's, a caller's or the store's thread)."""

    def __init__(self) -> None:
        self._listeners: list[Callable[[], None]] = []

    def add(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def tell(self) -> None:
        """Call each listener; one that raises must stop neither the others nor the commit."""
        for listener in self._listeners:
            try:
                listener()
            except Exception:
                log.exception("a commit listener failed")


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
        # Its fields by name, not its ``__dict__``: a compiled build's instances have none.
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "commit_durations"}

    def count(self, events: Mapping[str, int]) -> None:
        """Add job events (names of :data:`~objq_broker.model.tally.JOB_EVENTS`)."""
        for name, n in events.items():
            setattr(self, name, getattr(self, name) + n)

    def add_job_events(self, other: EngineMetrics) -> None:
        """Add ``other``'s job events to these."""
        self.count({name: getattr(other, name) for name in JOB_EVENTS})


T = TypeVar("T")


class Settles(Protocol):
    """What the commit loop does with the future of a pending operation: a
    :class:`~concurrent.futures.Future`'s, or a :class:`Waiter`'s."""

    def set_running_or_notify_cancel(self) -> bool: ...

    def done(self) -> bool: ...

    def set_result(self, result: Any) -> None: ...

    def set_exception(self, exception: BaseException | None) -> None: ...


class Waiter(Generic[T]):
    """What a caller blocked on its own operation (``Engine.call``) waits on: the part of a
    :class:`~concurrent.futures.Future` the commit loop uses, on one lock. A future's
    condition, with its re-entrant lock, waiter list and callbacks, cost more per operation
    than the operation's share of a commit, with fifty threads calling. One thread waits, one
    settles it, once; it cannot be cancelled."""

    __slots__ = ("_done", "_error", "_settled", "_value")

    def __init__(self) -> None:
        self._settled = threading.Lock()
        self._settled.acquire()  # released once settled: the waiter's acquire returns then
        self._done = False
        self._value: Any = None
        self._error: BaseException | None = None

    def set_running_or_notify_cancel(self) -> bool:
        return True

    def done(self) -> bool:
        return self._done

    def set_result(self, result: Any) -> None:
        self._value = result
        self._settle()

    def set_exception(self, exception: BaseException | None) -> None:
        self._error = exception
        self._settle()

    def _settle(self) -> None:
        if self._done:
            raise InvalidStateError("an operation's outcome was settled twice")
        self._done = True
        self._settled.release()

    def result(self) -> T:
        """The outcome, once settled (raised if it is an error)."""
        self._settled.acquire()
        self._settled.release()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[no-any-return]


class Pending:
    """An operation waiting in (or taken into) a batch, with the future its caller waits on.
    Its op's class says how fresh the state must be (``fresh`` for claims, ``latest`` for
    inspection) and whether its caller consumes."""

    # A plain class, not a dataclass: compiled (``setup.py``), its constructor is then native
    # too, and one is made for every operation.
    __slots__ = ("consumer", "fresh", "future", "latest", "op", "size")

    def __init__(self, op: Op[Any], future: Settles) -> None:
        self.op, self.future = op, future
        self.fresh = op.fresh or op.latest
        self.latest = op.latest
        self.size = op.size
        self.consumer = op.consumer


class Attempt:
    """One try at committing a batch, kept so an ambiguous write can be resolved. (A plain
    class, as :class:`Pending` is: one is made for every commit.)"""

    def __init__(
        self,
        commit_id: str,
        results: list[tuple[Pending, bool, Any]],
        *,
        finished: list[Finished],
        expired: int,
    ) -> None:
        self.commit_id = commit_id
        self.results = results
        self.finished = finished
        #: Objects this attempt wrote (or reused) before the state: orphans if another try
        #: lands.
        self.written: list[str] = []
        #: What each of those objects holds, so a retry that would write the same reuses it.
        self.contents: dict[str, object] = {}
        #: Leases this try's state expired on its own (beside what its operations did).
        self.expired = expired
