"""One read of a store, reduced to the numbers a scrape exposes.

It reads what ``objq status`` reads, the same way: the read-only
:class:`~objq_broker.engine.snapshot.Snapshot` (the state object read once and decoded, plus
the runs holding delayed jobs that came due since the last commit), never the commit loop.
Looking at a namespace must not change it, and a scrape must not take part in the broker
election or add a writer to it.
"""

from __future__ import annotations

from dataclasses import dataclass

from objq_broker.engine.snapshot import Snapshot, StateSummary
from objq_broker.storage import ObjectStore

#: The states of ``objq_queue_jobs``, named as in ``objq status --json``.
JOB_STATES = ("ready", "delayed", "in_flight", "dead")


@dataclass(frozen=True)
class QueueReading:
    """One queue's counts at the moment of the read."""

    queue: str
    #: Jobs by state, one entry per name of :data:`JOB_STATES`.
    jobs: dict[str, int]
    #: Seconds since the oldest ready job was enqueued; None when none is ready.
    oldest_ready_age_seconds: float | None


@dataclass(frozen=True)
class StoreReading:
    """What one scrape learned about a namespace."""

    summary: StateSummary
    queues: list[QueueReading]


def read_store(store: ObjectStore) -> StoreReading:
    """Read ``store`` once. Raises what the read raises (an unreachable store, a missing
    bucket, a corrupt state); the caller decides what a failed scrape shows."""
    snap = Snapshot.read(store)
    queues = []
    for name in snap.queue_names():
        stats = snap.stats(name)
        counts = {
            "ready": stats.ready,
            "delayed": stats.delayed,
            "in_flight": stats.in_flight,
            "dead": stats.dead,
        }
        queues.append(QueueReading(name, counts, stats.oldest_ready_age_seconds))
    # After the queues, as objq status does: counting them may read a later state (when runs
    # it referred to were consumed meanwhile), and these facts then describe that one.
    return StoreReading(snap.summary(), queues)
