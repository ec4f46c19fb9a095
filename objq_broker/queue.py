"""``Queue``: the thread-safe, synchronous API over a committer (the group-commit engine).

Every method builds one operation (:mod:`objq_broker.ops`, which checks the arguments) and
submits it to the next batch. Enqueues and claims return only once durable. Acks, nacks,
heartbeats and releases wait too by default (so a stale lease raises
:class:`~objq_broker.errors.LeaseLost` at the call); pass ``wait=False`` to return as soon as
the operation is submitted, as the framework integrations do: a lost ack in a crash only means
a redelivery, which at-least-once delivery allows. ``flush()`` and ``close()`` wait for
everything submitted.

``Queue`` is built in layers: :mod:`objq_broker.queue_base` (the committer, futures, payloads
and claimers' wake-ups), :mod:`objq_broker.queue_admin` (managing and inspecting queues), and
this module (moving jobs: enqueue, claim, ack, nack, heartbeat, release).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

from objq_broker import ops
from objq_broker.broker.settings import BrokerSettings, broker_settings
from objq_broker.engine.options import (
    QueueLimits,
    check_engine_settings,
    engine_part,
    resolve_store,
)
from objq_broker.engine.port import Committer
from objq_broker.errors import LeaseLost
from objq_broker.model.checks import checked_timeout, shown
from objq_broker.model.records import Job, NackResult
from objq_broker.model.values import StagedBodies, StagedRun
from objq_broker.ops import Delay, Delivery, default_owner
from objq_broker.queue_admin import QueueAdmin
from objq_broker.queue_base import open_committer
from objq_broker.storage import ObjectStore
from objq_broker.storage.metered import MeteredStore

T = TypeVar("T")
log = logging.getLogger("objq_broker.queue")

#: How soon ``claim(timeout=...)`` looks at the state again when a claim found nothing. The
#: wait doubles while claims keep finding nothing, up to ``DEFAULT_MAX_POLL_SECONDS`` (each
#: look is a storage read in direct mode), and starts again from here when one finds a job. A
#: commit of this process (a local enqueue) wakes claimers at once whatever the wait.
DEFAULT_POLL_SECONDS = 0.5
DEFAULT_MAX_POLL_SECONDS = 1.0

__all__ = [
    "DEFAULT_MAX_POLL_SECONDS",
    "DEFAULT_POLL_SECONDS",
    "Delay",
    "Delivery",
    "Queue",
    "default_owner",
]


class Queue(QueueAdmin):
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
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        store: ObjectStore | None = None,
        owner: str | None = None,
        poll_seconds: float = DEFAULT_POLL_SECONDS,
        max_poll_seconds: float = DEFAULT_MAX_POLL_SECONDS,
        broker: str | BrokerSettings | None = None,
        implicit_queues: bool = False,
        **options: Any,
    ) -> None:
        settings = (
            broker if isinstance(broker, BrokerSettings) else broker_settings(broker, options)
        )
        own = {
            "owner": owner,
            "poll_seconds": poll_seconds,
            "max_poll_seconds": max_poll_seconds,
            "implicit_queues": implicit_queues,
        }
        check_engine_settings(own | engine_part(options), QueueLimits)
        opened, engine_options = resolve_store(url, store, options, "Queue")
        #: The store, every request to it counted (``storage_meter``) for the metrics.
        self.store = MeteredStore(opened)
        self.storage_meter = self.store.meter
        #: Where operations go: the local group-commit engine, or a broker that commits for
        #: every process of the namespace.
        self.committer: Committer = open_committer(self.store, settings, engine_options)
        self.owner = owner or default_owner()
        #: Claims from a queue nobody declared find nothing instead of raising.
        self.implicit_queues = implicit_queues
        self.poll_seconds = poll_seconds
        self.max_poll_seconds = max(max_poll_seconds, poll_seconds)
        self._poll_wait = poll_seconds  # grows while claims find nothing
        self._arrivals = threading.Condition()
        self._commits = 0  # batches committed; claimers wait for it to move
        self._arrival_listeners: list[Callable[[], None]] = []
        self._readied_seen: object = None
        self.committer.on_commit(self._wake_claimers)

    def __repr__(self) -> str:
        return f"Queue({self.store.url!r})"

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- producing -------------------------------------------------------------------------

    def enqueue(
        self,
        queue: str,
        payload: bytes,
        *,
        priority: int = 0,
        delay: Delay = None,
        max_attempts: int | None = None,
        key: str | None = None,
    ) -> Job:
        """Add one job; durable when this returns. A ``key`` seen within the queue's
        idempotency window returns the earlier job instead of adding a duplicate."""
        op = ops.enqueue(
            queue,
            [payload],
            priority=priority,
            delay=delay,
            max_attempts=max_attempts,
            keys=None if key is None else [key],
        )
        [job] = self.submit(op).result()
        return self.fill(job)

    def enqueue_many(
        self,
        queue: str,
        payloads: Iterable[bytes],
        *,
        priority: int = 0,
        delay: Delay = None,
        max_attempts: int | None = None,
        keys: Sequence[str | None] | None = None,
    ) -> list[Job]:
        """Add many jobs in one commit: all of them are durable, or none."""
        op = ops.enqueue(
            queue, payloads, priority=priority, delay=delay, max_attempts=max_attempts, keys=keys
        )
        return [self.fill(job) for job in self.submit(op).result()]

    def enqueue_staged(
        self,
        queue: str,
        staged: Sequence[StagedBodies],
        *,
        write_id: str,
        priority: int = 0,
        delay: Delay = None,
        max_attempts: int | None = None,
    ) -> int | None:
        """Add one job per entry of bodies objects already written (by the partitions of a
        Spark write, say), all in one commit: every job is durable, or none.

        The objects must be in the format of ``bodies/`` objects (see
        :mod:`objq_broker.model.bodies`); the state counts their references and deletes them
        once their last job finished. A retry with the same ``write_id`` within the queue's
        idempotency window adds nothing and returns None; else the number of jobs added."""
        op = ops.enqueue_staged(
            queue,
            staged,
            write_id=write_id,
            priority=priority,
            delay=delay,
            max_attempts=max_attempts,
        )
        return self.submit(op).result()

    def enqueue_runs(self, queue: str, runs: Sequence[StagedRun], *, write_id: str) -> int | None:
        """Add the jobs of runs already written (by the tasks of a Spark write), in one
        commit that adds a reference per run: the jobs never pass through the state's head.

        Each run (:mod:`objq_broker.model.runs` format, jobs numbered from 0) refers to the
        entries of one bodies object written with it; both are deleted once their last job
        finished. The runs take their place in the queue after every job enqueued before, in
        the order given. Idempotent by ``write_id`` as :meth:`enqueue_staged`."""
        return self.submit(ops.enqueue_runs(queue, runs, write_id=write_id)).result()

    # --- consuming -------------------------------------------------------------------------

    def claim(
        self,
        queue: str | Sequence[str],
        n: int = 1,
        *,
        lease: Delay = None,
        owner: str | None = None,
        timeout: float | None = None,
    ) -> list[Delivery]:
        """Lease up to ``n`` ready jobs, best priority first, from one queue or several (each
        in the order given until ``n`` are found). With ``timeout``, wait up to that many
        seconds for at least one; without, return at once (maybe empty). Payloads kept out of
        line are read in parallel before this returns."""
        timeout = checked_timeout(timeout, f"claim from {shown(queue, 80)}")
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            seen = self._commits
            found = self._claim_once(queue, n, lease, owner, end)
            pause = self.next_poll_wait(bool(found))
            if found or end is None:
                return found
            remaining = end - time.monotonic()
            if remaining <= 0:
                return found
            # Woken early by a later local commit (a local enqueue, say); else poll storage.
            with self._arrivals:
                self._arrivals.wait_for(
                    functools.partial(self._committed_since, seen + 1), min(remaining, pause)
                )

    def _claim_once(
        self,
        queue: str | Sequence[str],
        n: int,
        lease: Delay,
        owner: str | None,
        end: float | None,
    ) -> list[Delivery]:
        """One claim, payloads loaded. If it finds nothing and there is time left before
        ``end``, a second one waits at the broker for jobs when there is one. (The first goes
        with this process's other operations, its acks say, in one request.)"""
        while True:
            claim = self.submit_claim(queue, n, lease=lease, owner=owner)
            found = self.then_fill(claim).result()
            if found or not claim.result():
                break
            # Every job it found was poison, dead-lettered (see fill_deliveries): look again,
            # rather than say the queue is empty.
        left = 0.0 if end is None else end - time.monotonic()
        if found or left <= 0:
            return found
        jobs = self.committer.claim_waiting(self._claim_op(queue, n, lease, owner), left)
        if jobs is None:
            return found
        claimed: Future[list[Delivery]] = Future()
        claimed.set_result(ops.deliveries(jobs))
        return self.then_fill(claimed).result()

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
        op = ops.ack(delivery, outcome=outcome, error=error)
        self._settle(self.submit(op), wait, "ack", delivery)

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
        op = ops.note_outcome(job_id, queue, outcome, error, token)
        self._settle(self.submit(op), wait, "note_outcome")

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
        op = ops.nack(delivery, error=error, retry=retry, delay=delay)
        return self._settle(self.submit(op), wait, "nack", delivery)

    def heartbeat(
        self, deliveries: Sequence[Delivery], *, lease: Delay = None, wait: bool = True
    ) -> list[bool] | None:
        """Extend the leases of many deliveries in one operation; says which are still held."""
        return self._settle(self.submit(ops.heartbeat(deliveries, lease=lease)), wait, "heartbeat")

    def release(self, deliveries: Sequence[Delivery], *, wait: bool = True) -> list[bool] | None:
        """Give back unprocessed deliveries; no attempt is counted. Says which were held."""
        return self._settle(self.submit(ops.release(deliveries)), wait, "release")

    def _settle(
        self, future: Future[T], wait: bool, what: str, delivery: Delivery | None = None
    ) -> T | None:
        if wait:
            return future.result()

        def report(done: Future[T]) -> None:
            exc = done.exception()
            if exc is None:
                return
            level = logging.INFO if isinstance(exc, LeaseLost) else logging.ERROR
            log.log(level, "%s of %s failed: %s", what, delivery.id if delivery else "-", exc)

        future.add_done_callback(report)
        return None

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

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every operation submitted so far is durable (and the objects its
        commits freed are deleted)."""
        self.committer.flush(timeout)

    def close(self) -> None:
        """Commit what is pending and stop the writer. The store stays usable by others."""
        self.committer.close()


def heartbeat_interval(deliveries: Sequence[Delivery], every: float | None) -> float:
    """How often to extend these leases: a third of what is left of the first one."""
    if every is not None:
        return every
    lease = deliveries[0].job.lease if deliveries else None
    span = (lease.expires_at - time.time()) if lease is not None else 30.0
    return max(span / 3.0, 0.05)
