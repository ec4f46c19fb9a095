"""``AsyncQueue``: the asyncio face of :class:`~objq_broker.queue.Queue`.

The engine's writer is a thread either way (one boto3 client, one commit loop); the coroutines
here await its futures without blocking the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

from objq_broker.engine import EngineMetrics
from objq_broker.queue import Delay, Delivery, Queue
from objq_broker.records import Job, QueueConfig
from objq_broker.state import QueueStats
from objq_broker.storage import ObjectStore

T = TypeVar("T")
log = logging.getLogger("objq_broker.aio")


async def _wait(future: Future[T]) -> T:
    return await asyncio.wrap_future(future)


def _out_of_line(jobs: Iterable[Job]) -> bool:
    return any(job.ref is not None and not job.body for job in jobs)


class AsyncQueue:
    """Like :class:`Queue`, with ``async`` methods.

    >>> async def main() -> int:
    ...     async with AsyncQueue("memory://aio-doc") as q:
    ...         await q.enqueue("emails", b"hi")
    ...         [delivery] = await q.claim("emails")
    ...         await q.ack(delivery)
    ...         return (await q.stats("emails")).ready
    >>> asyncio.run(main())
    0
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        store: ObjectStore | None = None,
        owner: str | None = None,
        poll_seconds: float | None = None,
        **options: Any,
    ) -> None:
        extra = {} if poll_seconds is None else {"poll_seconds": poll_seconds}
        self.sync = Queue(url, store=store, owner=owner, **extra, **options)

    def __repr__(self) -> str:
        return f"AsyncQueue({self.sync.store.url!r})"

    async def __aenter__(self) -> AsyncQueue:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def declare(self, queue: str, **config: Any) -> bool:
        return await _wait(self.sync.submit_declare(queue, **config))

    async def configure(self, queue: str, **changes: float) -> QueueConfig:
        return await _wait(self.sync.submit(lambda s, now: s.configure(queue, dict(changes))))

    async def enqueue(
        self,
        queue: str,
        payload: bytes,
        *,
        priority: int = 0,
        delay: Delay = None,
        max_attempts: int | None = None,
        key: str | None = None,
    ) -> Job:
        [job] = await _wait(
            self.sync.submit_enqueue(
                queue,
                [payload],
                priority=priority,
                delay=delay,
                max_attempts=max_attempts,
                keys=None if key is None else [key],
            )
        )
        return job if not _out_of_line([job]) else await asyncio.to_thread(self.sync.fill, job)

    async def enqueue_many(
        self,
        queue: str,
        payloads: Iterable[bytes],
        *,
        priority: int = 0,
        delay: Delay = None,
        max_attempts: int | None = None,
        keys: Sequence[str | None] | None = None,
    ) -> list[Job]:
        jobs = await _wait(
            self.sync.submit_enqueue(
                queue,
                payloads,
                priority=priority,
                delay=delay,
                max_attempts=max_attempts,
                keys=keys,
            )
        )
        if not _out_of_line(jobs):
            return jobs
        return await asyncio.to_thread(lambda: [self.sync.fill(job) for job in jobs])

    async def claim(
        self,
        queue: str,
        n: int = 1,
        *,
        lease: Delay = None,
        owner: str | None = None,
        timeout: float | None = None,
    ) -> list[Delivery]:
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            found = await _wait(self.sync.submit_claim(queue, n, lease=lease, owner=owner))
            if found and _out_of_line(d.job for d in found):
                found = await asyncio.to_thread(self.sync.fill_deliveries, found)
            if found or end is None or time.monotonic() >= end:
                return found
            await asyncio.sleep(min(self.sync.poll_seconds, max(end - time.monotonic(), 0.0)))

    async def ack(self, delivery: Delivery) -> None:
        await _wait(self.sync.submit_ack(delivery))

    async def nack(
        self,
        delivery: Delivery,
        *,
        error: str | None = None,
        retry: bool = True,
        delay: Delay = None,
    ) -> str:
        return await _wait(self.sync.submit_nack(delivery, error=error, retry=retry, delay=delay))

    async def heartbeat(self, deliveries: Sequence[Delivery], *, lease: Delay = None) -> list[bool]:
        return await _wait(self.sync.submit_heartbeat(deliveries, lease=lease))

    async def release(self, deliveries: Sequence[Delivery]) -> list[bool]:
        return await _wait(self.sync.submit_release(deliveries))

    @contextlib.asynccontextmanager
    async def keep_alive(
        self, deliveries: Sequence[Delivery], *, every: float | None = None
    ) -> AsyncIterator[None]:
        """Heartbeat ``deliveries`` from a background task while the block runs."""
        lease = deliveries[0].job.lease if deliveries else None
        span = (lease.expires_at - time.time()) if lease is not None else 30.0
        interval = every if every is not None else max(span / 3.0, 0.05)

        async def beat() -> None:
            while True:
                await asyncio.sleep(interval)
                try:
                    await self.heartbeat(deliveries)
                except Exception as exc:  # keep beating: the next try may reach storage
                    log.warning("heartbeat failed: %s", exc)

        task = asyncio.create_task(beat()) if deliveries else None
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def queues(self) -> list[str]:
        return await _wait(self.sync.submit(lambda s, now: s.queue_names(), latest=True))

    async def stats(self, queue: str) -> QueueStats:
        return await _wait(self.sync.submit(lambda s, now: s.stats(queue, now), latest=True))

    async def job(self, job_id: str) -> tuple[str, Job] | None:
        found = await _wait(self.sync.submit(lambda s, now: s.find(job_id, now), latest=True))
        if found is None or not _out_of_line([found[1]]):
            return found
        return found[0], await asyncio.to_thread(self.sync.fill, found[1])

    async def dead_letters(self, queue: str) -> list[Job]:
        dead = await _wait(self.sync.submit(lambda s, now: s.dead_letters(queue), latest=True))
        if not _out_of_line(dead):
            return dead
        return await asyncio.to_thread(lambda: [self.sync.fill(job) for job in dead])

    async def retry_dead(self, queue: str, ids: Sequence[str] | None = None) -> list[str]:
        chosen = None if ids is None else list(ids)
        return await _wait(self.sync.submit(lambda s, now: s.retry_dead(queue, chosen, now)))

    async def purge_dead(self, queue: str, ids: Sequence[str] | None = None) -> int:
        chosen = None if ids is None else list(ids)
        return await _wait(self.sync.submit(lambda s, now: s.purge_dead(queue, chosen)))

    async def purge(self, queue: str) -> int:
        return await _wait(self.sync.submit(lambda s, now: s.purge(queue)))

    def metrics(self) -> EngineMetrics:
        return self.sync.metrics()

    async def flush(self) -> None:
        await asyncio.to_thread(self.sync.flush)

    async def close(self) -> None:
        await asyncio.to_thread(self.sync.close)
