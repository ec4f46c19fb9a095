"""What the elected broker and its clients send: a client's request (:class:`Session`), the
operations on the broker record, and the runs a batch of operations needs read."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, ClassVar, Union

import msgspec
from msgspec import Meta

from objq_broker.errors import BrokerTaken, ObjqError
from objq_broker.model.checks import (
    MAX_SESSION_OPS,
    Identifier,
    Seq,
)

# Imported for their operations, which must all be declared before the union below is built.
from objq_broker.model.ops import jobs, queues, reading  # noqa: F401
from objq_broker.model.ops.base import Op, RunAt, sendable
from objq_broker.model.records import SESSION_TTL_SECONDS, BrokerRecord
from objq_broker.model.state import QueueState

# --- the elected broker ----------------------------------------------------------------------


class TakeBroker(Op[BrokerRecord], frozen=True):
    """Make ``record`` the namespace's broker under the next epoch, if the broker is still the
    one seen gone (``after``: its epoch, None for no broker): of two candidates that saw the
    same broker die, only one wins."""

    latest: ClassVar[bool] = True
    sent: ClassVar[bool] = False

    record: BrokerRecord
    after: int | None

    def apply(self, state: QueueState, now: float) -> BrokerRecord:
        doc = state.doc
        current = doc.broker.epoch if doc.broker is not None else None
        if current != self.after:
            holder = doc.broker.address if doc.broker is not None else "none"
            # Processes that start together all find no broker and race for it: that is
            # no broker gone, just another process first.
            seen = (
                "there was none when this process looked"
                if self.after is None
                else f"epoch {self.after} was found gone"
            )
            raise BrokerTaken(f"{seen}; now it is epoch {doc.epoch}, at {holder}")
        doc.epoch += 1
        doc.broker = msgspec.structs.replace(self.record, epoch=doc.epoch, since=now)
        state.dirty = True
        return doc.broker

    def replay(self, state: QueueState, now: float) -> BrokerRecord:
        return state.doc.broker or self.record


class ResignBroker(Op[bool], frozen=True):
    """Clear the broker record if ``epoch`` still holds it (a broker shutting down), so the
    next process to look takes over at once instead of waiting for it to be found gone."""

    sent: ClassVar[bool] = False
    shrinks: ClassVar[bool] = True

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


# --- sessions --------------------------------------------------------------------------------

#: Every operation a broker client may send, for decoding one sent by another process.
ANY_OP: Any = Union[tuple(sendable())]  # noqa: UP007 (a union of types known at run time)

#: What each operation of a session did: its result, or the error that refused it alone.
Outcomes = list[tuple[bool, Any]]


class Session(Op[Outcomes], frozen=True):
    """Request ``seq`` of broker client ``client``: its operations, applied together.

    A client numbers its requests and sends one at a time. The state remembers the last
    request of each client that changed anything, so a request sent again (its broker died
    before answering; the client found another) is answered with each operation's
    :meth:`~Op.replay` instead of being applied twice."""

    sent: ClassVar[bool] = False

    client: Identifier
    seq: Seq
    ops: Annotated[list[ANY_OP], Meta(max_length=MAX_SESSION_OPS)]

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


def runs_needed(state: QueueState, ops: Sequence[Op[Any]], now: float) -> list[RunAt]:
    """The runs (as (queue, ref)) that applying ``ops`` to ``state`` at ``now`` may read: what
    the engine has read (or reads) before applying a batch, so the model stays pure. Timed runs
    with jobs due and dead runs with dead letters past retention are always among them: every
    commit promotes or drops those."""
    found: list[RunAt] = [*state.due_runs(now), *state.expired_dead_runs(now)]
    for queue in state.expiring(now):  # deleted by this commit's housekeeping
        found += [*state.runs_of(queue), *state.dead_runs_of(queue)]
    claims: dict[str, int] = {}
    for op in _flat(ops):
        if isinstance(op, jobs.Claim):  # the claims of one queue read as far as they take together
            for name in op.queues:
                claims[name] = claims.get(name, 0) + len(op.tokens)
        else:
            found += op.runs_needed(state)
    for name, n in claims.items():
        found += state.runs_to_claim(name, n)
    return list({ref.key: (queue, ref) for queue, ref in found}.values())


def _flat(ops: Sequence[Op[Any]]) -> list[Op[Any]]:
    flat: list[Op[Any]] = []
    for op in ops:
        flat += op.ops if isinstance(op, Session) else [op]
    return flat
