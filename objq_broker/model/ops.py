"""Operations: everything the API asks of a namespace's state, as plain data.

An operation is a frozen msgspec struct holding already-checked values; :meth:`Op.apply` runs it
against a :class:`~objq_broker.model.state.QueueState` at a given time and returns a value that
msgspec can encode. Because operations are data, not closures, they can be batched by the local
commit loop, or encoded and sent to another process that commits for many (the elected broker),
and a replay after an ambiguous write is identical: ids, tokens and jitter are fields, made by
the caller.

Three class flags tell the committer how fresh the state must be:

* ``fresh``: no older than the staleness bound (claims: a stale cache would miss new jobs);
* ``latest``: exactly as stored now (inspection);
* ``consumer``: the caller consumes, so the committer also expires stale leases when idle.

Build operations with the functions of :mod:`objq_broker.ops`, which check every value.
"""

from __future__ import annotations

from typing import Any, ClassVar, Generic, TypeVar

import msgspec

from objq_broker.model.checks import (
    Attempts,
    Identifier,
    PositiveSeconds,
    Priority,
    QueueName,
    Seconds,
    SignedSeconds,
)
from objq_broker.model.records import Job, JobState, NackResult, QueueConfig
from objq_broker.model.state import NewJob, QueueState, QueueStats, StagedBodies

T = TypeVar("T")
Held = tuple[str, str]  # (job id, lease token)


class Op(msgspec.Struct, Generic[T], frozen=True, tag=True):
    """One operation on the state; its result type is ``T``."""

    fresh: ClassVar[bool] = False
    latest: ClassVar[bool] = False
    consumer: ClassVar[bool] = False

    def apply(self, state: QueueState, now: float) -> T:
        raise NotImplementedError

    @property
    def size(self) -> int:
        """Payload bytes this operation adds (a batch is capped by bytes too)."""
        return 0


# --- queues ----------------------------------------------------------------------------------


class Declare(Op[bool], frozen=True):
    queue: QueueName
    config: QueueConfig | None = None

    def apply(self, state: QueueState, now: float) -> bool:
        return state.declare(self.queue, self.config)


class Configure(Op[QueueConfig], frozen=True):
    queue: QueueName
    changes: dict[str, int | float]

    def apply(self, state: QueueState, now: float) -> QueueConfig:
        return state.configure(self.queue, self.changes)


class Purge(Op[int], frozen=True):
    queue: QueueName

    def apply(self, state: QueueState, now: float) -> int:
        return state.purge(self.queue)


class DeleteQueue(Op[int], frozen=True):
    queue: QueueName

    def apply(self, state: QueueState, now: float) -> int:
        return state.delete_queue(self.queue)


# --- producing -------------------------------------------------------------------------------


class Enqueue(Op[list[Job]], frozen=True):
    items: list[NewJob]

    def apply(self, state: QueueState, now: float) -> list[Job]:
        return state.enqueue(self.items, now)

    @property
    def size(self) -> int:
        return sum(len(item.body) for item in self.items)


class EnqueueStaged(Op[int | None], frozen=True):
    queue: QueueName
    staged: list[StagedBodies]
    ids: list[Identifier]
    write_id: Identifier
    priority: Priority = 0
    delay_seconds: SignedSeconds = 0.0
    max_attempts: Attempts | None = None

    def apply(self, state: QueueState, now: float) -> int | None:
        return state.enqueue_staged(
            self.queue,
            self.staged,
            self.ids,
            now,
            write_id=self.write_id,
            priority=self.priority,
            delay_seconds=self.delay_seconds,
            max_attempts=self.max_attempts,
        )


# --- consuming -------------------------------------------------------------------------------


class Claim(Op[list[Job]], frozen=True):
    """Lease up to ``len(tokens)`` jobs, taking from each queue in turn until enough are found."""

    fresh: ClassVar[bool] = True
    consumer: ClassVar[bool] = True

    queues: list[QueueName]
    tokens: list[str]
    owner: Identifier
    lease_seconds: PositiveSeconds | None = None

    def apply(self, state: QueueState, now: float) -> list[Job]:
        found: list[Job] = []
        for name in self.queues:
            if len(found) >= len(self.tokens):
                break
            found += state.claim(
                name, self.tokens[len(found) :], self.owner, now, self.lease_seconds
            )
        return found


class Heartbeat(Op[list[bool]], frozen=True):
    held: list[Held]
    lease_seconds: PositiveSeconds | None = None

    def apply(self, state: QueueState, now: float) -> list[bool]:
        return state.heartbeat(self.held, now, self.lease_seconds)


class Ack(Op[Job], frozen=True):
    job_id: str
    token: str

    def apply(self, state: QueueState, now: float) -> Job:
        return state.ack(self.job_id, self.token, now)


class Nack(Op[NackResult], frozen=True):
    job_id: str
    token: str
    error: str | None = None
    retry: bool = True
    jitter: float = 0.0
    delay_seconds: Seconds | None = None

    def apply(self, state: QueueState, now: float) -> NackResult:
        return state.nack(
            self.job_id,
            self.token,
            now,
            error=self.error,
            retry=self.retry,
            jitter=self.jitter,
            delay_seconds=self.delay_seconds,
        )


class Release(Op[list[bool]], frozen=True):
    held: list[Held]

    def apply(self, state: QueueState, now: float) -> list[bool]:
        return state.release(self.held, now)


class Expire(Op[int], frozen=True):
    latest: ClassVar[bool] = True

    def apply(self, state: QueueState, now: float) -> int:
        return state.expire(now)


class Nothing(Op[None], frozen=True):
    """Changes nothing: its future resolves once everything submitted before it has."""

    def apply(self, state: QueueState, now: float) -> None:
        return None


# --- dead letters ----------------------------------------------------------------------------


class RetryDead(Op[list[str]], frozen=True):
    queue: QueueName
    ids: list[str] | None = None

    def apply(self, state: QueueState, now: float) -> list[str]:
        return state.retry_dead(self.queue, self.ids, now)


class PurgeDead(Op[int], frozen=True):
    queue: QueueName
    ids: list[str] | None = None

    def apply(self, state: QueueState, now: float) -> int:
        return state.purge_dead(self.queue, self.ids)


# --- reading (the state as stored now) -------------------------------------------------------


class Read(Op[T], frozen=True):
    latest: ClassVar[bool] = True


class QueueNames(Read[list[str]], frozen=True):
    def apply(self, state: QueueState, now: float) -> list[str]:
        return state.queue_names()


class GetConfig(Read[QueueConfig], frozen=True):
    queue: QueueName

    def apply(self, state: QueueState, now: float) -> QueueConfig:
        return state.config(self.queue)


class Stats(Read[list[QueueStats]], frozen=True):
    """Counts of several queues read from one state, so a job moving between them is never
    counted twice or missed."""

    queues: list[QueueName]

    def apply(self, state: QueueState, now: float) -> list[QueueStats]:
        return [state.stats(name, now) for name in self.queues]


class FindJob(Read[tuple[JobState, Job] | None], frozen=True):
    job_id: str

    def apply(self, state: QueueState, now: float) -> tuple[JobState, Job] | None:
        return state.find(self.job_id, now)


class ListJobs(Read[list[tuple[JobState, Job]]], frozen=True):
    queue: QueueName
    state: JobState | None = None
    limit: int | None = None

    def apply(self, state: QueueState, now: float) -> list[tuple[JobState, Job]]:
        return state.list_jobs(self.queue, now, self.state, self.limit)


class DeadLetters(Read[list[Job]], frozen=True):
    queue: QueueName

    def apply(self, state: QueueState, now: float) -> list[Job]:
        return state.dead_letters(self.queue)


#: Every operation, for decoding one sent by another process.
ANY_OP: Any = (
    Declare
    | Configure
    | Purge
    | DeleteQueue
    | Enqueue
    | EnqueueStaged
    | Claim
    | Heartbeat
    | Ack
    | Nack
    | Release
    | Expire
    | Nothing
    | RetryDead
    | PurgeDead
    | QueueNames
    | GetConfig
    | Stats
    | FindJob
    | ListJobs
    | DeadLetters
)
