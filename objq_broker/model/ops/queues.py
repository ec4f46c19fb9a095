"""Operations on queues as a whole: declare, configure, purge, delete, and their dead letters."""

from __future__ import annotations

from typing import Annotated, ClassVar

from msgspec import Meta

from objq_broker.model.checks import (
    MAX_ITEMS,
    Identifier,
    QueueName,
)
from objq_broker.model.ops.base import Op, RunAt
from objq_broker.model.records import (
    QueueConfig,
)
from objq_broker.model.state import QueueState

# --- queues ----------------------------------------------------------------------------------


class Declare(Op[bool], frozen=True):
    produces: ClassVar[bool] = True

    queue: QueueName
    config: QueueConfig | None = None

    def apply(self, state: QueueState, now: float) -> bool:
        return state.declare(self.queue, self.config, now)

    def replay(self, state: QueueState, now: float) -> bool:
        return False


class Configure(Op[QueueConfig], frozen=True):
    produces: ClassVar[bool] = True

    queue: QueueName
    changes: dict[str, bool | int | float | None]

    def apply(self, state: QueueState, now: float) -> QueueConfig:
        return state.configure(self.queue, self.changes, now)

    def replay(self, state: QueueState, now: float) -> QueueConfig:
        return state.config(self.queue)


class Purge(Op[int], frozen=True):
    shrinks: ClassVar[bool] = True

    queue: QueueName

    def apply(self, state: QueueState, now: float) -> int:
        return state.purge(self.queue)

    def runs_needed(self, state: QueueState) -> list[RunAt]:
        return [*state.runs_of(self.queue)]

    def replay(self, state: QueueState, now: float) -> int:
        return 0


class DeleteQueue(Op[int], frozen=True):
    shrinks: ClassVar[bool] = True

    queue: QueueName

    def apply(self, state: QueueState, now: float) -> int:
        return state.delete_queue(self.queue)

    def runs_needed(self, state: QueueState) -> list[RunAt]:
        return [*state.runs_of(self.queue), *state.dead_runs_of(self.queue)]

    def replay(self, state: QueueState, now: float) -> int:
        return 0


# --- dead letters ----------------------------------------------------------------------------


class RetryDead(Op[list[str]], frozen=True):
    produces: ClassVar[bool] = True

    queue: QueueName
    ids: Annotated[list[Identifier], Meta(max_length=MAX_ITEMS)] | None = None

    def apply(self, state: QueueState, now: float) -> list[str]:
        return state.retry_dead(self.queue, self.ids, now)

    def runs_needed(self, state: QueueState) -> list[RunAt]:
        return [*state.dead_runs_of(self.queue)]

    def replay(self, state: QueueState, now: float) -> list[str]:
        return []


class PurgeDead(Op[int], frozen=True):
    shrinks: ClassVar[bool] = True

    queue: QueueName
    ids: Annotated[list[Identifier], Meta(max_length=MAX_ITEMS)] | None = None

    def apply(self, state: QueueState, now: float) -> int:
        return state.purge_dead(self.queue, self.ids)

    def runs_needed(self, state: QueueState) -> list[RunAt]:
        return [*state.dead_runs_of(self.queue)]

    def replay(self, state: QueueState, now: float) -> int:
        return 0
