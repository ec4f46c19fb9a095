"""ObjqBroker's own promises beyond Dramatiq's suite."""

from __future__ import annotations

import gc
import logging
import threading
import time
import weakref
from collections.abc import Iterator

import dramatiq
import pytest
from dramatiq import Worker
from dramatiq.errors import ConnectionClosed

from objq_broker.dramatiq import ObjqBroker
from objq_broker.errors import ConfigurationError
from objq_broker.storage import MemoryStore
from objq_broker.storage.faulty import FaultyStore

_names = iter(range(1_000_000))


@pytest.fixture
def broker() -> Iterator[ObjqBroker]:
    made = ObjqBroker(url=f"memory://broker-{next(_names)}", lease_seconds=5)
    dramatiq.set_broker(made)
    yield made
    made.close()


def test_delayed_messages_wait_in_storage_not_in_worker_memory(broker: ObjqBroker) -> None:
    @dramatiq.actor
    def later() -> None: ...

    later.send_with_options(delay=60_000)
    stats = broker.client.stats("default.DQ")
    assert (stats.delayed, stats.ready) == (1, 0)
    consumer = broker.consume("default.DQ", prefetch=1000, timeout=50)
    assert next(consumer) is None  # nothing is due, so nothing is handed to the worker
    consumer.close()


def test_broker_priority_runs_higher_first(broker: ObjqBroker) -> None:
    @dramatiq.actor
    def work(name: str) -> None: ...

    work.send_with_options(args=("low",), broker_priority=0)
    work.send_with_options(args=("high",), broker_priority=9)
    # The order the consumer hands messages over (a worker's own queue then orders them by
    # actor priority, and in Dramatiq 1.x arbitrarily among equals).
    consumer = broker.consume("default", prefetch=2, timeout=50)
    first, second = next(consumer), next(consumer)
    assert first is not None and second is not None
    assert [first.args[0], second.args[0]] == ["high", "low"]
    consumer.close()


def test_requeue_on_shutdown_does_not_burn_an_attempt(broker: ObjqBroker) -> None:
    @dramatiq.actor
    def job() -> None: ...

    job.send()
    consumer = broker.consume("default", prefetch=1, timeout=50)
    message = next(consumer)
    assert message is not None
    consumer.requeue([message])
    [(state, record)] = broker.client.jobs("default")
    assert (state, record.attempts) == ("ready", 0)


def test_failed_messages_keep_no_exception_by_default(broker: ObjqBroker) -> None:
    class Boom(Exception):
        pass

    alive: list[weakref.ref[BaseException]] = []

    @dramatiq.actor(max_retries=0)
    def explode() -> None:
        error = Boom("x")
        alive.append(weakref.ref(error))
        raise error

    explode.send()
    worker = Worker(broker, worker_threads=1, worker_timeout=50)
    # Log records would keep the exception alive (pytest keeps them): switch logging off.
    logging.disable(logging.CRITICAL)
    try:
        worker.start()
        broker.join("default")
        worker.stop()
    finally:
        logging.disable(logging.NOTSET)
    gc.collect()
    assert alive and alive[0]() is None
    [dead] = broker.dead_letters
    assert dead.actor_name == "explode"
    [record] = broker.client.dead_letters("default")
    assert record.error is not None and "Boom" in record.error


def test_join_fail_fast_raises_this_brokers_failure() -> None:
    broker = ObjqBroker(url="memory://fail-fast", fail_fast_default=True)
    dramatiq.set_broker(broker)

    @dramatiq.actor(max_retries=0)
    def explode() -> None:
        raise KeyError("missing")

    explode.send()
    worker = Worker(broker, worker_threads=1, worker_timeout=50)
    worker.start()
    try:
        with pytest.raises(KeyError, match="missing"):
            broker.join("default")
    finally:
        worker.stop()
        broker.close()


def test_storage_outage_is_a_connection_error_to_dramatiq() -> None:
    store = FaultyStore(MemoryStore("outage"), error_rate=1.0)
    broker = ObjqBroker(store=store, commit_deadline_seconds=0.2)
    dramatiq.set_broker(broker)
    with pytest.raises(ConnectionClosed):

        @dramatiq.actor
        def anything() -> None: ...

    broker.close()


def test_lease_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OBJQ_LEASE_SECONDS", "7.5")
    broker = ObjqBroker(url="memory://env-lease")
    assert (broker.lease_seconds, broker.heartbeat_seconds) == (7.5, 2.5)
    broker.close()
    monkeypatch.setenv("OBJQ_LEASE_SECONDS", "soon")
    with pytest.raises(ConfigurationError, match="OBJQ_LEASE_SECONDS"):
        ObjqBroker(url="memory://env-lease-bad")


def test_heartbeat_keeps_prefetched_and_running_messages(broker: ObjqBroker) -> None:
    broker.heartbeat_seconds = 0.05

    @dramatiq.actor
    def job() -> None: ...

    for _ in range(3):
        job.send()
    consumer = broker.consume("default", prefetch=3, timeout=50)
    first = next(consumer)
    assert first is not None
    before = {j.id: j.lease.expires_at for _, j in broker.client.jobs("default") if j.lease}
    done = threading.Event()
    deadline = time.monotonic() + 5
    while not done.is_set() and time.monotonic() < deadline:
        time.sleep(0.1)
        after = {j.id: j.lease.expires_at for _, j in broker.client.jobs("default") if j.lease}
        if after and all(after[i] > before[i] for i in before):
            done.set()
    assert len(before) == 3  # one running, two prefetched
    assert done.is_set(), "the heartbeat did not extend every held lease"
    consumer.close()


def _in_flight(broker: ObjqBroker, queue: str = "default") -> int:
    return broker.client.stats(queue).in_flight


def test_a_backlog_of_short_tasks_is_claimed_in_batches_beyond_the_prefetch(
    broker: ObjqBroker,
) -> None:
    # Given a backlog and a consumer whose threads finish each message at once
    @dramatiq.actor
    def quick(n: int) -> None: ...

    for n in range(300):
        quick.send(n)
    consumer = broker.consume("default", prefetch=4, timeout=50)
    seen: list[int] = []
    most_claimed = 0
    while len(seen) < 300:
        message = next(consumer)
        if message is None:
            continue
        seen.append(message.args[0])
        most_claimed = max(most_claimed, _in_flight(broker))
        consumer.ack(message)
    consumer.close()
    broker.client.flush()
    # Then every message came once, and the consumer claimed more than its prefetch per
    # commit, which is what lets a worker outpace commit latency
    assert sorted(seen) == list(range(300))
    assert most_claimed > 4
    assert _in_flight(broker) == 0


def test_messages_claimed_beyond_the_prefetch_are_given_back_when_threads_are_slow(
    broker: ObjqBroker,
) -> None:
    # Given a consumer that claimed a batch ahead and whose threads then stall
    @dramatiq.actor
    def slow(n: int) -> None: ...

    for n in range(40):
        slow.send(n)
    consumer = broker.consume("default", prefetch=4, timeout=50)
    held = [m for m in (next(consumer) for _ in range(4)) if m is not None]
    assert len(held) == 4
    deadline = time.monotonic() + 5
    while _in_flight(broker) <= 4 and time.monotonic() < deadline:
        next(consumer)  # threads are busy: claims ahead, hands nothing out
    assert _in_flight(broker) > 4
    # When claimed messages wait over a second for a thread
    time.sleep(1.2)
    assert next(consumer) is None
    broker.client.flush()
    # Then only what the threads hold stays claimed; another worker can run the rest
    assert _in_flight(broker) == 4
    other = ObjqBroker(queue=broker.client)
    assert len(other.client.claim("default", 100)) == 36
    for message in held:
        consumer.ack(message)
    consumer.close()


def test_a_message_names_its_group_by_its_own_option_or_its_actors(broker: ObjqBroker) -> None:
    @dramatiq.actor(group=lambda message: f"tenant-{message.kwargs['tenant']}")
    def per_tenant(tenant: int) -> None: ...

    @dramatiq.actor
    def plain() -> None: ...

    per_tenant.send(tenant=7)
    per_tenant.send_with_options(kwargs={"tenant": 7}, group="override")
    plain.send_with_options(group="tenant-9")
    plain.send_with_options(group="tenant-9", delay=60_000)  # the group travels via the DQ
    plain.send()
    groups = [job.group for _, job in broker.client.jobs("default")]
    assert sorted(groups, key=str) == [None, "override", "tenant-7", "tenant-9"]
    assert [job.group for _, job in broker.client.jobs("default.DQ")] == ["tenant-9"]


def test_a_bad_group_is_refused_with_the_actor_named(broker: ObjqBroker) -> None:
    @dramatiq.actor
    def plain() -> None: ...

    with pytest.raises(ConfigurationError, match=r"'plain'.*group"):
        plain.send_with_options(group="")
    assert broker.client.jobs("default") == []
