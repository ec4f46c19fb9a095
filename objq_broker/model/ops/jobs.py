"""Operations on jobs: producing them (one by one, staged in bodies objects, or as whole
runs) and consuming them (claim, heartbeat, ack, note an outcome, nack, release, expire)."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from msgspec import Meta

from objq_broker.errors import ConfigurationError, QueueNotFound
from objq_broker.model import leases, producing
from objq_broker.model.checks import (
    MAX_CLAIM,
    MAX_ITEMS,
    Attempts,
    ClaimWeight,
    ErrorText,
    Held,
    Identifier,
    Jitter,
    PositiveSeconds,
    Priority,
    QueueName,
    Seconds,
    SignedSeconds,
)
from objq_broker.model.ops.base import Op, RunAt
from objq_broker.model.records import (
    Job,
    NackResult,
    RunOutcome,
)
from objq_broker.model.state import QueueState
from objq_broker.model.values import NewJob, StagedBodies, StagedRun

# --- producing -------------------------------------------------------------------------------


class Enqueue(Op[list[Job]], frozen=True):
    """Add jobs, declaring their queues by first use; with ``to_declared``, only the jobs of
    queues that exist are added (a message routed by a binding that outlived its queue is
    dropped, as AMQP drops what no queue takes, instead of bringing the queue back)."""

    produces: ClassVar[bool] = True

    items: Annotated[list[NewJob], Meta(max_length=MAX_ITEMS)]
    to_declared: bool = False

    def apply(self, state: QueueState, now: float) -> list[Job]:
        return state.enqueue(self._kept(state), now)

    def replay(self, state: QueueState, now: float) -> list[Job]:
        return state.enqueued(self._kept(state), now)

    def _kept(self, state: QueueState) -> list[NewJob]:
        if not self.to_declared:
            return self.items
        return [item for item in self.items if item.queue in state.doc.queues]

    def runs_needed(self, state: QueueState) -> list[RunAt]:
        """An idempotency key may be in its queue's key runs. The backlog is never read for it:
        a duplicate whose first job left the head is answered by that job's id, described from
        the request (reading a deep queue's runs for it would cost the whole backlog in
        memory)."""
        found: list[RunAt] = []
        for queue in {item.queue for item in self.items if item.key is not None}:
            found += state.key_runs_of(queue)
        return found

    @property
    def size(self) -> int:
        return sum(len(item.body) for item in self.items)


class EnqueueStaged(Op[int | None], frozen=True):
    produces: ClassVar[bool] = True

    queue: QueueName
    staged: Annotated[list[StagedBodies], Meta(max_length=MAX_ITEMS)]
    ids: Annotated[list[Identifier], Meta(max_length=MAX_ITEMS)]
    write_id: Identifier
    priority: Priority = 0
    delay_seconds: SignedSeconds = 0.0
    max_attempts: Attempts | None = None

    def apply(self, state: QueueState, now: float) -> int | None:
        return producing.enqueue_staged(
            state,
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

    def runs_needed(self, state: QueueState) -> list[RunAt]:
        return [*state.key_runs_of(self.queue)]


class EnqueueRuns(Op[int | None], frozen=True):
    produces: ClassVar[bool] = True

    queue: QueueName
    runs: Annotated[list[StagedRun], Meta(max_length=MAX_ITEMS)]
    write_id: Identifier

    def apply(self, state: QueueState, now: float) -> int | None:
        return producing.enqueue_runs(state, self.queue, self.runs, now, write_id=self.write_id)

    def replay(self, state: QueueState, now: float) -> int | None:
        return None  # as when the same write id is committed twice

    def runs_needed(self, state: QueueState) -> list[RunAt]:
        return [*state.key_runs_of(self.queue)]


# --- consuming -------------------------------------------------------------------------------


class Claim(Op[list[Job]], frozen=True):
    """Lease up to ``len(tokens)`` jobs of ``queues``. A claim over several queues takes one
    job at a time from the queue least served so far for its weight (``weights``, 1 each by
    default) among those with ready work, so none starves (``docs/groups.md``)."""

    fresh: ClassVar[bool] = True
    consumer: ClassVar[bool] = True

    queues: Annotated[list[QueueName], Meta(max_length=MAX_ITEMS)]
    tokens: Annotated[list[Identifier], Meta(max_length=MAX_CLAIM)]
    owner: Identifier
    lease_seconds: PositiveSeconds | None = None
    #: Refuse (:class:`~objq_broker.errors.QueueNotFound`) when a queue is not declared,
    #: instead of finding nothing in it until an enqueue creates it.
    strict: bool = False
    #: How many turns each queue gets in a rotation over several (one per queue); None: 1 each.
    weights: Annotated[list[ClaimWeight], Meta(max_length=MAX_ITEMS)] | None = None
    #: Take from each queue in the order given until enough are found, instead of in turn:
    #: for a caller that orders them itself (kombu's channel puts the queues of control
    #: messages first, so a revoke is seen before the task it revokes, and turns the rest).
    ordered: bool = False

    def apply(self, state: QueueState, now: float) -> list[Job]:
        if self.strict:
            missing = [name for name in self.queues if name not in state.doc.queues]
            if missing:
                raise QueueNotFound(state.not_declared(missing[0]))
        if self.weights is not None and len(self.weights) != len(self.queues):
            raise ConfigurationError(
                f"claim: expected one weight per queue ({len(self.queues)}), "
                f"found {len(self.weights)}"
            )
        if len(self.queues) == 1:
            return state.claim(self.queues[0], self.tokens, self.owner, now, self.lease_seconds)
        if self.ordered:
            return self._in_order(state, now)
        return self._rotate(state, now)

    def _in_order(self, state: QueueState, now: float) -> list[Job]:
        found: list[Job] = []
        for name in self.queues:
            if len(found) >= len(self.tokens):
                break
            tokens = self.tokens[len(found) :]
            found += state.claim(name, tokens, self.owner, now, self.lease_seconds)
        return found

    def _rotate(self, state: QueueState, now: float) -> list[Job]:
        """One job at a time from the queue whose turn it is; a queue that has none is left
        out of the rest of the claim."""
        queues = list(dict.fromkeys(self.queues))
        weight = dict(zip(self.queues, self.weights or [1] * len(self.queues), strict=True))
        found: list[Job] = []
        while len(found) < len(self.tokens) and queues:
            for name in state.index.rotation(queues):
                token = self.tokens[len(found) : len(found) + 1]
                got = state.claim(name, token, self.owner, now, self.lease_seconds)
                if got:
                    state.index.served(name, weight[name])
                    found += got
                    break
                queues.remove(name)
        return found

    def replay(self, state: QueueState, now: float) -> list[Job]:
        return state.leased_to(self.tokens)


class Heartbeat(Op[list[bool]], frozen=True):
    held: Annotated[list[Held], Meta(max_length=MAX_ITEMS)]
    lease_seconds: PositiveSeconds | None = None

    def apply(self, state: QueueState, now: float) -> list[bool]:
        return state.heartbeat(self.held, now, self.lease_seconds)

    def replay(self, state: QueueState, now: float) -> list[bool]:
        return state.holds(self.held)


class Ack(Op[Job], frozen=True):
    shrinks: ClassVar[bool] = True

    job_id: Identifier
    token: Identifier
    outcome: Literal["done"] | RunOutcome = "done"
    error: ErrorText | None = None

    def apply(self, state: QueueState, now: float) -> Job:
        return state.ack(self.job_id, self.token, now, self.outcome, self.error)

    def replay(self, state: QueueState, now: float) -> Job:
        # The job has left the state; its archive record has it whole.
        return Job(self.job_id, "", "", 0, now, now, 1, finished_at=now)


class NoteOutcome(Op[None], frozen=True):
    """How the run of a job went, said after the job was acked (or while it is held)."""

    job_id: Identifier
    queue: QueueName
    #: The lease token of the delivery that ran the job.
    token: Identifier
    outcome: RunOutcome
    error: ErrorText | None = None

    def apply(self, state: QueueState, now: float) -> None:
        leases.note_outcome(
            state, self.job_id, self.queue, self.token, self.outcome, error=self.error, now=now
        )

    def replay(self, state: QueueState, now: float) -> None:
        return None


class Nack(Op[NackResult], frozen=True):
    job_id: Identifier
    token: Identifier
    error: ErrorText | None = None
    retry: bool = True
    jitter: Jitter = 0.0
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
    shrinks: ClassVar[bool] = True

    held: Annotated[list[Held], Meta(max_length=MAX_ITEMS)]

    def apply(self, state: QueueState, now: float) -> list[bool]:
        return state.release(self.held, now)

    def replay(self, state: QueueState, now: float) -> list[bool]:
        return [True] * len(self.held)


class Expire(Op[int], frozen=True):
    latest: ClassVar[bool] = True
    shrinks: ClassVar[bool] = True

    def apply(self, state: QueueState, now: float) -> int:
        return state.expire(now)

    def replay(self, state: QueueState, now: float) -> int:
        return 0


class Nothing(Op[None], frozen=True):
    """Changes nothing: its future resolves once everything submitted before it has."""

    shrinks: ClassVar[bool] = True

    def apply(self, state: QueueState, now: float) -> None:
        return None

    def replay(self, state: QueueState, now: float) -> None:
        return None
