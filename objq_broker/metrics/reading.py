"""One read of a store, reduced to the numbers a scrape exposes.

It reads what ``objq status`` reads, the same way: the read-only
:class:`~objq_broker.engine.snapshot.Snapshot` (the state object read once and decoded, plus
the runs holding delayed jobs that came due since the last commit), never the commit loop.
Looking at a namespace must not change it, and a scrape must not take part in the broker
election or add a writer to it.
"""

from __future__ import annotations

from dataclasses import dataclass

from objq_broker.engine.snapshot import ACTIVE_CLIENT_SECONDS, Snapshot
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

    #: False until something was ever committed (the state object does not exist yet).
    exists: bool
    #: The state's version: how many commits made it, by every process of the namespace.
    commits: int
    size_bytes: int
    #: Unix time of the last commit (the writer's clock); None before the first.
    committed_at: float | None
    #: Unix time of the read (this process's clock).
    read_at: float
    #: How many times a broker took over the namespace (its epoch).
    takeovers: int
    broker_registered: bool
    active_clients: int
    queues: list[QueueReading]
    #: Finished jobs whose archive records the state still holds (``engine.archive``).
    archive_tail_records: int = 0

    @property
    def last_commit_age_seconds(self) -> float | None:
        """Seconds between the last commit and the read (never negative: clocks differ)."""
        if self.committed_at is None:
            return None
        return max(self.read_at - self.committed_at, 0.0)


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
    return StoreReading(
        exists=snap.exists,
        commits=snap.version,
        size_bytes=snap.size_bytes,
        committed_at=snap.committed_at,
        read_at=snap.read_at,
        takeovers=snap.epoch,
        broker_registered=snap.broker is not None,
        active_clients=snap.broker_clients(ACTIVE_CLIENT_SECONDS),
        queues=queues,
        archive_tail_records=len(snap.archive_tail),
    )
