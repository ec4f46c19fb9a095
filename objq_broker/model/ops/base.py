"""The base of every operation (:class:`Op`) and of those that only read (:class:`Read`)."""

from __future__ import annotations

from typing import Any, ClassVar, Generic, TypeVar

import msgspec

from objq_broker.model.state import QueueState

T = TypeVar("T")


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


class Refused(Op[Any], frozen=True):
    """An operation refused by the engine after it was sent (its commit would have made the
    state too large), standing in for it in its session: it fails alone with ``error``.
    Never sent between processes."""

    error: Any

    def apply(self, state: QueueState, now: float) -> Any:
        raise self.error

    def replay(self, state: QueueState, now: float) -> Any:
        raise self.error


class Read(Op[T], frozen=True):
    latest: ClassVar[bool] = True

    def replay(self, state: QueueState, now: float) -> T:
        return self.apply(state, now)  # reads change nothing: read again
