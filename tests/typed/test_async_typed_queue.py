"""AsyncTypedQueue, the asyncio twin of TypedQueue: the same round trips and the same
dead-lettering, awaited."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from objq_broker import AsyncQueue
from objq_broker.typed import AsyncTypedQueue, TypedDelivery
from tests.typed.schemas import Invoice, Order
from tests.typed.test_typed_queue import KINDS


@pytest.fixture(params=["memory", "file"])
def url(request: pytest.FixtureRequest, store_url_factory: Callable[[str], str]) -> str:
    backend: str = request.param
    return store_url_factory(backend)


@pytest.mark.parametrize(("type_", "value"), KINDS)
def test_a_value_of_each_kind_goes_round(url: str, type_: type[Any], value: object) -> None:
    async def scenario() -> TypedDelivery[Any]:
        async with AsyncTypedQueue("things", type_, url=url) as things:
            await things.enqueue_many([value, value])
            first, second = await things.claim(2, timeout=5)
            await things.ack(first)
            assert await things.nack(second, error="no", retry=False) == "dead"
            stats = await things.queue.stats("things")
            assert (stats.ready, stats.in_flight, stats.dead) == (0, 0, 1)
            return first

    delivery = asyncio.run(scenario())
    assert delivery.value == value
    assert type(delivery.value) is type(value)


def test_a_bad_payload_is_dead_lettered_and_the_good_ones_delivered(url: str) -> None:
    async def scenario() -> None:
        async with AsyncQueue(url) as queue:
            invoices = AsyncTypedQueue("invoices", Invoice, queue=queue)
            await invoices.enqueue(Invoice(number="F-1", cents=100))
            bad = await queue.enqueue("invoices", b'{"number": "F-2"}')
            await invoices.enqueue(Invoice(number="F-3", cents=300))
            got = await invoices.claim(3, timeout=5)
            await invoices.close()  # waits for the dead-lettering; the queue stays open
            assert [d.value.number for d in got] == ["F-1", "F-3"]
            [dead] = await queue.dead_letters("invoices")
            assert (dead.id, dead.attempts) == (bad.id, 1)
            assert dead.error == (
                f"PayloadInvalid: queue 'invoices', job {bad.id}: expected Invoice, found "
                """b'{"number": "F-2"}': Field required - at `$.cents`"""
            )

    asyncio.run(scenario())


def test_a_claim_that_found_only_bad_payloads_waits_on_for_a_good_one(url: str) -> None:
    async def scenario() -> list[Order]:
        async with AsyncQueue(url, poll_seconds=0.05) as queue:
            orders = AsyncTypedQueue("orders", Order, queue=queue)
            await queue.enqueue_many("orders", [b"{}", b"null"])

            async def later() -> None:
                await asyncio.sleep(0.3)
                await orders.enqueue(Order("A-1", 1))

            producer = asyncio.create_task(later())
            got = await orders.claim(5, timeout=30)
            await producer
            assert await orders.claim(timeout=0.1) == []
            await orders.close()
            assert (await queue.stats("orders")).dead == 2
            return [d.value for d in got]

    assert asyncio.run(scenario()) == [Order("A-1", 1)]
