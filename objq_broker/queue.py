"""``Queue``: the thread-safe, synchronous API over a committer (the group-commit engine).

Every method builds one operation (:mod:`objq_broker.builders`, which checks the arguments) and
submits it to the next batch through the queue's :class:`~objq_broker.core.QueueCore`, which
owns the committer, loads payloads kept out of line and wakes claimers. Enqueues and claims
return only once durable. Acks, nacks, heartbeats and releases wait too by default (so a stale
lease raises :class:`~objq_broker.errors.LeaseLost` at the call); pass ``wait=False`` to return
as soon as the operation is submitted, as the framework integrations do: a lost ack in a crash
only means a redelivery, which at-least-once delivery allows. ``flush()`` and ``close()`` wait
for everything submitted.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar, Unpack

from objq_broker import builders
from objq_broker.builders import Delay, Delivery, JobOptions, default_owner, heartbeat_interval
from objq_broker.core import (
    DEFAULT_MAX_POLL_SECONDS,
    DEFAULT_POLL_SECONDS,
    ClaimOptions,
    QueueCore,
    QueueOptions,
    settle,
)
from objq_broker.engine.batch import EngineMetrics
from objq_broker.engine.parts import Forwarded
from objq_broker.engine.port import Committer
from objq_broker.model.checks import Where, checked_timeout
from objq_broker.model.ops import (
    DeadLetters,
    Expire,
    GetConfig,
    Op,
    QueueNames,
    Workers,
    WriteBudget,
)
from objq_broker.model.records import Job, JobState, NackResult, QueueConfig
from objq_broker.model.values import QueueStats, StagedBodies, StagedRun
from objq_broker.model.workers import Worker
from objq_broker.storage import ObjectStore
from objq_broker.storage.metered import MeteredStore, StorageMeter

T = TypeVar("T")
log = logging.getLogger("objq_broker.queue")

__all__ = [
    "DEFAULT_MAX_POLL_SECONDS",
    "DEFAULT_POLL_SECONDS",
    "Delay",
    "Delivery",
    "Queue",
    "default_owner",
]


class Queue:
    """A handle on every queue of one namespace (a store URL). Thread-safe.

    >>> with Queue("memory://doc-example") as q:
    ...     job = q.enqueue("emails", b"hello")
    ...     [delivery] = q.claim("emails")
    ...     q.ack(delivery)
    ...     q.stats("emails").ready
    0

    An enqueue declares its queue by first use; a claim does not: claiming from a queue
    nobody declared raises :class:`~objq_broker.errors.QueueNotFound` (a typo must not wait
    for ever), unless ``implicit_queues=True``, with which it finds nothing until an enqueue
    creates the queue.

    The keywords besides ``store`` are :class:`~objq_broker.core.QueueOptions`: the queue's,
    the broker's, the engine's and the storage adapter's settings.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        store: ObjectStore | None = None,
        **options: Unpack[QueueOptions],
    ) -> None:
        #: The committer, its futures, payload loading and claimers' wake-ups.
        self.core = QueueCore(url, store=store, **options)

    @classmethod
    def from_core(cls, core: QueueCore) -> Queue:
        """A queue over ``core``, sharing its committer (``AsyncQueue.sync``): closing either
        closes both."""
        queue = cls.__new__(cls)
        queue.core = core
        return queue

    def __repr__(self) -> str:
        return f"Queue({self.store.url!r})"

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- what the core holds ---------------------------------------------------------------

    store = Forwarded[MeteredStore](
        "core", "The store, every request to it counted (:attr:`storage_meter`) for the metrics."
    )

    @property
    def storage_meter(self) -> StorageMeter:
        return self.core.store.meter

    committer = Forwarded[Committer](
        "core",
        "Where operations go: the local group-commit engine, or a broker that commits for "
        "every process of the namespace.",
    )
    owner = Forwarded[str](
        "core",
        "Who claims hold jobs for unless a claim names another (``objq workers`` shows it).",
    )
    implicit_queues = Forwarded[bool](
        "core", "Claims from a queue nobody declared find nothing instead of raising."
    )
    poll_seconds = Forwarded[float](
        "core", "How long a claimer first waits after a claim that found nothing."
    )
    max_poll_seconds = Forwarded[float](
        "core", "The longest a claimer waits between claims that find nothing."
    )
    closed = Forwarded[bool]("committer", "Whether the queue was closed.")
    commit_deadline_seconds = Forwarded[float](
        "committer", "How long one commit keeps retrying before its operations fail."
    )

    # --- the core's futures, for consumers that do not block (see QueueCore) ---------------

    def submit(self, op: Op[T]) -> Future[T]:
        """Submit an operation built by :mod:`objq_broker.builders`; the future resolves once
        it is durable."""
        return self.core.submit(op)

    def submit_many(self, ops: Sequence[Op[Any]]) -> list[Future[Any]]:
        """Submit several operations at once, to be committed together; a future for each."""
        return self.core.submit_many(ops)

    def submit_claim(
        self, queues: str | Sequence[str], n: int = 1, **options: Unpack[ClaimOptions]
    ) -> Future[list[Delivery]]:
        """Lease up to ``n`` ready jobs, from one queue or several, without waiting."""
        return self.core.submit_claim(queues, n, **options)

    def then_fill(self, claim: Future[list[Delivery]]) -> Future[list[Delivery]]:
        """The deliveries of ``claim`` with their payloads loaded, without blocking."""
        return self.core.then_fill(claim)

    def fill(self, job: Job, *, lenient: bool = False) -> Job:
        """``job`` with its payload loaded, if the state keeps it out of line."""
        return self.core.fill(job, lenient=lenient)

    def fill_deliveries(self, deliveries: list[Delivery]) -> list[Delivery]:
        """``deliveries`` with their payloads loaded; poison jobs dead-lettered, left out."""
        return self.core.fill_deliveries(deliveries)

    def next_poll_wait(self, found: bool) -> float:
        """How long a claimer waits before looking again, after a claim that ``found`` jobs
        or not."""
        return self.core.next_poll_wait(found)

    def on_arrivals(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener`` whenever jobs may have become claimable; returns the function
        that stops the calls (see :meth:`QueueCore.on_arrivals`)."""
        return self.core.on_arrivals(listener)

    # --- queues ----------------------------------------------------------------------------

    def declare(self, queue: str, **config: Any) -> bool:
        """Declare ``queue`` (idempotent; declaring it again counts as using it). ``config``
        sets a new queue's defaults: max_attempts, backoff_base_seconds, backoff_cap_seconds,
        lease_seconds, dead_ttl_seconds, idempotency_seconds, and expires_seconds (delete the
        queue once nobody has claimed from it, heartbeated its jobs or declared it for that
        long, as kombu's ``x-expires``; None, the default: never)."""
        return self.core.call(builders.declare(queue, config))

    def configure(self, queue: str, **changes: float | None) -> QueueConfig:
        """Change the stored defaults of a declared queue."""
        return self.core.call(builders.configure(queue, changes))

    def config(self, queue: str) -> QueueConfig:
        return self.core.call(GetConfig(builders.queue_name(queue)))

    def set_write_budget(self, writes_per_second: float | None) -> float | None:
        """Allow at most this many state writes per second, by every process of the
        namespace together (None: no limit). Latency rises to match; nothing is lost
        (``engine.budget``, ``objq budget``)."""
        return self.core.call(builders.set_write_budget(writes_per_second))

    def workers(self) -> list[Worker]:
        """Who holds jobs: each lease holder with its queues, jobs held, oldest claim and
        last heartbeat, and those whose leases ran out lately (``model.workers``)."""
        return self.core.call(Workers())

    def write_budget(self) -> float | None:
        """The namespace's write budget, in state writes per second (None: none)."""
        return self.core.call(WriteBudget())

    def purge(self, queue: str) -> int:
        """Delete the queue's ready and delayed jobs; returns how many."""
        return self.core.call(builders.purge(queue))

    def delete_queue(self, queue: str) -> int:
        """Remove the queue with its jobs and dead letters, and every kombu binding to it
        (once the commit landed); returns how many jobs went."""
        return self.core.call(builders.delete_queue(queue))

    # --- producing -------------------------------------------------------------------------

    def enqueue(
        self,
        queue: str,
        payload: bytes,
        *,
        key: str | None = None,
        **options: Unpack[JobOptions],
    ) -> Job:
        """Add one job; durable when this returns. A ``key`` seen within the queue's
        idempotency window returns the earlier job instead of adding a duplicate.
        ``options``: :class:`~objq_broker.builders.JobOptions` (priority, delay,
        max_attempts)."""
        op = builders.enqueue(queue, [payload], keys=None if key is None else [key], **options)
        [job] = self.core.call(op)
        return self.core.fill(job)

    def enqueue_many(
        self,
        queue: str,
        payloads: Iterable[bytes],
        *,
        keys: Sequence[str | None] | None = None,
        **options: Unpack[JobOptions],
    ) -> list[Job]:
        """Add many jobs in one commit: all of them are durable, or none."""
        op = builders.enqueue(queue, payloads, keys=keys, **options)
        return [self.core.fill(job) for job in self.core.call(op)]

    def enqueue_staged(
        self,
        queue: str,
        staged: Sequence[StagedBodies],
        *,
        write_id: str,
        **options: Unpack[JobOptions],
    ) -> int | None:
        """Add one job per entry of bodies objects already written (by the partitions of a
        Spark write, say), all in one commit: every job is durable, or none.

        The objects must be in the format of ``bodies/`` objects (see
        :mod:`objq_broker.model.bodies`); the state counts their references and deletes them
        once their last job finished. A retry with the same ``write_id`` within the queue's
        idempotency window adds nothing and returns None; else the number of jobs added."""
        return self.core.call(builders.enqueue_staged(queue, staged, write_id=write_id, **options))

    def enqueue_runs(self, queue: str, runs: Sequence[StagedRun], *, write_id: str) -> int | None:
        """Add the jobs of runs already written (by the tasks of a Spark write), in one
        commit that adds a reference per run: the jobs never pass through the state's head.

        Each run (:mod:`objq_broker.model.runs` format, jobs numbered from 0) refers to the
        entries of one bodies object written with it; both are deleted once their last job
        finished. The runs take their place in the queue after every job enqueued before, in
        the order given. Idempotent by ``write_id`` as :meth:`enqueue_staged`."""
        return self.core.call(builders.enqueue_runs(queue, runs, write_id=write_id))

    # --- consuming -------------------------------------------------------------------------

    def claim(
        self,
        queue: str | Sequence[str],
        n: int = 1,
        *,
        timeout: float | None = None,
        **options: Unpack[ClaimOptions],
    ) -> list[Delivery]:
        """Lease up to ``n`` ready jobs, best priority first, from one queue or several (in
        turn, so none starves: ``docs/groups.md``). With ``timeout``, wait up to that many
        seconds for at least one; without, return at once (maybe empty). Payloads kept out of
        line are read in parallel before this returns. ``options``:
        :class:`~objq_broker.core.ClaimOptions` (lease, owner, ordered)."""
        timeout = checked_timeout(timeout, Where("claim from {}", queue))
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            seen = self.core.commits
            found = self.core.claim_filled(queue, n, options, end)
            pause = self.core.next_poll_wait(bool(found))
            if found or end is None:
                return found
            remaining = end - time.monotonic()
            if remaining <= 0:
                return found
            # Woken early by a later local commit (a local enqueue, say); else poll storage.
            since = functools.partial(self.core.committed_since, seen + 1)
            self.core.wait_until(since, min(remaining, pause))

    def ack(
        self,
        delivery: Delivery,
        *,
        outcome: str = "done",
        error: str | None = None,
        wait: bool = True,
    ) -> None:
        """Finish a delivery. Raises :class:`LeaseLost` if its lease was lost (when waiting).

        ``outcome`` is what the archive records: "done", or, for a framework that settles a
        failed run with an ack, "failed" (for good) or "retried" (sent again as a new job),
        with ``error``."""
        op = builders.ack(delivery, outcome=outcome, error=error)
        settle(self.core, op, wait, "ack", delivery)

    def note_outcome(
        self,
        job_id: str,
        queue: str,
        outcome: str,
        *,
        token: str,
        error: str | None = None,
        wait: bool = True,
    ) -> None:
        """Archive that the run of job ``job_id`` of ``queue`` "failed" or was "retried" as a
        new job, for a framework that acked the job before running it (Celery's default). The
        job's own record keeps its outcome "done"; readers of the archive (``objq report``,
        the ``objq`` Spark source) take the note's. ``token``: the lease token of the delivery
        that ran it (``Delivery.token``); a job still queued must be held under it
        (``LeaseLost`` otherwise)."""
        op = builders.note_outcome(job_id, queue, outcome, error, token)
        settle(self.core, op, wait, "note_outcome")

    def nack(
        self,
        delivery: Delivery,
        *,
        error: str | None = None,
        retry: bool = True,
        delay: Delay = None,
        wait: bool = True,
    ) -> NackResult | None:
        """Fail a delivery: retry after the queue's backoff (or ``delay``), or dead-letter it
        when ``retry`` is false or its attempts are spent. Returns 'retry' or 'dead'."""
        op = builders.nack(delivery, error=error, retry=retry, delay=delay)
        return settle(self.core, op, wait, "nack", delivery)

    def heartbeat(
        self, deliveries: Sequence[Delivery], *, lease: Delay = None, wait: bool = True
    ) -> list[bool] | None:
        """Extend the leases of many deliveries in one operation; says which are still held."""
        op = builders.heartbeat(deliveries, lease=lease)
        return settle(self.core, op, wait, "heartbeat")

    def release(self, deliveries: Sequence[Delivery], *, wait: bool = True) -> list[bool] | None:
        """Give back unprocessed deliveries; no attempt is counted. Says which were held."""
        return settle(self.core, builders.release(deliveries), wait, "release")

    @contextlib.contextmanager
    def keep_alive(
        self, deliveries: Sequence[Delivery], *, every: float | None = None
    ) -> Iterator[None]:
        """Heartbeat ``deliveries`` in the background while the block runs a long job."""
        if not deliveries:
            yield
            return
        stop = threading.Event()
        interval = heartbeat_interval(deliveries, every)

        def beat() -> None:
            while not stop.wait(interval):
                try:
                    self.heartbeat(deliveries)
                except Exception as exc:  # keep beating: the next try may reach storage
                    log.warning("heartbeat failed: %s", exc)

        thread = threading.Thread(target=beat, name="objq-heartbeat", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    # --- dead letters ----------------------------------------------------------------------

    def dead_letters(self, queue: str) -> list[Job]:
        dead = self.core.call(DeadLetters(builders.queue_name(queue)))
        return [self.core.fill(job, lenient=True) for job in dead]

    def retry_dead(self, queue: str, ids: Sequence[str] | None = None) -> list[str]:
        """Move dead letters (all, or these ids) back to the queue with fresh attempts."""
        return self.core.call(builders.retry_dead(queue, ids))

    def purge_dead(self, queue: str, ids: Sequence[str] | None = None) -> int:
        """Delete dead letters (all, or these ids) for good; returns how many."""
        return self.core.call(builders.purge_dead(queue, ids))

    # --- inspecting ------------------------------------------------------------------------

    def queues(self) -> list[str]:
        return self.core.call(QueueNames())

    def stats(self, queue: str) -> QueueStats:
        [found] = self.stats_many([queue])
        return found

    def stats_many(self, queues: Sequence[str]) -> list[QueueStats]:
        """Counts of several queues from one state: a job moving between them (a delay queue
        and its queue, say) is never counted twice or missed."""
        return self.core.call(builders.stats(queues))

    def job(self, job_id: str) -> tuple[JobState, Job] | None:
        """A job's state ('ready', 'delayed', 'in-flight', 'dead') and record, if in the state."""
        found = self.core.call(builders.find_job(job_id))
        return None if found is None else (found[0], self.core.fill(found[1], lenient=True))

    def jobs(
        self, queue: str, *, state: JobState | None = None, limit: int | None = None
    ) -> list[tuple[JobState, Job]]:
        """Jobs of ``queue`` in claim order (dead letters last), optionally one state only."""
        rows = self.core.call(builders.list_jobs(queue, state, limit))
        return [(where, self.core.fill(job, lenient=True)) for where, job in rows]

    def expire(self) -> int:
        """Return stale leases to their queues now (commits also do this on their own)."""
        return self.core.call(Expire())

    def metrics(self) -> EngineMetrics:
        return self.committer.metrics

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every operation submitted so far is durable (and the objects its
        commits freed are deleted)."""
        self.committer.flush(timeout)

    def close(self) -> None:
        """Commit what is pending and stop the writer. The store stays usable by others."""
        self.committer.close()
