"""A batch applied to the state, as one try at committing it: each operation in turn, the
leases found stale expired, and the claims waiting at a broker joined into the try that readied
their jobs. The runs the batch needs are read before
(:meth:`~objq_broker.engine.loading.StateCache.read_runs`), so applying does no I/O."""

from __future__ import annotations

import logging
from typing import Any

from objq_broker.engine.batch import Attempt, Pending, StandingClaims
from objq_broker.errors import ObjqError
from objq_broker.model.ids import new_id
from objq_broker.model.ops import Op, runs_needed
from objq_broker.model.records import KeyRunRef, RunRef
from objq_broker.model.state import QueueState

log = logging.getLogger("objq_broker.engine")

Results = list[tuple[Pending, bool, Any]]


def apply_batch(
    state: QueueState, ops: list[Pending], now: float, standing: StandingClaims | None
) -> Attempt | None:
    """Apply ``ops`` to ``state`` at ``now``, then the waiting claims of ``standing`` the try
    readied jobs for (appended to ``ops``). None when an operation crashed: it was failed and
    taken out of ``ops``, and ``state`` may be half changed (read it again)."""
    waiting = standing.waiting_on() if standing is not None else ()
    before = {name: state.readied_in.get(name, 0) for name in waiting}
    results: Results = []
    for op in ops:
        if not _apply_one(state, op, now, results):
            ops.remove(op)
            return None
    expired = state.expire(now)
    if standing is not None and before:
        joined = _join_waiting_claims(state, standing, ops, results, before=before, now=now)
        if not joined:
            return None
    return Attempt(new_id(), results, finished=list(state.finished), expired=expired)


def _apply_one(state: QueueState, op: Pending, now: float, results: Results) -> bool:
    """Apply ``op`` and note its outcome; False (the op failed) when it crashed."""
    try:
        results.append((op, True, op.op.apply(state, now)))
    except ObjqError as refused:
        # Transitions check before they change anything: the state is intact.
        results.append((op, False, refused))
    except Exception as crash:
        # A bug may have left the state half-changed: fail this op, start again.
        log.exception("operation failed unexpectedly; re-reading the state")
        op.future.set_exception(crash)
        return False
    return True


def _join_waiting_claims(
    state: QueueState,
    standing: StandingClaims,
    ops: list[Pending],
    results: Results,
    *,
    before: dict[str, int],
    now: float,
) -> bool:
    """Apply the waiting claims this try readied jobs for, as members of the batch (a retry
    applies them again); False when one crashed (see :func:`_apply_one`)."""
    readied = {name: state.readied_in.get(name, 0) - n for name, n in before.items()}
    readied = {name: n for name, n in readied.items() if n > 0}
    if not readied:
        return True

    def fits(op: Op[Any]) -> bool:
        return all(_cached(state, ref) for _, ref in runs_needed(state, [op], now))

    for op, future in standing.take(readied, fits):
        if not future.set_running_or_notify_cancel():
            continue
        joined = Pending(op, future)
        ops.append(joined)
        if not _apply_one(state, joined, now, results):
            ops.remove(joined)
            return False
    return True


def _cached(state: QueueState, ref: RunRef | KeyRunRef) -> bool:
    """Whether the run ``ref`` names has been read (a transition may use it)."""
    contents = state.run_contents if isinstance(ref, RunRef) else state.key_contents
    return ref.key in contents
