"""A commit whose state would be larger than its readers accept: the operations that grow it
most are refused (:class:`~objq_broker.errors.StateFull`), and the rest of the batch commits.

A reader refuses a state over ``max_state_bytes`` (it cannot tell a huge state from a corrupt
one), so a writer that stored one would stop every process of the namespace. The writer
therefore never stores it: when a try's encoded state is too large, the batch is applied again
without the operations that add the most, first one, then twice as many each time (a
namespace that filled up over many commits refuses its growing operations in a few tries,
not one by one), until it fits. Operations that only shrink the state or read it are never
refused: acks, purges and deletes are how a full namespace makes room.

Working a full namespace off takes claims, which add leases, so the last tenth of the limit
is kept for consumers: past nine tenths, only what produces (enqueues, declares, settings,
dead letters sent back) is refused.
"""

from __future__ import annotations

from typing import Any

import msgspec

from objq_broker.engine.batch import Pending
from objq_broker.errors import StateFull
from objq_broker.model.ops import (
    Ack,
    Configure,
    Declare,
    DeleteQueue,
    Enqueue,
    EnqueueRuns,
    EnqueueStaged,
    Expire,
    Nothing,
    Op,
    Purge,
    PurgeDead,
    Read,
    Refused,
    Release,
    ResignBroker,
    RetryDead,
    Session,
)

#: Operations that never make the state larger (reads change nothing).
_SHRINKING = (Ack, DeleteQueue, Expire, Nothing, Purge, PurgeDead, Read, Release, ResignBroker)
#: Operations that bring new things into the state (and none of its jobs out).
_PRODUCING = (Configure, Declare, Enqueue, EnqueueRuns, EnqueueStaged, RetryDead)
#: The share of ``max_state_bytes`` only consumers may fill.
CONSUMERS_SHARE = 0.1


class StateTooLarge(Exception):
    """A try's encoded state may not be stored (internal: the commit loop refuses some of
    the batch and tries again). ``producers_only``: it is within the limit, in the share kept
    for consumers, so only what produces is refused."""

    def __init__(self, size: int, limit: int) -> None:
        self.producers_only = size <= limit
        over = (
            f"in the last {CONSUMERS_SHARE:.0%} of max_state_bytes {limit}, kept for consumers"
            if self.producers_only
            else f"over max_state_bytes {limit}"
        )
        super().__init__(f"the state would be {size} bytes, {over}")


def check_size(size: int, limit: int, results: list[tuple[Pending, bool, Any]]) -> None:
    """Raise :class:`StateTooLarge` when a state of ``size`` bytes may not be stored with
    the operations of ``results`` (as a try applied them)."""
    if size <= limit * (1 - CONSUMERS_SHARE):
        return
    if size > limit or any(_produces(op) for op in _flat(results)):
        raise StateTooLarge(size, limit)


def refuse_largest(live: list[Pending], count: int, too_large: StateTooLarge, url: str) -> int:
    """Refuse up to ``count`` of the operations of ``live`` that grow the state (inside
    sessions too), those that carry the most first; returns how many were refused. A whole
    operation leaves ``live`` with the error as its outcome; an operation inside a session is
    replaced there by a :class:`Refused`, so the session's other operations still commit."""
    refusable = _produces if too_large.producers_only else _grows
    candidates: list[tuple[int, int, int | None]] = []  # (size, index in live, index in session)
    for index, pending in enumerate(live):
        op = pending.op
        if isinstance(op, Session):
            candidates += [
                (_weight(inner), index, at) for at, inner in enumerate(op.ops) if refusable(inner)
            ]
        elif refusable(op):
            candidates.append((_weight(op), index, None))
    candidates.sort(key=lambda found: found[0], reverse=True)
    chosen = candidates[:count]
    whole: set[int] = set()
    inside: dict[int, set[int]] = {}
    for _, index, at in chosen:
        if at is None:
            whole.add(index)
        else:
            inside.setdefault(index, set()).add(at)
    for index, positions in inside.items():
        session = live[index].op
        assert isinstance(session, Session)
        ops = [
            Refused(_error(op, too_large, url)) if at in positions else op
            for at, op in enumerate(session.ops)
        ]
        live[index].op = msgspec.structs.replace(session, ops=ops)
    for index in sorted(whole, reverse=True):
        pending = live.pop(index)
        if not pending.future.done():
            pending.future.set_exception(_error(pending.op, too_large, url))
    return len(chosen)


def _grows(op: Op[Any]) -> bool:
    return not isinstance(op, (*_SHRINKING, Refused))


def _produces(op: Op[Any]) -> bool:
    return isinstance(op, _PRODUCING)


def _flat(results: list[tuple[Pending, bool, Any]]) -> list[Op[Any]]:
    found: list[Op[Any]] = []
    for pending, _, _ in results:
        op = pending.op
        found += op.ops if isinstance(op, Session) else [op]
    return found


def _weight(op: Op[Any]) -> int:
    """How much ``op`` may add to the state: its own encoded size, a fair proxy (what an
    operation adds is mostly what it carries)."""
    try:
        return len(msgspec.json.encode(op))
    except (TypeError, ValueError):
        return 0


def _error(op: Op[Any], too_large: StateTooLarge, url: str) -> StateFull:
    return StateFull(
        f"{url}: {type(op).__name__} refused: with it {too_large}, which no reader of the "
        f"namespace accepts; the rest of its batch was committed. Make room (ack, purge or "
        f"delete jobs, delete queues) or raise max_state_bytes for every process"
    )
