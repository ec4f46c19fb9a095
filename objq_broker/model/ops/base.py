"""The base of every operation (:class:`Op`) and of those that only read (:class:`Read`), and
the register of operations a broker client may send (:func:`sendable`)."""

from __future__ import annotations

from typing import Any, ClassVar, Generic, TypeVar

import msgspec

from objq_broker.model.records import KeyRunRef, RunRef
from objq_broker.model.state import QueueState

T = TypeVar("T")

#: A run an operation may read, as (queue, ref).
RunAt = tuple[str, RunRef | KeyRunRef]

#: Every operation class, in the order they were declared.
_operations: list[type[Op[Any]]] = []


class Op(msgspec.Struct, Generic[T], frozen=True, tag=True):
    """One operation on the state; its result type is ``T``.

    Declaring a subclass with its result type (``Op[int]``) is all it takes to make it an
    operation a broker client may send (unless ``sent`` says otherwise): the union that
    decodes a :class:`~objq_broker.model.ops.Session` is built from these classes."""

    fresh: ClassVar[bool] = False
    latest: ClassVar[bool] = False
    consumer: ClassVar[bool] = False
    #: A broker client may send it (False: the engine or the broker makes it for itself).
    sent: ClassVar[bool] = True
    #: It never makes the state larger, so a state too large to store never refuses it: this
    #: is how a full namespace makes room.
    shrinks: ClassVar[bool] = False
    #: It brings new things into the state (and none of its jobs out): refused first when a
    #: state nears its limit, whose last share is kept for consumers.
    produces: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # A class still generic in its result (Read) is a base for operations, not one.
        if not getattr(cls, "__parameters__", ()):
            _operations.append(cls)

    def apply(self, state: QueueState, now: float) -> T:
        raise NotImplementedError

    def replay(self, state: QueueState, now: float) -> T:
        """The result to give for this operation when it was already applied (a broker client
        resending a request whose answer was lost), computed without changing anything.
        Counts of what the first application removed are not kept: they replay as zero."""
        raise NotImplementedError

    def runs_needed(self, state: QueueState) -> list[RunAt]:
        """The runs applying this operation to ``state`` may read, besides those every commit
        reads (:func:`~objq_broker.model.ops.runs_needed` gathers a batch's, and those of its
        claims, which read as far as the claims of one queue take together)."""
        return []

    @property
    def size(self) -> int:
        """Payload bytes this operation adds (a batch is capped by bytes too)."""
        return 0


def sendable() -> list[type[Op[Any]]]:
    """The operations a broker client may send, of those declared so far, by name: the order
    does not change with the order their modules are imported in."""
    return sorted((op for op in _operations if op.sent), key=lambda op: op.__name__)


class Refused(Op[Any], frozen=True):
    """An operation refused by the engine after it was sent (its commit would have made the
    state too large), standing in for it in its session: it fails alone with ``error``.
    Never sent between processes."""

    sent: ClassVar[bool] = False
    shrinks: ClassVar[bool] = True

    error: Any

    def apply(self, state: QueueState, now: float) -> Any:
        raise self.error

    def replay(self, state: QueueState, now: float) -> Any:
        raise self.error


class Read(Op[T], frozen=True):
    latest: ClassVar[bool] = True
    shrinks: ClassVar[bool] = True

    def replay(self, state: QueueState, now: float) -> T:
        return self.apply(state, now)  # reads change nothing: read again
