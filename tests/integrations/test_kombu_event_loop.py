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
from objq_broker.consume.pacing import Pacer
from objq_broker.kombu import events

OPTIONS = {"visibility_timeout": 30.0, "polling_interval": 0.05}


@pytest.fixture
def hub() -> Iterator[Hub]:
    loop = Hub()
    yield loop
    loop.close()


@pytest.fixture
def slow_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop's timer polls every ``polling_interval`` from the start, with no quick
    first looks: what arrives sooner was delivered by a wakeup, not found by a poll."""
    monkeypatch.setattr(events, "Pacer", lambda ceiling: Pacer(ceiling, first=ceiling))


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


#: Options for a consumer whose timer never fires during a test.
NEVER_POLLED = {"visibility_timeout": 30.0, "polling_interval": 60.0}


def collect(got: list[int]) -> Callable[[Any, Any], None]:
    def on_message(body: Any, message: Any) -> None:
        got.append(body["n"])
        message.ack()

    return on_message


def test_a_message_committed_in_this_process_wakes_an_idle_consumer_at_once(
    connect: Any, hub: Hub, slow_timer: None
) -> None:
    # Given an idle consumer whose timer will not poll again for a minute
    consumer_conn, producer_conn = connect(**NEVER_POLLED), connect(**NEVER_POLLED)
    got: list[int] = []
    queue = kombu.Queue("told", routing_key="told")
    with kombu.Consumer(consumer_conn, [queue], callbacks=[collect(got)]):
        consumer_conn.register_with_event_loop(hub)
        run_for(hub, 0.3)  # its first claims found nothing
        # When this process commits a message (the two connections share one engine)
        publish(producer_conn, "told", 1)
        # Then the commit itself tells the loop to claim: no poll is waited for
        run_until(hub, lambda: got == [0], within=10)
    assert got == [0]


#: Publishes {"n": 0} and {"n": 1} to queue "told" of the store argv[1], through the broker
#: (or directly, with OBJQ_BROKER=off).
PUBLISH_THROUGH_BROKER = """
import sys, kombu, objq_broker.kombu
with kombu.Connection("objq+" + sys.argv[1]) as conn:
    queue = kombu.Queue("told", routing_key="told")
    producer = kombu.Producer(conn.default_channel)
    for n in (0, 1):
        producer.publish({"n": n}, routing_key="told", declare=[queue])
"""


def publish_two_elsewhere(hub: Hub, store_url: str, mode: str, got: list[int]) -> None:
    """Another process publishes two messages (``OBJQ_BROKER=mode``); the loop turns until
    ``got`` holds two, or 30 s pass."""
    publish_elsewhere = subprocess.Popen(
        [sys.executable, "-c", PUBLISH_THROUGH_BROKER, store_url],
        env={**os.environ, "OBJQ_BROKER": mode},
    )
    try:
        run_until(hub, lambda: len(got) == 2, within=30)
    finally:
        assert publish_elsewhere.wait(timeout=30) == 0


def test_the_broker_tells_an_idle_consumer_of_another_process_message_at_once(
    connect: Any, hub: Hub, store_url: str, slow_timer: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an idle consumer in broker mode (this process serves as the namespace's broker)
    # whose timer will not poll again for a minute
    monkeypatch.setenv("OBJQ_BROKER", "auto")
    conn = connect(**NEVER_POLLED)
    got: list[int] = []
    queue = kombu.Queue("told", routing_key="told")
    with kombu.Consumer(conn, [queue], callbacks=[collect(got)]):
        conn.register_with_event_loop(hub)
        run_until(hub, lambda: conn.transport.queue.committer.role == "leader", within=10)
        run_for(hub, 0.3)
        # When another process sends two messages through the broker
        publish_two_elsewhere(hub, store_url, "client", got)
    # Then each commit of the broker woke the consumer's loop: both came, once, in order
    assert got == [0, 1]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reported on Linux only")
def test_a_local_folder_tells_an_idle_consumer_of_another_process_direct_commits(
    connect: Any, hub: Hub, store_url: str, slow_timer: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an idle consumer committing directly, on a local folder, whose timer will not poll
    # again for a minute, nor its engine read the state to expire leases (which would find the
    # messages too)
    monkeypatch.setenv("OBJQ_BROKER", "off")
    conn = connect(**NEVER_POLLED, idle_tick_seconds=60.0)
    got: list[int] = []
    queue = kombu.Queue("told", routing_key="told")
    with kombu.Consumer(conn, [queue], callbacks=[collect(got)]):
        conn.register_with_event_loop(hub)
        run_for(hub, 0.3)  # its first claims found nothing
        # When another process commits two messages directly
        publish_two_elsewhere(hub, store_url, "off", got)
    # Then the kernel's reports of those writes woke the loop: both came, once, in order
    assert got == [0, 1]


def test_an_idle_consumer_claims_again_only_when_told_of_news(
    connect: Any, hub: Hub, slow_timer: None
) -> None:
    # Given an idle consumer whose timer will not poll again for a minute
    conn = connect(**NEVER_POLLED)
    got: list[int] = []
    queue = kombu.Queue("quiet", routing_key="quiet")
    with kombu.Consumer(conn, [queue], callbacks=[collect(got)]):
        conn.register_with_event_loop(hub)
        run_for(hub, 0.3)
        before = conn.transport.queue.metrics().ops
        # When nothing arrives for a second
        run_for(hub, 1.0)
        # Then it sends nothing: a claim that found nothing is no news that sends another
        assert conn.transport.queue.metrics().ops == before
        assert got == []


class _SignalWhileDraining:
    """A wakeup's reading end on which another thread signals while the loop drains it."""

    def __init__(self, wakeup: events.Wakeup) -> None:
        self.wakeup = wakeup
        self.real = wakeup._reader
        self.signalled = False

    def recv(self, size: int) -> bytes:
        if not self.signalled:
            self.signalled = True
            self.wakeup.signal()
        return self.real.recv(size)

    def fileno(self) -> int:
        return self.real.fileno()

    def close(self) -> None:
        self.real.close()


def readable(wakeup: events.Wakeup) -> bool:
    import select

    return bool(select.select([wakeup.fileno()], [], [], 0)[0])


def test_a_signal_during_a_clear_never_silences_the_signals_after_it() -> None:
    wakeup = events.Wakeup()
    try:
        # Given a pending signal, and another thread signalling while the loop clears it
        wakeup.signal()
        wakeup._reader = _SignalWhileDraining(wakeup)  # type: ignore[assignment]
        wakeup.clear()
        # When the next signal comes after the clear
        wakeup.signal()
        # Then the loop is woken by it
        assert readable(wakeup)
    finally:
        wakeup.close()


def test_a_worker_whose_control_queue_expired_while_it_stalled_goes_on(
    connect: Any, hub: Hub, store_url: str
) -> None:
    # Given a worker's connection as Celery's: its tasks on one channel, and a no-ack
    # remote-control queue that expires on another (whose claims ride along the tasks')
    conn = connect(**OPTIONS)
    tasks: list[int] = []
    control: list[int] = []
    broadcast = kombu.Exchange("control", type="fanout")
    pidbox = kombu.Queue("w1.pidbox", exchange=broadcast, expires=0.5)

    def on_task(body: Any, message: Any) -> None:
        tasks.append(body["n"])
        message.ack()

    task_consumer = kombu.Consumer(
        conn, [kombu.Queue("work", routing_key="work")], callbacks=[on_task]
    )
    control_consumer = kombu.Consumer(
        conn.channel(), [pidbox], callbacks=[lambda body, _: control.append(body["n"])], no_ack=True
    )
    with task_consumer, control_consumer, Queue(store_url) as q:
        conn.register_with_event_loop(hub)
        publish(conn, "work", 2)
        run_until(hub, lambda: len(tasks) == 2, within=10)
        # When its loop stalls for longer than the control queue's expiry, which goes
        time.sleep(1.0)
        q.expire()
        q.flush()
        assert "w1.pidbox" not in q.queues()
        # Then, its loop turning again, it neither stops nor misses what comes next: the
        # control queue is declared again, bound as before
        publish(conn, "work", 2)
        run_until(hub, lambda: len(tasks) == 4, within=10)
        assert "w1.pidbox" in q.queues()
        kombu.Producer(conn.default_channel, exchange=broadcast).publish({"n": 7})
        run_until(hub, lambda: control == [7], within=10)
    assert tasks == [0, 1, 0, 1]
    assert control == [7]
