"""The objq kombu transport driven by kombu's event loop (the Hub that Celery's worker runs).

Each test runs a real Hub over real connections to a local store; the loop is turned by hand
(``hub.run_once``) until a condition holds or a deadline passes, so a defect shows as a wrong
count, never as a hang.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import kombu
import pytest
from kombu.asynchronous import Hub

import objq_broker.kombu  # noqa: F401  (registers the objq+... URLs)
from objq_broker import Queue

OPTIONS = {"visibility_timeout": 30.0, "polling_interval": 0.05}


@pytest.fixture
def hub() -> Iterator[Hub]:
    loop = Hub()
    yield loop
    loop.close()


def publish(conn: kombu.Connection, queue: str, count: int) -> None:
    target = kombu.Queue(queue, routing_key=queue)
    producer = kombu.Producer(conn.default_channel)
    for n in range(count):
        producer.publish({"n": n}, routing_key=queue, declare=[target])


def run_until(hub: Hub, done: Callable[[], bool], within: float) -> None:
    deadline = time.monotonic() + within
    while not done() and time.monotonic() < deadline:
        hub.run_once()


def run_for(hub: Hub, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        hub.run_once()


def live_timers(hub: Hub) -> int:
    return sum(1 for _, _, entry in hub.timer.queue if not entry.canceled)


def take_all(conn: kombu.Connection, queue: str) -> list[int]:
    """Every message ``conn`` can get now, acked."""
    got = []
    while (message := conn.default_channel.basic_get(queue)) is not None:
        got.append(message.payload["n"])
        message.ack()
    return got


def test_a_message_published_later_reaches_an_idle_consumer(connect: Any, hub: Hub) -> None:
    consumer_conn, producer_conn = connect(**OPTIONS), connect(**OPTIONS)
    got: list[int] = []

    def on_message(body: Any, message: Any) -> None:
        got.append(body["n"])
        message.ack()

    queue = kombu.Queue("later", routing_key="later")
    with kombu.Consumer(consumer_conn, [queue], callbacks=[on_message]):
        consumer_conn.register_with_event_loop(hub)
        run_for(hub, 0.3)  # the queue is empty: claims come back with nothing
        assert got == []
        publish(producer_conn, "later", 3)
        run_until(hub, lambda: len(got) == 3, within=10)
    assert got == [0, 1, 2]


#: Publishes one message {"n": 1} to queue "paced" of the store given as argv[1].
PUBLISH_ELSEWHERE = """
import sys, kombu, objq_broker.kombu
with kombu.Connection("objq+" + sys.argv[1]) as conn:
    queue = kombu.Queue("paced", routing_key="paced")
    kombu.Producer(conn.default_channel).publish({"n": 1}, routing_key="paced", declare=[queue])
"""


def test_a_consumer_that_just_had_work_finds_another_process_message_before_its_interval(
    connect: Any, hub: Hub, store_url: str
) -> None:
    """A worker between tasks looks again within milliseconds, growing to the interval: a
    message another process sends right after is not left waiting for the 10 s timer."""
    conn = connect(visibility_timeout=30.0, polling_interval=10.0)
    publish(conn, "paced", 1)
    got: list[tuple[int, float]] = []

    def on_message(body: Any, message: Any) -> None:
        got.append((body["n"], time.monotonic()))
        message.ack()

    queue = kombu.Queue("paced", routing_key="paced")
    with kombu.Consumer(conn, [queue], callbacks=[on_message]):
        conn.register_with_event_loop(hub)
        run_until(hub, lambda: len(got) == 1, within=10)
        assert [n for n, _ in got] == [0]
        # Another process publishes (its commit wakes nothing here: only a read finds it)
        subprocess.run([sys.executable, "-c", PUBLISH_ELSEWHERE, store_url], check=True)
        sent = time.monotonic()
        run_until(hub, lambda: len(got) == 2, within=15)
    assert [n for n, _ in got] == [0, 1]
    # Found by a paced poll, not by the 10 s timer
    assert got[1][1] - sent < 5.0, f"found {got[1][1] - sent:.2f} s after it was sent"


def test_the_prefetch_window_bounds_deliveries_until_acks_open_it(connect: Any, hub: Hub) -> None:
    conn = connect(**OPTIONS)
    publish(conn, "window", 30)
    unacked: list[Any] = []
    got: list[int] = []

    def on_message(body: Any, message: Any) -> None:
        got.append(body["n"])
        unacked.append(message)

    queue = kombu.Queue("window", routing_key="window")
    with kombu.Consumer(conn, [queue], callbacks=[on_message], prefetch_count=4):
        conn.register_with_event_loop(hub)
        run_until(hub, lambda: len(got) >= 4, within=10)
        run_for(hub, 0.3)
        assert got == [0, 1, 2, 3]  # the window is full: nothing more until an ack
        while len(got) < 30:
            # Ack from the loop, as Celery does when a task finishes.
            before = len(got)
            for message in unacked:
                message.ack()
            unacked.clear()
            run_until(hub, lambda: len(got) > before, within=10)
            assert len(got) > before, "acks opened the window but no message followed"
        for message in unacked:
            message.ack()
    assert got == list(range(30))  # each once, in order


def test_claimed_ahead_messages_are_given_back_while_the_window_stays_shut(
    connect: Any, hub: Hub, store_url: str
) -> None:
    conn, other = connect(**OPTIONS), connect(**OPTIONS)
    publish(conn, "hoard", 60)
    got: list[int] = []

    def on_message(body: Any, message: Any) -> None:
        got.append(body["n"])
        if len(got) <= 20:
            message.ack()  # the first 20 run quickly; the 2 after them never finish

    queue = kombu.Queue("hoard", routing_key="hoard")
    with kombu.Consumer(conn, [queue], callbacks=[on_message], prefetch_count=2):
        conn.register_with_event_loop(hub)
        run_until(hub, lambda: len(got) >= 22, within=10)
        with Queue(store_url) as q:
            claimed = q.stats("hoard").in_flight
        # A backlog of quick messages made the transport claim ahead of the window of 2.
        assert claimed > 2, claimed
        run_for(hub, 1.6)  # over a second with the window shut: the extra claims go back
        assert got == list(range(22))
        # Leases last 30 s, so the other connection gets them only if they were given back.
        assert sorted(take_all(other, "hoard")) == list(range(22, 60))


def test_a_no_ack_consumer_settles_on_delivery(connect: Any, hub: Hub, store_url: str) -> None:
    conn = connect(**OPTIONS)
    publish(conn, "noack", 12)
    got: list[int] = []
    queue = kombu.Queue("noack", routing_key="noack")
    consumer = kombu.Consumer(
        conn, [queue], callbacks=[lambda body, message: got.append(body["n"])], no_ack=True
    )
    with consumer:
        conn.register_with_event_loop(hub)
        run_until(hub, lambda: len(got) == 12, within=10)
    assert got == list(range(12))
    conn.close()  # nothing held is given back: there is nothing held
    with Queue(store_url) as q:
        stats = q.stats("noack")
    assert (stats.ready, stats.in_flight) == (0, 0)


def test_closing_the_connection_leaves_the_loop(connect: Any, hub: Hub) -> None:
    conn = connect(**OPTIONS)
    readers_before = set(hub.readers)
    timers_before = live_timers(hub)
    with kombu.Consumer(conn, [kombu.Queue("leave", routing_key="leave")], callbacks=[]):
        conn.register_with_event_loop(hub)
        assert len(hub.readers) == len(readers_before) + 1
        assert live_timers(hub) == timers_before + 1
        run_for(hub, 0.1)
    conn.close()
    assert set(hub.readers) == readers_before
    assert live_timers(hub) == timers_before
    run_for(hub, 0.1)  # the loop runs on without the closed transport


def test_a_forked_child_closing_its_loop_does_not_silence_the_parent(
    connect: Any, hub: Hub
) -> None:
    # A polling interval far longer than the test: only wakeups can deliver in time.
    conn = connect(**{**OPTIONS, "polling_interval": 30.0})
    got: list[Any] = []
    publish(conn, "forked", 3)
    queue = kombu.Queue("forked", routing_key="forked")
    consumer = kombu.Consumer(
        conn, [queue], callbacks=[lambda body, message: got.append(message)], prefetch_count=1
    )
    with consumer:
        conn.register_with_event_loop(hub)
        run_until(hub, lambda: len(got) == 1, within=10)
        assert len(got) == 1
        hub.run_once()  # the loop's poller exists before the fork, as in a worker
        with warnings.catch_warnings():  # Python 3.12+ warns on fork with threads running
            warnings.simplefilter("ignore", DeprecationWarning)
            child = os.fork()
        if child == 0:  # what a prefork pool child may do with its copy of the loop
            hub.close()
            os._exit(0)
        os.waitpid(child, 0)
        for expected in (2, 3):
            got[-1].ack()  # a wakeup: the window opened
            run_until(hub, lambda: len(got) == expected, within=3)
            assert len(got) == expected, "the ack's wakeup was lost after the fork"
        got[-1].ack()
