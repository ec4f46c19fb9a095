"""``AsyncTypedQueue``: the asyncio face of :class:`~objq_broker.typed.queue.TypedQueue`, over
an :class:`~objq_broker.aio.AsyncQueue`, with the same schema, deliveries and dead-lettering."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Generic, TypeVar, Unpack

from objq_broker import builders
from objq_broker.aio import AsyncQueue
from objq_broker.builders import Delay, JobOptions
from objq_broker.model.checks import checked_timeout
from objq_broker.model.records import Job, NackResult
from objq_broker.typed.queue import TypedDelivery, encode_all, one_of, typed_deliveries
from objq_broker.typed.schema import Schema

T = TypeVar("T")

__all__ = ["AsyncTypedQueue"]


class AsyncTypedQueue(Generic[T]):
    """Like :class:`~objq_broker.typed.queue.TypedQueue`, with ``async`` methods.

    >>> import asyncio, msgspec
    >>> class Order(msgspec.Struct):
    ...     sku: str
    ...     qty: int
    >>> async def main() -> Order:
    ...     async with AsyncTypedQueue("orders", Order, url="memory://typed-aio-doc") as orders:
    ...         await orders.enqueue(Order("A-1", 2))
    ...         [delivery] = await orders.claim()
    ...         await orders.ack(delivery)
    ...         return delivery.value
    >>> asyncio.run(main())
    Order(sku='A-1', qty=2)
    """

    def __init__(
        self,
        name: str,
        type_: type[T],
        /,
        *,
        queue: AsyncQueue | None = None,
        url: str | None = None,
    ) -> None:
        one_of("AsyncTypedQueue", queue, url)
        self.name = builders.queue_name(name, "AsyncTypedQueue")
        self.schema = Schema(type_)
        self._owned = queue is None
        #: The untyped queue underneath.
        self.queue = AsyncQueue(url) if queue is None else queue

    def __repr__(self) -> str:
        return f"AsyncTypedQueue({self.name!r}, {self.schema.name}, {self.queue!r})"

    async def __aenter__(self) -> AsyncTypedQueue[T]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def enqueue(
        self,
        value: T,
        *,
        key: str | None = None,
        **options: Unpack[JobOptions],
    ) -> Job:
        [payload] = encode_all(self.schema, self.name, [value])
        return await self.queue.enqueue(self.name, payload, key=key, **options)

    async def enqueue_many(
        self,
        values: Iterable[T],
        *,
        keys: Sequence[str | None] | None = None,
        **options: Unpack[JobOptions],
    ) -> list[Job]:
        payloads = encode_all(self.schema, self.name, values)
        return await self.queue.enqueue_many(self.name, payloads, keys=keys, **options)

    async def claim(
        self, n: int = 1, *, lease: Delay = None, timeout: float | None = None
    ) -> list[TypedDelivery[T]]:
        timeout = checked_timeout(timeout, f"claim from {self.name!r}")
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if end is None else max(end - time.monotonic(), 0.0)
            claimed = await self.queue.claim(self.name, n, lease=lease, timeout=left)
            # Dead-lettering is submitted without waiting, so it never blocks the loop.
            typed = typed_deliveries(self.queue.sync, self.schema, self.name, claimed)
            if typed or not claimed or end is None or time.monotonic() >= end:
                return typed

    async def ack(self, delivery: TypedDelivery[T]) -> None:
        await self.queue.ack(delivery)

    async def nack(
        self,
        delivery: TypedDelivery[T],
        *,
        error: str | None = None,
        retry: bool = True,
        delay: Delay = None,
    ) -> NackResult:
        return await self.queue.nack(delivery, error=error, retry=retry, delay=delay)

    async def close(self) -> None:
        """Close the queue this typed queue opened; or, if it was given one, wait until what
        it submitted is durable."""
        if self._owned:
            await self.queue.close()
        else:
            await self.queue.flush()
