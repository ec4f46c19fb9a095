"""TypedQueue as a user drives it, on real memory and file stores: values of every kind of type
go round, and a payload that does not validate is dead-lettered at once while the good ones of
the same claim are delivered."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, cast

import msgspec
import pytest

from objq_broker import ConfigurationError, Queue
from objq_broker.typed import PayloadInvalid, TypedDelivery, TypedQueue
from tests.typed.schemas import Basket, Invoice, Line, NotASchema, Order, Refund, Shipment

#: A type of each kind a schema takes, with a value of it.
SAMPLES: list[tuple[str, type[Any], object]] = [
    ("struct", Order, Order("A-1", 2)),
    ("nested-struct", Basket, Basket("ada", [Line("A-1", 1), Line("B-2", 3)])),
    ("dataclass", Shipment, Shipment("o-1", 250, express=True)),
    ("typeddict", Refund, Refund(order="o-1", cents=999)),
    ("pydantic", Invoice, Invoice(number="F-7", cents=1200)),
]
KINDS = [pytest.param(type_, value, id=name) for name, type_, value in SAMPLES]
SAMPLE_OF = {type_: value for _, type_, value in SAMPLES}

#: A payload of each kind that does not validate, and what its dead letter's error says.
INVALID = [
    pytest.param(Order, b'{"sku": "A-1"}', "Object missing required field `qty`", id="missing"),
    pytest.param(
        Basket,
        b'{"customer": "ada", "lines": [{"sku": "A-1", "qty": "1"}]}',
        "Expected `int`, got `str` - at `$.lines[0].qty`",
        id="nested-struct",
    ),
    pytest.param(
        Shipment,
        b'{"order": "o-1", "weight_grams": 2.5}',
        "Expected `int`, got `float` - at `$.weight_grams`",
        id="dataclass",
    ),
    pytest.param(
        Refund, b'{"order": 7, "cents": 1}', "Expected `str`, got `int` - at `$.order`", id="td"
    ),
    pytest.param(
        Invoice,
        b'{"number": "F-7", "cents": -5}',
        "Input should be greater than 0, got `int` - at `$.cents`",
        id="pydantic",
    ),
    pytest.param(Order, b"not json", "JSON is malformed", id="malformed"),
    pytest.param(Invoice, b"{", "Invalid JSON", id="pydantic-malformed"),
]


@pytest.fixture(params=["memory", "file"])
def url(request: pytest.FixtureRequest, store_url_factory: Callable[[str], str]) -> str:
    """A fresh, empty store: in memory, or a local directory."""
    backend: str = request.param
    return store_url_factory(backend)


@pytest.mark.parametrize(("type_", "value"), KINDS)
def test_a_value_of_each_kind_goes_round(url: str, type_: type[Any], value: object) -> None:
    with TypedQueue("things", type_, url=url) as things:
        job = things.enqueue(value)
        [delivery] = things.claim(timeout=5)
        assert delivery.value == value
        assert type(delivery.value) is type(value)
        assert (delivery.id, delivery.job.attempts) == (job.id, 1)
        things.ack(delivery)
        stats = things.queue.stats("things")
        assert (stats.ready, stats.in_flight, stats.dead) == (0, 0, 0)


def test_enqueue_many_keeps_order_and_a_nack_retries(url: str) -> None:
    orders = [Order(f"A-{n}", n) for n in range(5)]
    with TypedQueue("orders", Order, url=url) as queue:
        queue.queue.declare("orders", backoff_base_seconds=0.01, backoff_cap_seconds=0.01)
        queue.enqueue_many(orders)
        got = queue.claim(5, timeout=5)
        assert [d.value for d in got] == orders
        assert queue.nack(got[0], error="try again") == "retry"
        for delivery in got[1:]:
            queue.ack(delivery)
        [again] = queue.claim(timeout=5)
        assert (again.value, again.job.attempts) == (orders[0], 2)
        queue.ack(again)


@pytest.mark.parametrize(("type_", "payload", "says"), INVALID)
def test_a_payload_that_does_not_validate_is_dead_lettered_at_once(
    url: str, type_: type[Any], payload: bytes, says: str
) -> None:
    # Given a good payload on each side of a bad one, enqueued by an untyped producer
    with Queue(url) as queue:
        typed = TypedQueue("jobs", type_, queue=queue)
        good = typed.schema.encode(SAMPLE_OF[type_])
        first = queue.enqueue("jobs", good)
        bad = queue.enqueue("jobs", payload)
        last = queue.enqueue("jobs", good)
        # When one claim takes all three
        got = typed.claim(3)
        typed.close()  # waits for the dead-lettering
        # Then the good ones are delivered, and the bad one is dead after one attempt
        assert [d.id for d in got] == [first.id, last.id]
        assert all(d.value == SAMPLE_OF[type_] for d in got)
        [dead] = queue.dead_letters("jobs")
        assert (dead.id, dead.attempts) == (bad.id, 1)
        assert dead.max_attempts is None or dead.max_attempts > 1  # not spent: refused
        assert dead.error is not None
        assert dead.error.startswith(
            f"PayloadInvalid: queue 'jobs', job {bad.id}: expected {type_.__qualname__}, found "
        )
        assert says in dead.error
        stats = queue.stats("jobs")
        assert (stats.ready, stats.delayed, stats.in_flight, stats.dead) == (0, 0, 2, 1)


def test_the_dead_letter_quotes_the_expected_and_the_found(url: str) -> None:
    with Queue(url) as queue:
        orders = TypedQueue("orders", Order, queue=queue)
        bad = queue.enqueue("orders", b'{"sku": "A-1", "qty": "two"}')
        assert orders.claim() == []
        orders.close()
        [dead] = queue.dead_letters("orders")
        assert dead.error == (
            f"PayloadInvalid: queue 'orders', job {bad.id}: expected Order, found "
            """b'{"sku": "A-1", "qty": "two"}': Expected `int`, got `str` - at `$.qty`"""
        )


def test_a_claim_that_found_only_bad_payloads_waits_on_for_a_good_one(url: str) -> None:
    with Queue(url, poll_seconds=0.05) as queue:
        orders = TypedQueue("orders", Order, queue=queue)
        queue.enqueue_many("orders", [b"{}", b"[]"])
        later = threading.Timer(0.3, lambda: orders.enqueue(Order("A-1", 1)))
        later.start()
        try:
            got = orders.claim(5, timeout=30)
        finally:
            later.join()
        assert [d.value for d in got] == [Order("A-1", 1)]
        orders.close()
        assert queue.stats("orders").dead == 2


def test_a_claim_without_timeout_that_found_only_bad_payloads_returns_none(url: str) -> None:
    with Queue(url) as queue:
        orders = TypedQueue("orders", Order, queue=queue)
        queue.enqueue("orders", b"{}")
        assert orders.claim(2) == []
        assert orders.claim(2, timeout=0.2) == []
        orders.close()
        assert queue.stats("orders").dead == 1


def test_an_invalid_value_is_refused_before_anything_is_submitted(url: str) -> None:
    with TypedQueue("orders", Order, url=url) as orders:
        orders.queue.declare("orders")
        with pytest.raises(
            PayloadInvalid, match=r"enqueue to .orders.: expected Order, .* `\$\.qty`"
        ):
            orders.enqueue_many([Order("A-1", 1), Order("B-2", cast(Any, "two"))])
        with pytest.raises(PayloadInvalid, match="expected Order, found object: Encoding"):
            orders.enqueue(cast(Any, object()))
        assert orders.queue.stats("orders").ready == 0


def test_a_pydantic_queue_refuses_a_value_of_another_type(url: str) -> None:
    with (
        TypedQueue("invoices", Invoice, url=url) as invoices,
        pytest.raises(PayloadInvalid, match="expected Invoice, found dict"),
    ):
        invoices.enqueue(cast(Any, {"number": "F-7", "cents": 1}))


def test_a_typed_delivery_is_a_delivery_for_heartbeats_and_releases(url: str) -> None:
    with Queue(url) as queue:
        orders = TypedQueue("orders", Order, queue=queue)
        orders.enqueue_many([Order("A-1", 1), Order("B-2", 2)])
        first, second = orders.claim(2, lease=30)
        assert isinstance(first, TypedDelivery)
        assert queue.heartbeat([first, second], lease=60) == [True, True]
        with queue.keep_alive([first], every=0.05):
            pass
        assert queue.release([second]) == [True]
        orders.ack(first)
        [back] = orders.claim(timeout=5)
        assert (back.value, back.job.attempts) == (Order("B-2", 2), 1)


def test_a_shared_queue_stays_open_and_an_own_one_is_closed(url: str) -> None:
    with Queue(url) as queue:
        with TypedQueue("orders", Order, queue=queue) as orders:
            orders.enqueue(Order("A-1", 1))
        assert not queue.closed
        assert queue.stats("orders").ready == 1
    with TypedQueue("orders", Order, url=url) as own:
        pass
    assert own.queue.closed


def test_wrong_arguments_are_refused_saying_what_is_accepted() -> None:
    with pytest.raises(ConfigurationError, match=r"expected a msgspec\.Struct, a dataclass, a"):
        TypedQueue("notes", NotASchema, url="memory://typed-refused")
    with pytest.raises(ConfigurationError, match="expected one of queue= or url=, found neither"):
        TypedQueue("orders", Order)
    with Queue("memory://typed-both") as queue:
        with pytest.raises(ConfigurationError, match="found both"):
            TypedQueue("orders", Order, queue=queue, url="memory://typed-both")
        with pytest.raises(ConfigurationError, match="TypedQueue"):
            TypedQueue("", Order, queue=queue)


def test_a_pydantic_model_validates_as_pydantic_does() -> None:
    # Given a number in a string, written by an untyped producer
    payload = msgspec.json.encode({"number": "F-7", "cents": "12"})
    with Queue("memory://typed-pydantic-lax") as queue:
        invoices = TypedQueue("invoices", Invoice, queue=queue)
        queue.enqueue("invoices", payload)
        # Then pydantic's lax mode takes the number in a string, as it does everywhere
        [delivery] = invoices.claim()
        assert delivery.value == Invoice(number="F-7", cents=12)
