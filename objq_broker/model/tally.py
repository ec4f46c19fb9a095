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
    match op:
        case ops.Enqueue():
            # A live idempotency key answers with the earlier job, whose id is not the new one.
            # (Not strict: counting must never fail a commit that landed.)
            pairs = zip(op.items, result, strict=False)
            return {"enqueued": sum(job.id == new.id for new, job in pairs)}
        case ops.EnqueueStaged() | ops.EnqueueRuns():
            return {"enqueued": result or 0}  # None: this write id was committed before
        case ops.Claim():
            return {"claimed": len(result)}
        case ops.Ack(outcome="done"):
            return {"acked": 1}
        case ops.Ack():
            return {"acked": 1, op.outcome: 1}
        case ops.NoteOutcome():
            return {op.outcome: 1}
        case ops.Nack():
            return {"dead_lettered": 1} if result == "dead" else {"retried": 1}
        case ops.Release():
            return {"released": sum(bool(done) for done in result)}
        case ops.Expire():
            return {"expired": result}
    return {}
