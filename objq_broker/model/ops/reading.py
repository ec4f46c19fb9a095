"""Operations that read the state as stored now, and the write budget they report."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from objq_broker.model.checks import (
    MAX_ITEMS,
    Identifier,
    QueueName,
    WriteRate,
)
from objq_broker.model.ops.base import Op, Read, RunAt
from objq_broker.model.records import (
    Job,
    JobState,
    QueueConfig,
)
from objq_broker.model.state import QueueState
from objq_broker.model.values import QueueStats
from objq_broker.model.workers import Worker

# --- reading (the state as stored now) -------------------------------------------------------


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

    queues: Annotated[list[QueueName], Meta(max_length=MAX_ITEMS)]

    def apply(self, state: QueueState, now: float) -> list[QueueStats]:
        return [state.stats(name, now) for name in self.queues]


class FindJob(Read[tuple[JobState, Job] | None], frozen=True):
    job_id: Identifier

    def apply(self, state: QueueState, now: float) -> tuple[JobState, Job] | None:
        return state.find(self.job_id, now)

    def runs_needed(self, state: QueueState) -> list[RunAt]:
        return [*state.runs_of(None), *state.dead_runs_of(None)]  # in any queue


class ListJobs(Read[list[tuple[JobState, Job]]], frozen=True):
    queue: QueueName
    state: JobState | None = None
    limit: Annotated[int, Meta(ge=0)] | None = None

    def apply(self, state: QueueState, now: float) -> list[tuple[JobState, Job]]:
        return state.list_jobs(self.queue, now, self.state, self.limit)

    def runs_needed(self, state: QueueState) -> list[RunAt]:
        found: list[RunAt] = []
        found += state.runs_of(self.queue) if self.state != "dead" else []
        found += state.dead_runs_of(self.queue) if self.state in (None, "dead") else []
        return found


class DeadLetters(Read[list[Job]], frozen=True):
    queue: QueueName

    def apply(self, state: QueueState, now: float) -> list[Job]:
        return state.dead_letters(self.queue)

    def runs_needed(self, state: QueueState) -> list[RunAt]:
        return [*state.dead_runs_of(self.queue)]


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
