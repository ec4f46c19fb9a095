"""``Queue``: the thread-safe, synchronous API over the group-commit engine.

Every method turns into one operation of the engine's next batch. Enqueues and claims return
only once durable. Acks, nacks, heartbeats and releases wait too by default (so a stale lease
raises :class:`~objq_broker.errors.LeaseLost` at the call); pass ``wait=False`` to return as
soon as the operation is submitted, as the framework integrations do: a lost ack in a crash
only means a redelivery, which at-least-once delivery allows. ``flush()`` and ``close()`` wait
for everything submitted.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import msgspec

from objq_broker.engine import Engine, EngineMetrics
from objq_broker.errors import ConfigurationError, LeaseLost
from objq_broker.options import resolve_store
from objq_broker.records import Job, QueueConfig, encode_payload
from objq_broker.state import NewJob, QueueState, QueueStats, StagedBodies, check_queue_name
from objq_broker.storage import ObjectStore

T = TypeVar("T")
log = logging.getLogger("objq_broker.queue")

#: How often ``claim(timeout=...)`` looks at the state again while the queue is empty.
DEFAULT_POLL_SECONDS = 0.5
Delay = float | int | timedelta | None


@dataclass(frozen=True, slots=True)
class Delivery:
    """A claimed job and the lease token that proves this holder may ack or nack it."""

    job: Job
    token: str

    @property
    def id(self) -> str:
        return self.job.id

    @property
    def payload(self) -> bytes:
        return self.job.payload

    @property
    def held(self) -> tuple[str, str]:
        return (self.job.id, self.token)


def _seconds(delay: Delay, what: str) -> float:
    if delay is None:
        return 0.0
    if isinstance(delay, timedelta):
        return delay.total_seconds()
    if isinstance(delay, int | float) and not isinstance(delay, bool):
        return float(delay)
    raise ConfigurationError(f"{what}: expected seconds or a timedelta, found {delay!r}")


def default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Queue:
    """A handle on every queue of one namespace (a store URL). Thread-safe.

    >>> with Queue("memory://doc-example") as q:
    ...     job = q.enqueue("emails", b"hello")
    ...     [delivery] = q.claim("emails")
    ...     q.ack(delivery)
    ...     q.stats("emails").ready
    0
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        store: ObjectStore | None = None,
        owner: str | None = None,
        poll_seconds: float = DEFAULT_POLL_SECONDS,
        **options: Any,
    ) -> None:
        self.store, engine_options = resolve_store(url, store, options, "Queue")
        self.engine = Engine(self.store, **engine_options)
        self.owner = owner or default_owner()
        self.poll_seconds = poll_seconds
        self._rng = random.Random()
        self._arrivals = threading.Condition()
        self._commits = 0  # batches committed by this engine; claimers wait for it to move
        self.engine.on_commit(self._wake_claimers)

    def __repr__(self) -> str:
        return f"Queue({self.store.url!r})"

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _committed_since(self, count: int) -> bool:
        return self._commits > count

    def _wake_claimers(self) -> None:
        with self._arrivals:
            self._commits += 1
            self._arrivals.notify_all()

    # --- futures (shared with AsyncQueue) --------------------------------------------------

    def submit(
        self,
        fn: Callable[[QueueState, float], T],
        *,
        latest: bool = False,
        size: int = 0,
    ) -> Future[T]:
        return self.engine.submit(fn, latest=latest, size=size)

    def submit_declare(self, queue: str, **config: Any) -> Future[bool]:
        check_queue_name(queue)
        settings = QueueConfig(**config) if config else None
        return self.submit(lambda s, now: s.declare(queue, settings))

    def submit_enqueue(
        self,
        queue: str,
        payloads: Iterable[bytes],
        *,
        priority: int = 0,
        delay: Delay = None,
        max_attempts: int | None = None,
        keys: Sequence[str | None] | None = None,
    ) -> Future[list[Job]]:
        check_queue_name(queue)
        seconds = _seconds(delay, "delay")
        items: list[NewJob] = []
        size = 0
        for index, payload in enumerate(payloads):
            if not isinstance(payload, bytes | bytearray | memoryview):
                raise ConfigurationError(
                    f"enqueue to {queue!r}: expected payload bytes, found {type(payload).__name__}"
                )
            body, b64 = encode_payload(bytes(payload))
            key = keys[index] if keys is not None else None
            items.append(
                NewJob(uuid.uuid4().hex, queue, body, b64, priority, seconds, max_attempts, key)
            )
            size += len(body)
        if keys is not None and len(keys) != len(items):
            raise ConfigurationError(
                f"enqueue_many to {queue!r}: {len(items)} payloads but {len(keys)} keys"
            )
        return self.submit(lambda s, now: s.enqueue(items, now), size=size)

    def submit_claim(
        self, queue: str, n: int, *, lease: Delay = None, owner: str | None = None
    ) -> Future[list[Delivery]]:
        if n < 1:
            raise ConfigurationError(f"claim from {queue!r}: n must be >= 1, found {n}")
        # One random base per claim: a delay-queue consumer may ask for thousands at a time.
        base = uuid.uuid4().hex
        tokens = [f"{base}.{i}" for i in range(n)]
        seconds = _seconds(lease, "lease") if lease is not None else None
        who = owner or self.owner

        def claim(state: QueueState, now: float) -> list[Delivery]:
            jobs = state.claim(queue, tokens, who, now, seconds)
            return [Delivery(job, job.lease.token) for job in jobs if job.lease is not None]

        return self.engine.submit(claim, fresh=True, consumer=True)

    def submit_claim_many(
        self,
        queues: Sequence[str],
        n: int,
        *,
        lease: Delay = None,
        owner: str | None = None,
    ) -> Future[list[Delivery]]:
        """Lease up to ``n`` ready jobs from several queues in one commit, taking from each
        queue in the order given until ``n`` are found: a consumer of many queues polls them
        all with one write, not one per queue."""
        if n < 1:
            raise ConfigurationError(f"claim from {list(queues)!r}: n must be >= 1, found {n}")
        names = [check_queue_name(name) for name in queues]
        base = uuid.uuid4().hex
        tokens = [f"{base}.{i}" for i in range(n)]
        seconds = _seconds(lease, "lease") if lease is not None else None
        who = owner or self.owner

        def claim(state: QueueState, now: float) -> list[Delivery]:
            found: list[Delivery] = []
            for name in names:
                if len(found) >= n:
                    break
                jobs = state.claim(name, tokens[len(found) :], who, now, seconds)
                found += [Delivery(job, job.lease.token) for job in jobs if job.lease is not None]
            return found

        return self.engine.submit(claim, fresh=True, consumer=True)

    def submit_ack(self, delivery: Delivery) -> Future[Job]:
        job_id, token = delivery.held
        return self.submit(lambda s, now: s.ack(job_id, token, now))

    def submit_nack(
        self,
        delivery: Delivery,
        *,
        error: str | None = None,
        retry: bool = True,
        delay: Delay = None,
    ) -> Future[str]:
        job_id, token = delivery.held
        jitter = self._rng.random()
        seconds = None if delay is None else _seconds(delay, "delay")
        return self.submit(
            lambda s, now: s.nack(
                job_id, token, now, error=error, retry=retry, jitter=jitter, delay_seconds=seconds
            )
        )

    def submit_heartbeat(
        self, deliveries: Sequence[Delivery], *, lease: Delay = None
    ) -> Future[list[bool]]:
        held = [d.held for d in deliveries]
        seconds = _seconds(lease, "lease") if lease is not None else None
        return self.submit(lambda s, now: s.heartbeat(held, now, seconds))

    def submit_release(self, deliveries: Sequence[Delivery]) -> Future[list[bool]]:
        held = [d.held for d in deliveries]
        return self.submit(lambda s, now: s.release(held, now))

    # --- producing -------------------------------------------------------------------------

    def declare(self, queue: str, **config: Any) -> bool:
        """Declare ``queue`` (idempotent). ``config`` sets a new queue's defaults:
        max_attempts, backoff_base_seconds, backoff_cap_seconds, lease_seconds,
        dead_ttl_seconds, idempotency_seconds."""
        return self.submit_declare(queue, **config).result()

    def configure(self, queue: str, **changes: float) -> QueueConfig:
        """Change the stored defaults of a declared queue."""
        return self.submit(lambda s, now: s.configure(queue, dict(changes))).result()

    def config(self, queue: str) -> QueueConfig:
        return self.submit(lambda s, now: s.config(queue), latest=True).result()

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
        [job] = self.submit_enqueue(
            queue,
            [payload],
            priority=priority,
            delay=delay,
            max_attempts=max_attempts,
            keys=None if key is None else [key],
        ).result()
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
        jobs = self.submit_enqueue(
            queue, payloads, priority=priority, delay=delay, max_attempts=max_attempts, keys=keys
        ).result()
        return [self.fill(job) for job in jobs]

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
        :mod:`objq_broker.bodies`); the state counts their references and deletes them once
        their last job finished. A retry with the same ``write_id`` within the queue's
        idempotency window adds nothing and returns None; else the number of jobs added."""
        check_queue_name(queue)
        seconds = _seconds(delay, "delay")
        items = list(staged)
        total = sum(item.count for item in items)
        base = uuid.uuid4().hex[:20]  # ids made before submitting: a replay is identical
        ids = [f"{base}{n:012x}" for n in range(total)]
        return self.submit(
            lambda s, now: s.enqueue_staged(
                queue,
                items,
                ids,
                now,
                write_id=write_id,
                priority=priority,
                delay_seconds=seconds,
                max_attempts=max_attempts,
            )
        ).result()

    # --- consuming -------------------------------------------------------------------------

    def claim(
        self,
        queue: str,
        n: int = 1,
        *,
        lease: Delay = None,
        owner: str | None = None,
        timeout: float | None = None,
    ) -> list[Delivery]:
        """Lease up to ``n`` ready jobs, best priority first. With ``timeout``, wait up to
        that many seconds for at least one; without, return at once (maybe empty)."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            seen = self._commits
            found = self.submit_claim(queue, n, lease=lease, owner=owner).result()
            if found or end is None:
                return self.fill_deliveries(found)
            remaining = end - time.monotonic()
            if remaining <= 0:
                return found
            # Woken early by a later local commit (a local enqueue, say); else poll storage.
            with self._arrivals:
                self._arrivals.wait_for(
                    functools.partial(self._committed_since, seen + 1),
                    min(remaining, self.poll_seconds),
                )

    # --- payloads kept out of the state --------------------------------------------------

    def fill(self, job: Job) -> Job:
        """``job`` with its payload loaded, if the state keeps it out of line."""
        if job.ref is None or job.body:
            return job
        body, b64 = self.engine.bodies.load(job.ref)
        return msgspec.structs.replace(job, body=body, b64=b64)

    def fill_deliveries(self, deliveries: list[Delivery]) -> list[Delivery]:
        return [Delivery(self.fill(d.job), d.token) for d in deliveries]

    def then_fill(self, claim: Future[list[Delivery]]) -> Future[list[Delivery]]:
        """The deliveries of ``claim`` with their payloads loaded, without blocking: bodies
        objects that are not cached are read in parallel once the claim has committed, so a
        consumer's event loop never waits on storage reads."""
        filled: Future[list[Delivery]] = Future()

        def fill(_: object) -> None:
            try:
                filled.set_result(self.fill_deliveries(claim.result()))
            except BaseException as exc:  # handed to whoever waits on the future
                filled.set_exception(exc)

        def claimed(_: object) -> None:
            if claim.exception() is not None:
                fill(None)
                return
            refs = [d.job.ref for d in claim.result() if d.job.ref is not None and not d.job.body]
            self.engine.bodies.prefetch(refs).add_done_callback(fill)

        claim.add_done_callback(claimed)
        return filled

    def fill_rows(self, rows: list[tuple[str, Job]]) -> list[tuple[str, Job]]:
        return [(state, self.fill(job)) for state, job in rows]

    def ack(self, delivery: Delivery, *, wait: bool = True) -> None:
        """Finish a delivery. Raises :class:`LeaseLost` if its lease was lost (when waiting)."""
        self._settle(self.submit_ack(delivery), wait, "ack", delivery)

    def nack(
        self,
        delivery: Delivery,
        *,
        error: str | None = None,
        retry: bool = True,
        delay: Delay = None,
        wait: bool = True,
    ) -> str | None:
        """Fail a delivery: retry after the queue's backoff (or ``delay``), or dead-letter it
        when ``retry`` is false or its attempts are spent. Returns 'retry' or 'dead'."""
        future = self.submit_nack(delivery, error=error, retry=retry, delay=delay)
        return self._settle(future, wait, "nack", delivery)

    def heartbeat(
        self, deliveries: Sequence[Delivery], *, lease: Delay = None, wait: bool = True
    ) -> list[bool] | None:
        """Extend the leases of many deliveries in one operation; says which are still held."""
        return self._settle(self.submit_heartbeat(deliveries, lease=lease), wait, "heartbeat")

    def release(self, deliveries: Sequence[Delivery], *, wait: bool = True) -> None:
        """Give back unprocessed deliveries; no attempt is counted."""
        self._settle(self.submit_release(deliveries), wait, "release")

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
        lease = deliveries[0].job.lease
        span = (lease.expires_at - time.time()) if lease is not None else 30.0
        interval = every if every is not None else max(span / 3.0, 0.05)
        stop = threading.Event()

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

    # --- inspecting and operating ----------------------------------------------------------

    def queues(self) -> list[str]:
        return self.submit(lambda s, now: s.queue_names(), latest=True).result()

    def stats(self, queue: str) -> QueueStats:
        return self.submit(lambda s, now: s.stats(queue, now), latest=True).result()

    def job(self, job_id: str) -> tuple[str, Job] | None:
        """A job's state ('ready', 'delayed', 'in-flight', 'dead') and record, if in the state."""
        found = self.submit(lambda s, now: s.find(job_id, now), latest=True).result()
        return None if found is None else (found[0], self.fill(found[1]))

    def jobs(
        self, queue: str, *, state: str | None = None, limit: int | None = None
    ) -> list[tuple[str, Job]]:
        rows = self.submit(lambda s, now: s.list_jobs(queue, now, state, limit), latest=True)
        return self.fill_rows(rows.result())

    def dead_letters(self, queue: str) -> list[Job]:
        dead = self.submit(lambda s, now: s.dead_letters(queue), latest=True).result()
        return [self.fill(job) for job in dead]

    def retry_dead(self, queue: str, ids: Sequence[str] | None = None) -> list[str]:
        """Move dead letters (all, or these ids) back to the queue with fresh attempts."""
        chosen = None if ids is None else list(ids)
        return self.submit(lambda s, now: s.retry_dead(queue, chosen, now)).result()

    def purge_dead(self, queue: str, ids: Sequence[str] | None = None) -> int:
        chosen = None if ids is None else list(ids)
        return self.submit(lambda s, now: s.purge_dead(queue, chosen)).result()

    def purge(self, queue: str) -> int:
        """Delete the queue's ready and delayed jobs; returns how many."""
        return self.submit(lambda s, now: s.purge(queue)).result()

    def delete_queue(self, queue: str) -> int:
        return self.submit(lambda s, now: s.delete_queue(queue)).result()

    def expire(self) -> int:
        """Return stale leases to their queues now (commits also do this on their own)."""
        return self.submit(lambda s, now: s.expire(now), latest=True).result()

    def metrics(self) -> EngineMetrics:
        return self.engine.metrics

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every operation submitted so far is durable (and the objects its
        commits freed are deleted)."""
        self.engine.flush(timeout)

    def close(self) -> None:
        """Commit what is pending and stop the writer. The store stays usable by others."""
        self.engine.close()
