"""The methods of :class:`~objq_broker.queue.Queue` that manage and inspect a namespace rather
than move jobs through it: declaring, configuring, purging and deleting queues, the write
budget, dead letters, and reading queues, jobs, lease holders and metrics. Every one is one
operation, durable (or read from the state as stored) when it returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from objq_broker import ops
from objq_broker.engine.batch import EngineMetrics
from objq_broker.model.ops import (
    DeadLetters,
    Expire,
    GetConfig,
    QueueNames,
    Workers,
    WriteBudget,
)
from objq_broker.model.records import Job, JobState, QueueConfig
from objq_broker.model.values import QueueStats
from objq_broker.model.workers import Worker
from objq_broker.queue_base import QueueBase


class QueueAdmin(QueueBase):
    """The managing and inspecting layer of :class:`~objq_broker.queue.Queue`."""

    # --- queues ----------------------------------------------------------------------------

    def declare(self, queue: str, **config: Any) -> bool:
        """Declare ``queue`` (idempotent; declaring it again counts as using it). ``config``
        sets a new queue's defaults: max_attempts, backoff_base_seconds, backoff_cap_seconds,
        lease_seconds, dead_ttl_seconds, idempotency_seconds, and expires_seconds (delete the
        queue once nobody has claimed from it, heartbeated its jobs or declared it for that
        long, as kombu's ``x-expires``; None, the default: never)."""
        return self.submit(ops.declare(queue, config)).result()

    def configure(self, queue: str, **changes: float | None) -> QueueConfig:
        """Change the stored defaults of a declared queue."""
        return self.submit(ops.configure(queue, changes)).result()

    def config(self, queue: str) -> QueueConfig:
        return self.submit(GetConfig(ops.queue_name(queue))).result()

    def set_write_budget(self, writes_per_second: float | None) -> float | None:
        """Allow at most this many state writes per second, by every process of the
        namespace together (None: no limit). Latency rises to match; nothing is lost
        (``engine.budget``, ``objq budget``)."""
        return self.submit(ops.set_write_budget(writes_per_second)).result()

    def workers(self) -> list[Worker]:
        """Who holds jobs: each lease holder with its queues, jobs held, oldest claim and
        last heartbeat, and those whose leases ran out lately (``model.workers``)."""
        return self.submit(Workers()).result()

    def write_budget(self) -> float | None:
        """The namespace's write budget, in state writes per second (None: none)."""
        return self.submit(WriteBudget()).result()

    def purge(self, queue: str) -> int:
        """Delete the queue's ready and delayed jobs; returns how many."""
        return self.submit(ops.purge(queue)).result()

    def delete_queue(self, queue: str) -> int:
        """Remove the queue with its jobs and dead letters, and every kombu binding to it
        (once the commit landed); returns how many jobs went."""
        return self.submit(ops.delete_queue(queue)).result()

    # --- dead letters ----------------------------------------------------------------------

    def dead_letters(self, queue: str) -> list[Job]:
        dead = self.submit(DeadLetters(ops.queue_name(queue))).result()
        return [self.fill(job, lenient=True) for job in dead]

    def retry_dead(self, queue: str, ids: Sequence[str] | None = None) -> list[str]:
        """Move dead letters (all, or these ids) back to the queue with fresh attempts."""
        return self.submit(ops.retry_dead(queue, ids)).result()

    def purge_dead(self, queue: str, ids: Sequence[str] | None = None) -> int:
        """Delete dead letters (all, or these ids) for good; returns how many."""
        return self.submit(ops.purge_dead(queue, ids)).result()

    # --- inspecting ------------------------------------------------------------------------

    def queues(self) -> list[str]:
        return self.submit(QueueNames()).result()

    def stats(self, queue: str) -> QueueStats:
        [found] = self.stats_many([queue])
        return found

    def stats_many(self, queues: Sequence[str]) -> list[QueueStats]:
        """Counts of several queues from one state: a job moving between them (a delay queue
        and its queue, say) is never counted twice or missed."""
        return self.submit(ops.stats(queues)).result()

    def job(self, job_id: str) -> tuple[JobState, Job] | None:
        """A job's state ('ready', 'delayed', 'in-flight', 'dead') and record, if in the state."""
        found = self.submit(ops.find_job(job_id)).result()
        return None if found is None else (found[0], self.fill(found[1], lenient=True))

    def jobs(
        self, queue: str, *, state: JobState | None = None, limit: int | None = None
    ) -> list[tuple[JobState, Job]]:
        """Jobs of ``queue`` in claim order (dead letters last), optionally one state only."""
        rows = self.submit(ops.list_jobs(queue, state, limit)).result()
        return [(where, self.fill(job, lenient=True)) for where, job in rows]

    def expire(self) -> int:
        """Return stale leases to their queues now (commits also do this on their own)."""
        return self.submit(Expire()).result()

    def metrics(self) -> EngineMetrics:
        return self.committer.metrics
