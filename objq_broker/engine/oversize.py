"""A commit whose state would be larger than its readers accept: the operations that grow it
most are refused (:class:`~objq_broker.errors.StateFull`), and the rest of the batch commits.

A reader refuses a state over ``max_state_bytes`` (it cannot tell a huge state from a corrupt
one), so a writer that stored one would stop every process of the namespace. The writer
therefore never stores it: when a try's encoded state is too large, the batch is applied again
without the operations that carry the most, as many as carry the excess between them (what
an operation carries is what it adds, near enough), until it fits: an operation of megabytes
goes alone, and a namespace that filled up over many commits refuses its growing operations
in a try or two, not one by one. Operations that only shrink the state or read it are never
refused: acks, purges and deletes are how a full namespace makes room. A claim is not refused
but asks for half as many jobs (a claim may always find fewer than it asks), down to one.

Working a full namespace off takes claims, which add leases, so the last tenth of the limit
is kept for consumers: past nine tenths, only what produces (enqueues, declares, settings,
dead letters sent back) is refused.
"""

from __future__ import annotations

from typing import Any

import msgspec

from objq_broker.engine.batch import Pending
from objq_broker.errors import StateFull
from objq_broker.model.ops import Claim, Op, Refused, Session

#: The share of ``max_state_bytes`` only consumers may fill.
CONSUMERS_SHARE = 0.1


class StateTooLarge(Exception):
    """A try's encoded state may not be stored (internal: the commit loop refuses some of
    the batch and tries again). ``producers_only``: it is within the limit, in the share kept
    for consumers, so only what produces is refused."""

    def __init__(self, size: int, limit: int, before: int = 0) -> None:
        self.producers_only = size <= limit
        #: How many bytes too many: down to the share producers may fill.
        self.excess = size - int(limit * (1 - CONSUMERS_SHARE))
        #: How many bytes the try added to the state as it was read (or written) last.
        self.grown = size - before
        over = (
            f"in the last {CONSUMERS_SHARE:.0%} of max_state_bytes {limit}, kept for consumers"
            if self.producers_only
            else f"over max_state_bytes {limit}"
        )
        super().__init__(f"the state would be {size} bytes, {over}")


def check_size(
    size: int, limit: int, results: list[tuple[Pending, bool, Any]], before: int = 0
) -> None:
    """Raise :class:`StateTooLarge` when a state of ``size`` bytes (``before`` as last read
    or written) may not be stored with the operations of ``results`` (as a try applied
    them)."""
    if size <= limit * (1 - CONSUMERS_SHARE):
        return
    if size > limit or any(_produces(op) for op in _flat(results)):
        raise StateTooLarge(size, limit, before)


#: Where an operation is: its index in the batch, and in its session (None: not in one).
_Place = tuple[int, int | None]


def refuse_largest(live: list[Pending], too_large: StateTooLarge, url: str) -> int:
    """Refuse the operations of ``live`` that grow the state (inside sessions too), those that
    carry the most first, until what they carry covers the excess (one at least); returns how
    many were refused. A whole operation leaves ``live`` with the error as its outcome; an
    operation inside a session is replaced there by a :class:`Refused`, so the session's other
    operations still commit."""
    chosen = _largest(live, too_large)
    inside: dict[int, set[int]] = {}
    whole: set[int] = set()
    for index, at in chosen:
        if at is not None:
            inside.setdefault(index, set()).add(at)
        elif (smaller := _smaller(live[index].op)) is not None:
            live[index].op = smaller
        else:
            whole.add(index)
    for index, positions in inside.items():
        session = live[index].op
        assert isinstance(session, Session)
        ops = [
            (_smaller(op) or Refused(_error(op, too_large, url))) if at in positions else op
            for at, op in enumerate(session.ops)
        ]
        live[index].op = msgspec.structs.replace(session, ops=ops)
    for index in sorted(whole, reverse=True):
        pending = live.pop(index)
        if not pending.future.done():
            pending.future.set_exception(_error(pending.op, too_large, url))
    return len(chosen)


def _smaller(op: Op[Any]) -> Claim | None:
    """A claim asking for half as many jobs (None: not a claim, or one of a single job)."""
    if not isinstance(op, Claim) or len(op.tokens) < 2:
        return None
    return msgspec.structs.replace(op, tokens=op.tokens[: len(op.tokens) // 2])


def _largest(live: list[Pending], too_large: StateTooLarge) -> list[_Place]:
    """The places of the operations to refuse: the largest that may be refused, as many as
    carry the excess between them, and one at least (none when none may be)."""
    refusable = _produces if too_large.producers_only else _grows
    candidates: list[tuple[int, _Place]] = []
    for index, pending in enumerate(live):
        op = pending.op
        inner = list(enumerate(op.ops)) if isinstance(op, Session) else [(None, op)]
        candidates += [(_weight(one), (index, at)) for at, one in inner if refusable(one)]
    candidates.sort(key=lambda found: found[0], reverse=True)
    # An operation adds more than it carries (each job's id, times and attempts besides its
    # payload), so the weights are scaled to what the try measured it grew by: counted at
    # face value, the few large operations would seem too light to cover the excess, and the
    # small ones behind them would be refused with them.
    scale = max(1.0, too_large.grown / max(1, sum(weight for weight, _ in candidates)))
    chosen: list[_Place] = []
    carried = 0.0
    for weight, place in candidates:
        if chosen and carried >= too_large.excess:
            break
        chosen.append(place)
        carried += weight * scale
    return chosen


def _grows(op: Op[Any]) -> bool:
    return not op.shrinks


def _produces(op: Op[Any]) -> bool:
    return op.produces


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
