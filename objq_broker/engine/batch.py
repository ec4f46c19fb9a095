"""What the engine's commits are made of: the operations pending with their futures, one try
at committing a batch, the marks and counts that tell claimers jobs are ready, the claims a
broker parks at its engine, and the counters every engine keeps."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

from objq_broker.engine.timings import Durations
from objq_broker.model.ops import Op
from objq_broker.model.tally import JOB_EVENTS
from objq_broker.model.values import Finished

#: What :attr:`Engine.readied` returns: the cached state's identity, the count of jobs it
#: readied, and the count of writes to it the store reported.
ReadyMark = tuple[int, int, int]
NOT_READIED: ReadyMark = (0, -1, 0)


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
class Pending:
    """An operation waiting in (or taken into) a batch, with the future its caller waits on."""

    op: Op[Any]
    future: Future[Any]
    fresh: bool
    latest: bool
    size: int
    consumer: bool

    @classmethod
    def of(cls, op: Op[Any], future: Future[Any]) -> Pending:
        """``op`` as a batch holds it: its class says how fresh the state must be (``fresh``
        for claims, ``latest`` for inspection) and whether its caller consumes."""
        return cls(op, future, op.fresh or op.latest, op.latest, op.size, op.consumer)


@dataclass
class Attempt:
    """One try at committing a batch, kept so an ambiguous write can be resolved."""

    commit_id: str
    results: list[tuple[Pending, bool, Any]]
    finished: list[Finished] = field(default_factory=list)
    #: Objects this attempt wrote (or reused) before the state: orphans if another try lands.
    written: list[str] = field(default_factory=list)
    #: What each of those objects holds, so a retry that would write the same reuses it.
    contents: dict[str, object] = field(default_factory=dict)
    #: Leases this try's state expired on its own (beside what its operations did).
    expired: int = 0
