"""What an operation did to jobs, counted from its result: the numbers behind a process's
``enqueued``, ``claimed``, ``acked``, ``retried``, ``failed``, ``dead_lettered`` and ``released``
counters.

Counted from results, not from the calls: an enqueue whose idempotency key was live returns the
earlier job and counts nothing, a claim counts the jobs it leased, and a nack counts as a retry
or a dead letter by what the state decided. A run the framework reports as failed for good, or
as failed and sent again as a new job (an ack or a note saying so), counts as failed or
retried. An ``Expire`` operation counts the leases it expired; the leases a commit expires on
its own (most of them) are counted by the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from objq_broker.model import ops

#: The job events counted, in the order they are reported.
JOB_EVENTS = (
    "enqueued",
    "claimed",
    "acked",
    "retried",
    "failed",
    "dead_lettered",
    "released",
    "expired",
)


def job_events(op: object, result: Any) -> dict[str, int]:
    """The job events of ``op``, which committed with ``result``; empty for operations that
    change no job (declarations, reads, heartbeats, broker records)."""
    # By the operation's class, looked up once: counted for every operation of every commit.
    count = _COUNTS.get(type(op))
    return {} if count is None else count(op, result)


def _enqueued(op: ops.Enqueue, result: Any) -> dict[str, int]:
    # A live idempotency key answers with the earlier job, whose id is not the new one.
    # (Not strict: counting must never fail a commit that landed.)
    pairs = zip(op.items, result, strict=False)
    return {"enqueued": sum(job.id == new.id for new, job in pairs)}


def _acked(op: ops.Ack, result: Any) -> dict[str, int]:
    return {"acked": 1} if op.outcome == "done" else {"acked": 1, op.outcome: 1}


_COUNTS: dict[type, Callable[[Any, Any], dict[str, int]]] = {
    ops.Enqueue: _enqueued,
    # None: this write id was committed before.
    ops.EnqueueStaged: lambda op, result: {"enqueued": result or 0},
    ops.EnqueueRuns: lambda op, result: {"enqueued": result or 0},
    ops.Claim: lambda op, result: {"claimed": len(result)},
    ops.Ack: _acked,
    ops.NoteOutcome: lambda op, result: {op.outcome: 1},
    ops.Nack: lambda op, result: {"dead_lettered": 1} if result == "dead" else {"retried": 1},
    ops.Release: lambda op, result: {"released": sum(bool(done) for done in result)},
    ops.Expire: lambda op, result: {"expired": result},
}
