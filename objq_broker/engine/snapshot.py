"""A read-only view of a namespace: the state object read once, decoded, never written.

Inspecting (``objq status``, ``jobs``, ``dead list``, the Spark reader) reads through this, not
through the commit loop: looking at a queue must never change it, and a state that cannot be
decoded is reported with its key and left exactly as it is. This module and
:mod:`~objq_broker.engine.commit` are the only readers of ``state.json``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from objq_broker.engine.bodies import BodyCache
from objq_broker.engine.guard import STATE_KEY, StateGuard
from objq_broker.engine.runs import read_into, read_runs
from objq_broker.model.encoding import decode_state
from objq_broker.model.records import (
    ArchiveRecord,
    BrokerRecord,
    Job,
    JobState,
    QueueConfig,
    RunRef,
)
from objq_broker.model.state import QueueState
from objq_broker.model.values import QueueStats
from objq_broker.model.workers import Worker
from objq_broker.storage import ObjectStore

#: How many times a listing reads the state again when runs it refers to were consumed
#: meanwhile (workers taking jobs while someone looks at the queue).
RUN_READ_TRIES = 5
#: Which runs a listing needs, from the state it reads them for.
_Needs = Callable[[QueueState], list[tuple[str, RunRef]]]

#: Broker clients that committed this recently count as active: one quiet for longer is most
#: likely gone (what ``objq status`` and the metrics report).
ACTIVE_CLIENT_SECONDS = 600.0


@dataclass(frozen=True)
class StateSummary:
    """The namespace's state at one read, its queues aside: what the dashboard's overview
    and a metrics scrape both show of it (:meth:`Snapshot.summary`)."""

    #: False until something was ever committed (the state object does not exist yet).
    exists: bool
    #: The state's version: how many commits made it, by every process of the namespace.
    version: int
    size_bytes: int
    #: Unix time of the last commit (the writer's clock); None before the first.
    committed_at: float | None
    #: Unix time of the read (this process's clock).
    read_at: float
    #: How many jobs were ever put into the namespace's queues (see
    #: :attr:`Snapshot.enqueued_total`).
    enqueued_total: int
    #: How many times a broker took over the namespace.
    epoch: int
    #: The elected broker holding the namespace, if any.
    broker: BrokerRecord | None
    #: Broker clients that changed the state within :data:`ACTIVE_CLIENT_SECONDS`.
    active_clients: int
    #: Finished jobs whose archive records the state still holds (``engine.archive``).
    archive_tail_records: int

    @property
    def last_commit_age_seconds(self) -> float | None:
        """Seconds between the last commit and the read (never negative: clocks differ)."""
        if self.committed_at is None:
            return None
        return max(self.read_at - self.committed_at, 0.0)


@dataclass
class Snapshot:
    """The state of one store at one moment, with the stored object's version and size.

    >>> from objq_broker.storage import MemoryStore
    >>> Snapshot.read(MemoryStore()).queue_names()
    []
    """

    store: ObjectStore
    _state: QueueState
    size_bytes: int
    read_at: float
    exists: bool
    bodies: BodyCache = field(init=False)

    def __post_init__(self) -> None:
        self.bodies = BodyCache(self.store)  # one bodies object holds many jobs' payloads

    @classmethod
    def read(cls, store: ObjectStore) -> Snapshot:
        blob = store.read(STATE_KEY)
        if blob is None:  # a state deleted is not a new namespace; one created meanwhile is
            blob = StateGuard(store, STATE_KEY).missing()
        if blob is None:
            return cls(store, QueueState(), 0, time.time(), exists=False)
        doc = decode_state(blob.data, f"state {store.url}/{STATE_KEY}")
        return cls(store, QueueState(doc), len(blob.data), time.time(), exists=True)

    # --- the namespace ---------------------------------------------------------------------

    @property
    def version(self) -> int:
        """How many commits made this state (0: none yet)."""
        return self._state.doc.version

    @property
    def archive_tail(self) -> list[ArchiveRecord]:
        """The newest archive records, kept in the state until they fill an object
        (:mod:`~objq_broker.engine.archive`), oldest first."""
        tail = self._state.doc.archive_tail
        return [] if tail is None else list(tail.records)

    @property
    def committed_at(self) -> float | None:
        return self._state.doc.committed_at or None

    @property
    def write_budget(self) -> float | None:
        """The namespace's write budget in state writes per second (``engine.budget``)."""
        return self._state.doc.write_budget

    @property
    def broker(self) -> BrokerRecord | None:
        """The elected broker holding the namespace, if any."""
        return self._state.doc.broker

    @property
    def broker_writes(self) -> int:
        """How many commits the broker holding the record has written (see ``StateDoc``)."""
        return self._state.doc.broker_writes

    def broker_clients(self, within_seconds: float = ACTIVE_CLIENT_SECONDS) -> int:
        """How many broker clients changed the state within the last ``within_seconds``."""
        cutoff = self.read_at - within_seconds
        return sum(1 for mark in self._state.doc.sessions.values() if mark.at >= cutoff)

    def broker_sessions(self) -> list[tuple[str, float]]:
        """The broker clients whose last request the state remembers, with when it changed
        the state, latest first."""
        marks = self._state.doc.sessions.items()
        return sorted(((client, mark.at) for client, mark in marks), key=lambda s: -s[1])

    @property
    def enqueued_total(self) -> int:
        """How many jobs were ever put into the namespace's queues (a dead letter sent back
        counts again): the counter that numbers them, which only grows."""
        return self._state.doc.seq

    @property
    def epoch(self) -> int:
        """How many times a broker took over the namespace."""
        return self._state.doc.epoch

    def summary(self) -> StateSummary:
        """The namespace's facts besides its queues, as of this read."""
        return StateSummary(
            exists=self.exists,
            version=self.version,
            size_bytes=self.size_bytes,
            committed_at=self.committed_at,
            read_at=self.read_at,
            enqueued_total=self.enqueued_total,
            epoch=self.epoch,
            broker=self.broker,
            active_clients=self.broker_clients(ACTIVE_CLIENT_SECONDS),
            archive_tail_records=len(self.archive_tail),
        )

    @property
    def referenced_bodies(self) -> set[str]:
        """Keys of the bodies objects that jobs of this state refer to."""
        return set(self._state.doc.bodies)

    @property
    def referenced_runs(self) -> set[str]:
        """Keys of the runs this state refers to, of every kind."""
        return self._state.doc.run_keys()

    def queue_names(self) -> list[str]:
        return self._state.queue_names()

    def config(self, queue: str) -> QueueConfig:
        return self._state.config(queue)

    def stats(self, queue: str) -> QueueStats:
        # Timed runs with jobs due are read to count them ready: delayed jobs of a deep
        # backlog that came due since the last commit.
        self._read(lambda state: [(q, r) for q, r in state.due_runs(self.read_at) if q == queue])
        return self._state.stats(queue, self.read_at)

    # --- jobs ------------------------------------------------------------------------------

    def jobs(
        self, queue: str, state: JobState | None = None, limit: int | None = None
    ) -> list[tuple[JobState, Job]]:
        """Jobs of ``queue`` in claim order (dead letters last), payloads not loaded."""
        self._read(lambda s: [*s.runs_of(queue), *s.dead_runs_of(queue)])
        return self._state.list_jobs(queue, self.read_at, state, limit)

    def find(self, job_id: str) -> tuple[JobState, Job] | None:
        self._read(lambda s: [*s.runs_of(), *s.dead_runs_of()])
        return self._state.find(job_id, self.read_at)

    def _read(self, needs: _Needs) -> None:
        """Read the runs ``needs`` names (several at once). A run consumed since the state was
        read means workers moved on: this snapshot then reads the state again, becoming a
        view of a later moment, and reads what that one refers to."""
        for _ in range(RUN_READ_TRIES):
            missing, broken = read_runs(self.store, self._state, needs(self._state))
            for key, reason in broken.items():  # never readable: shown without it
                self._state.lose_run(key, reason, self.read_at)
            if not missing:
                return
            later = Snapshot.read(self.store)
            later._state.run_contents = self._state.run_contents  # runs never change
            self._state, self.size_bytes, self.read_at = (
                later._state,
                later.size_bytes,
                later.read_at,
            )
            self.exists = later.exists
        # Still referred to after as many reads: lost, as the next commit will find them.
        for key in missing:
            self._state.lose_run(key, "storage holds no such object", self.read_at)

    def dead_letters(self, queue: str) -> list[Job]:
        self._read(lambda s: s.dead_runs_of(queue))
        return self._state.dead_letters(queue)

    def all_live(self) -> Iterator[tuple[JobState, Job]]:
        """Every job not yet finished, of every queue (those waiting in runs included), in
        no order."""
        self._read(lambda s: s.runs_of())
        for job in [*self._state.jobs.values(), *self._state.run_jobs()]:
            yield job.state_at(self.read_at), job

    def all_dead(self) -> Iterator[Job]:
        """Every dead letter of every queue (those in dead runs included), in no order."""
        self._read(lambda s: s.dead_runs_of())
        for queue in self._state.queue_names():
            yield from self._state.dead_letters(queue)

    # --- reading in parts (the Spark tables: the head on one task, the runs on others) -----

    def head_live(self) -> list[tuple[JobState, Job]]:
        """The jobs not yet finished that the head holds (not those waiting in runs)."""
        return [(job.state_at(self.read_at), job) for job in self._state.jobs.values()]

    def head_dead(self) -> list[Job]:
        """The dead letters the head holds (not those in dead runs)."""
        return list(self._state.dead.values())

    def live_runs(self) -> list[tuple[str, RunRef]]:
        """The ready and timed runs with jobs left, as (queue, ref): read them with
        :func:`run_rows`, wherever."""
        return self._state.runs_of()

    def dead_runs(self) -> list[tuple[str, RunRef]]:
        """The dead runs with dead letters left, as (queue, ref)."""
        return self._state.dead_runs_of()

    def workers(self) -> list[Worker]:
        """The lease holders at work and those gone lately (``model.workers``)."""
        return self._state.workers(self.read_at)

    def fill(self, job: Job) -> Job:
        """``job`` with its payload, loaded from its bodies object if kept out of line; as
        it is if that object is missing or unreadable (a listing shows the others)."""
        return self.bodies.fill(job, lenient=True)


def run_rows(
    store: ObjectStore, queue: str, ref: RunRef, read_at: float
) -> list[tuple[JobState, Job]]:
    """The jobs left in the run ``ref`` of ``queue`` (from a :class:`Snapshot` read at
    ``read_at``) with their state then; none when the run is gone: it was consumed whole
    since the snapshot (its jobs were claimed after that moment)."""
    contents: dict[str, list[Job]] = {}
    missing, broken = read_into(store, [(queue, ref)], contents, {})
    if missing or broken:
        return []
    jobs = contents[ref.key][ref.taken :]
    if ref.kind == "dead":
        return [("dead", job) for job in jobs]
    return [(job.state_at(read_at), job) for job in jobs]
