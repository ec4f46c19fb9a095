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

from collections.abc import Sequence
from typing import Any, ClassVar, Generic, Literal, TypeVar

import msgspec

from objq_broker.errors import BrokerTaken, ObjqError, QueueNotFound
from objq_broker.model.checks import (
    Attempts,
    Identifier,
    PositiveSeconds,
    Priority,
    QueueName,
    Seconds,
    SignedSeconds,
    WriteRate,
)
from objq_broker.model.records import (
    SESSION_TTL_SECONDS,
    BrokerRecord,
    Job,
    JobState,
    KeyRunRef,
    NackResult,
    QueueConfig,
    RunOutcome,
    RunRef,
)
from objq_broker.model.state import QueueState
from objq_broker.model.values import NewJob, QueueStats, StagedBodies, StagedRun
from objq_broker.model.workers import Worker

T = TypeVar("T")
Held = tuple[str, str]  # (job id, lease token)


class Op(msgspec.Struct, Generic[T], frozen=True, tag=True):
    """One operation on the state; its result type is ``T``."""

    fresh: ClassVar[bool] = False
    latest: ClassVar[bool] = False
    consumer: ClassVar[bool] = False

    def apply(self, state: QueueState, now: float) -> T:
        raise NotImplementedError

    def replay(self, state: QueueState, now: float) -> T:
        """The result to give for this operation when it was already applied (a broker client
        resending a request whose answer was lost), computed without changing anything.
        Counts of what the first application removed are not kept: they replay as zero."""
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
        return state.declare(self.queue, self.config, now)

    def replay(self, state: QueueState, now: float) -> bool:
        return False


class Configure(Op[QueueConfig], frozen=True):
    queue: QueueName
    changes: dict[str, int | float | None]

    def apply(self, state: QueueState, now: float) -> QueueConfig:
        return state.configure(self.queue, self.changes, now)

    def replay(self, state: QueueState, now: float) -> QueueConfig:
        return state.config(self.queue)


class Purge(Op[int], frozen=True):
    queue: QueueName

    def apply(self, state: QueueState, now: float) -> int:
        return state.purge(self.queue)

    def replay(self, state: QueueState, now: float) -> int:
        return 0


class DeleteQueue(Op[int], frozen=True):
    queue: QueueName

    def apply(self, state: QueueState, now: float) -> int:
        return state.delete_queue(self.queue)

    def replay(self, state: QueueState, now: float) -> int:
        return 0


# --- producing -------------------------------------------------------------------------------


class Enqueue(Op[list[Job]], frozen=True):
    """Add jobs, declaring their queues by first use; with ``to_declared``, only the jobs of
    queues that exist are added (a message routed by a binding that outlived its queue is
    dropped, as AMQP drops what no queue takes, instead of bringing the queue back)."""

    items: list[NewJob]
    to_declared: bool = False

    def apply(self, state: QueueState, now: float) -> list[Job]:
        return state.enqueue(self._kept(state), now)

    def replay(self, state: QueueState, now: float) -> list[Job]:
        return state.enqueued(self._kept(state), now)

    def _kept(self, state: QueueState) -> list[NewJob]:
        if not self.to_declared:
            return self.items
        return [item for item in self.items if item.queue in state.doc.queues]

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

    def replay(self, state: QueueState, now: float) -> int | None:
        return None  # as when the same write id is committed twice


class EnqueueRuns(Op[int | None], frozen=True):
    queue: QueueName
    runs: list[StagedRun]
    write_id: Identifier

    def apply(self, state: QueueState, now: float) -> int | None:
        return state.enqueue_runs(self.queue, self.runs, now, write_id=self.write_id)

    def replay(self, state: QueueState, now: float) -> int | None:
        return None  # as when the same write id is committed twice


# --- consuming -------------------------------------------------------------------------------


class Claim(Op[list[Job]], frozen=True):
    """Lease up to ``len(tokens)`` jobs, taking from each queue in turn until enough are found."""

    fresh: ClassVar[bool] = True
    consumer: ClassVar[bool] = True

    queues: list[QueueName]
    tokens: list[str]
    owner: Identifier
    lease_seconds: PositiveSeconds | None = None
    #: Refuse (:class:`~objq_broker.errors.QueueNotFound`) when a queue is not declared,
    #: instead of finding nothing in it until an enqueue creates it.
    strict: bool = False

    def apply(self, state: QueueState, now: float) -> list[Job]:
        if self.strict:
            missing = [name for name in self.queues if name not in state.doc.queues]
            if missing:
                raise QueueNotFound(state.not_declared(missing[0]))
        found: list[Job] = []
        for name in self.queues:
            if len(found) >= len(self.tokens):
                break
            found += state.claim(
                name, self.tokens[len(found) :], self.owner, now, self.lease_seconds
            )
        return found

    def replay(self, state: QueueState, now: float) -> list[Job]:
        return state.leased_to(self.tokens)


class Heartbeat(Op[list[bool]], frozen=True):
    held: list[Held]
    lease_seconds: PositiveSeconds | None = None

    def apply(self, state: QueueState, now: float) -> list[bool]:
        return state.heartbeat(self.held, now, self.lease_seconds)

    def replay(self, state: QueueState, now: float) -> list[bool]:
        return state.holds(self.held)


class Ack(Op[Job], frozen=True):
    job_id: str
    token: str
    outcome: Literal["done"] | RunOutcome = "done"
    error: str | None = None

    def apply(self, state: QueueState, now: float) -> Job:
        return state.ack(self.job_id, self.token, now, self.outcome, self.error)

    def replay(self, state: QueueState, now: float) -> Job:
        # The job has left the state; its archive record has it whole.
        return Job(self.job_id, "", "", 0, now, now, 1, finished_at=now)


class NoteOutcome(Op[None], frozen=True):
    """How the run of a job went, said after the job was acked (or while it is held)."""

    job_id: str
    queue: QueueName
    outcome: RunOutcome
    error: str | None = None

    def apply(self, state: QueueState, now: float) -> None:
        state.note_outcome(self.job_id, self.queue, self.outcome, self.error, now)

    def replay(self, state: QueueState, now: float) -> None:
        return None


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

    def replay(self, state: QueueState, now: float) -> NackResult:
        found = state.find(self.job_id, now)
        return "dead" if found is not None and found[0] == "dead" else "retry"


class Release(Op[list[bool]], frozen=True):
    held: list[Held]

    def apply(self, state: QueueState, now: float) -> list[bool]:
        return state.release(self.held, now)

    def replay(self, state: QueueState, now: float) -> list[bool]:
        return [True] * len(self.held)


class Expire(Op[int], frozen=True):
    latest: ClassVar[bool] = True

    def apply(self, state: QueueState, now: float) -> int:
        return state.expire(now)

    def replay(self, state: QueueState, now: float) -> int:
        return 0


class Nothing(Op[None], frozen=True):
    """Changes nothing: its future resolves once everything submitted before it has."""

    def apply(self, state: QueueState, now: float) -> None:
        return None

    def replay(self, state: QueueState, now: float) -> None:
        return None


# --- dead letters ----------------------------------------------------------------------------


class RetryDead(Op[list[str]], frozen=True):
    queue: QueueName
    ids: list[str] | None = None

    def apply(self, state: QueueState, now: float) -> list[str]:
        return state.retry_dead(self.queue, self.ids, now)

    def replay(self, state: QueueState, now: float) -> list[str]:
        return []


class PurgeDead(Op[int], frozen=True):
    queue: QueueName
    ids: list[str] | None = None

    def apply(self, state: QueueState, now: float) -> int:
        return state.purge_dead(self.queue, self.ids)

    def replay(self, state: QueueState, now: float) -> int:
        return 0


# --- reading (the state as stored now) -------------------------------------------------------


class Read(Op[T], frozen=True):
    latest: ClassVar[bool] = True

    def replay(self, state: QueueState, now: float) -> T:
        return self.apply(state, now)  # reads change nothing: read again


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


class SetWriteBudget(Op[float | None], frozen=True):
    """Set (or, with None, lift) the namespace's write budget, in state writes per second."""

    writes_per_second: WriteRate | None

    def apply(self, state: QueueState, now: float) -> float | None:
        state.doc.write_budget = self.writes_per_second
        state.dirty = True
        return self.writes_per_second

    def replay(self, state: QueueState, now: float) -> float | None:
        return state.doc.write_budget


class WriteBudget(Read[float | None], frozen=True):
    """The namespace's write budget (None: none)."""

    def apply(self, state: QueueState, now: float) -> float | None:
        return state.doc.write_budget


class Workers(Read[list[Worker]], frozen=True):
    """The lease holders at work and those gone lately."""

    def apply(self, state: QueueState, now: float) -> list[Worker]:
        return state.workers(now)


# --- the elected broker ----------------------------------------------------------------------


class TakeBroker(Op[BrokerRecord], frozen=True):
    """Make ``record`` the namespace's broker under the next epoch, if the broker is still the
    one seen gone (``after``: its epoch, None for no broker): of two candidates that saw the
    same broker die, only one wins."""

    latest: ClassVar[bool] = True

    record: BrokerRecord
    after: int | None

    def apply(self, state: QueueState, now: float) -> BrokerRecord:
        doc = state.doc
        current = doc.broker.epoch if doc.broker is not None else None
        if current != self.after:
            holder = doc.broker.address if doc.broker is not None else "none"
            raise BrokerTaken(
                f"the broker changed since it was found gone: now epoch {doc.epoch}, at {holder}"
            )
        doc.epoch += 1
        doc.broker = msgspec.structs.replace(self.record, epoch=doc.epoch, since=now)
        state.dirty = True
        return doc.broker

    def replay(self, state: QueueState, now: float) -> BrokerRecord:
        return state.doc.broker or self.record


class ResignBroker(Op[bool], frozen=True):
    """Clear the broker record if ``epoch`` still holds it (a broker shutting down), so the
    next process to look takes over at once instead of waiting for it to be found gone."""

    epoch: int

    def apply(self, state: QueueState, now: float) -> bool:
        doc = state.doc
        if doc.broker is None or doc.broker.epoch != self.epoch:
            return False
        doc.broker = None
        state.dirty = True
        return True

    def replay(self, state: QueueState, now: float) -> bool:
        return True


#: Every operation, for decoding one sent by another process.
ANY_OP: Any = (
    Declare
    | Configure
    | Purge
    | DeleteQueue
    | Enqueue
    | EnqueueStaged
    | EnqueueRuns
    | Claim
    | Heartbeat
    | Ack
    | NoteOutcome
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
    | SetWriteBudget
    | WriteBudget
    | Workers
)

#: What each operation of a session did: its result, or the error that refused it alone.
Outcomes = list[tuple[bool, Any]]


class Session(Op[Outcomes], frozen=True):
    """Request ``seq`` of broker client ``client``: its operations, applied together.

    A client numbers its requests and sends one at a time. The state remembers the last
    request of each client that changed anything, so a request sent again (its broker died
    before answering; the client found another) is answered with each operation's
    :meth:`~Op.replay` instead of being applied twice."""

    client: Identifier
    seq: int
    ops: list[ANY_OP]

    @property
    def fresh(self) -> bool:  # type: ignore[override]
        return any(op.fresh for op in self.ops)

    @property
    def latest(self) -> bool:  # type: ignore[override]
        return any(op.latest for op in self.ops)

    @property
    def consumer(self) -> bool:  # type: ignore[override]
        return any(op.consumer for op in self.ops)

    @property
    def size(self) -> int:
        return sum(op.size for op in self.ops)

    def apply(self, state: QueueState, now: float) -> Outcomes:
        if state.session_applied(self.client, self.seq):
            return self.replay(state, now)
        earlier, state.dirty = state.dirty, False
        outcomes = [_outcome(op.apply, state, now) for op in self.ops]
        if state.dirty:  # a request that changed nothing may simply run again
            state.mark_session(self.client, self.seq, now, SESSION_TTL_SECONDS)
        state.dirty = state.dirty or earlier
        return outcomes

    def replay(self, state: QueueState, now: float) -> Outcomes:
        return [_outcome(op.replay, state, now) for op in self.ops]


def _outcome(run: Any, state: QueueState, now: float) -> tuple[bool, Any]:
    try:
        return True, run(state, now)
    except ObjqError as exc:  # transitions check before they change anything
        return False, exc


def runs_needed(
    state: QueueState, ops: Sequence[Op[Any]], now: float
) -> list[tuple[str, RunRef | KeyRunRef]]:
    """The runs (as (queue, ref)) that applying ``ops`` to ``state`` at ``now`` may read: what
    the engine has read (or reads) before applying a batch, so the model stays pure. Timed runs
    with jobs due and dead runs with dead letters past retention are always among them: every
    commit promotes or drops those."""
    found: list[tuple[str, RunRef | KeyRunRef]] = [
        *state.due_runs(now),
        *state.expired_dead_runs(now),
    ]
    for queue in state.expiring(now):  # deleted by this commit's housekeeping
        found += [*state.runs_of(queue), *state.dead_runs_of(queue)]
    claims: dict[str, int] = {}
    for op in _flat(ops):
        if isinstance(op, Claim):
            for name in op.queues:
                claims[name] = claims.get(name, 0) + len(op.tokens)
        else:
            found += _looked_into(state, op)
    for name, n in claims.items():
        found += state.runs_to_claim(name, n)
    return list({ref.key: (queue, ref) for queue, ref in found}.values())


def _looked_into(state: QueueState, op: Op[Any]) -> list[tuple[str, RunRef | KeyRunRef]]:
    """The runs ``op`` (not a claim) reads, besides those every commit reads."""
    found: list[tuple[str, RunRef | KeyRunRef]] = []
    if isinstance(op, Purge):
        found += state.runs_of(op.queue)
    elif isinstance(op, DeleteQueue | FindJob):
        queue = op.queue if isinstance(op, DeleteQueue) else None
        found += [*state.runs_of(queue), *state.dead_runs_of(queue)]
    elif isinstance(op, ListJobs):
        found += state.runs_of(op.queue) if op.state != "dead" else []
        found += state.dead_runs_of(op.queue) if op.state in (None, "dead") else []
    elif isinstance(op, DeadLetters | RetryDead | PurgeDead):
        found += state.dead_runs_of(op.queue)
    elif isinstance(op, EnqueueStaged | EnqueueRuns):
        found += state.key_runs_of(op.queue)
    elif isinstance(op, Enqueue):
        found += _keyed_enqueue_runs(state, op.items)
    return found


def _keyed_enqueue_runs(
    state: QueueState, items: list[NewJob]
) -> list[tuple[str, RunRef | KeyRunRef]]:
    """An idempotency key may be in its queue's key runs. The backlog is never read for it: a
    duplicate whose first job left the head is answered by that job's id, described from the
    request (reading a deep queue's runs for it would cost the whole backlog in memory)."""
    found: list[tuple[str, RunRef | KeyRunRef]] = []
    for queue in {item.queue for item in items if item.key is not None}:
        found += state.key_runs_of(queue)
    return found


def _flat(ops: Sequence[Op[Any]]) -> list[Op[Any]]:
    flat: list[Op[Any]] = []
    for op in ops:
        flat += op.ops if isinstance(op, Session) else [op]
    return flat
