"""The objq kombu transport: leases behind unacked messages, URL forms, options and routing.

Consumers are real kombu connections; the crash test SIGKILLs a real consumer process that holds
messages. kombu's own generic integration tests run in ``tests/kombu_suite``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import kombu
import pytest
from kombu.transport import TRANSPORT_ALIASES

from objq_broker import ConfigurationError, Queue
from objq_broker.engine import Engine
from objq_broker.errors import StorageError
from objq_broker.kombu import Transport
from objq_broker.kombu.settings import DEFAULT_MAX_STALENESS_SECONDS

ROOT = Path(__file__).resolve().parents[2]
#: Short leases so expiry shows within a test; the heartbeat runs at a third of it.
SHORT_LEASE = {"visibility_timeout": 1.0, "polling_interval": 0.05}


def publish(conn: kombu.Connection, queue: str, *bodies: Any, **kwargs: Any) -> None:
    target = kombu.Queue(queue, routing_key=queue)
    producer = kombu.Producer(conn.default_channel)
    for body in bodies:
        producer.publish(body, routing_key=queue, declare=[target], **kwargs)


def get(conn: kombu.Connection, queue: str) -> Any:
    return conn.default_channel.basic_get(queue)


def get_soon(conn: kombu.Connection, queue: str, within: float = 5.0) -> Any:
    """A message another connection made ready: each connection has its own writer, whose
    cached state may be a fraction of a second old (the engine's staleness bound)."""
    deadline = time.monotonic() + within
    while (message := get(conn, queue)) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return message


def stats(store_url: str, queue: str) -> Any:
    with Queue(store_url) as q:
        return q.stats(queue)


# --- acknowledgements ------------------------------------------------------------------------


def test_ack_finishes_the_message(connect: Any, store_url: str) -> None:
    conn = connect()
    publish(conn, "work", {"n": 1})

    message = get(conn, "work")
    assert stats(store_url, "work").in_flight == 1
    message.ack()
    conn.default_channel.client.flush()

    after = stats(store_url, "work")
    assert (after.ready, after.in_flight, after.dead) == (0, 0, 0)
    assert get(conn, "work") is None


def test_reject_with_requeue_redelivers_with_the_flag(connect: Any) -> None:
    conn = connect()
    publish(conn, "work", {"n": 1})

    first = get(conn, "work")
    assert not first.delivery_info.get("redelivered")
    first.reject(requeue=True)

    again = get(conn, "work")
    assert again is not None and again.payload == {"n": 1}
    assert again.delivery_info["redelivered"] is True
    assert again.delivery_tag != first.delivery_tag
    again.ack()


def test_reject_without_requeue_dead_letters(connect: Any, store_url: str) -> None:
    conn = connect()
    publish(conn, "work", {"n": 1})

    get(conn, "work").reject(requeue=False)
    conn.default_channel.client.flush()

    assert get(conn, "work") is None
    with Queue(store_url) as q:
        [dead] = q.dead_letters("work")
    assert dead.error == "rejected by the consumer (requeue=False)"


def test_closing_a_channel_gives_back_what_it_held(connect: Any) -> None:
    holder, other = connect(), connect()
    publish(holder, "work", {"n": 1}, {"n": 2})
    channel = holder.channel()
    held = [channel.basic_get("work"), channel.basic_get("work")]
    assert all(m is not None for m in held)
    assert get(other, "work") is None

    channel.close()

    back = [get_soon(other, "work"), get_soon(other, "work")]
    assert sorted(m.payload["n"] for m in back) == [1, 2]


def test_a_stale_ack_after_expiry_does_not_touch_the_new_holder(connect: Any) -> None:
    slow, fast = connect(**SHORT_LEASE), connect(**SHORT_LEASE)
    publish(slow, "work", {"n": 1})
    channel = slow.channel()
    message = channel.basic_get("work")
    # Stop this connection's heartbeat: its lease runs out as if the process hung.
    slow.transport.lease_keeper.stop()

    deadline = time.monotonic() + 10
    taken = None
    while taken is None and time.monotonic() < deadline:
        time.sleep(0.2)
        taken = get(fast, "work")
    assert taken is not None and taken.delivery_info["redelivered"] is True

    message.ack()  # stale: refused inside the state, logged, no effect on the new lease
    channel.client.flush()
    taken.ack()
    fast.default_channel.client.flush()


# --- crashes and long tasks ------------------------------------------------------------------

_HOLDER = textwrap.dedent(
    """
    import sys, time
    import kombu
    import objq_broker.kombu

    conn = kombu.Connection(sys.argv[1], transport_options={"visibility_timeout": 1.0})
    channel = conn.channel()
    held = [channel.basic_get("work") for _ in range(3)]
    assert all(m is not None for m in held), held
    print("holding", flush=True)
    time.sleep(600)
    """
)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_killed_consumers_messages_come_back_redelivered(connect: Any, store_url: str) -> None:
    # Given a consumer process holding three unacked messages
    conn = connect(**SHORT_LEASE)
    publish(conn, "work", *({"n": n} for n in range(3)))
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, f"objq+{store_url}"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        assert get(conn, "work") is None  # leased by the holder
        # When it is killed without any chance to give them back
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=10)
        if holder.stdout is not None:
            holder.stdout.close()
    # Then after the visibility timeout every message comes back, flagged as redelivered
    found: list[Any] = []
    deadline = time.monotonic() + 15
    while len(found) < 3 and time.monotonic() < deadline:
        message = get(conn, "work")
        if message is None:
            time.sleep(0.1)
            continue
        found.append(message)
    assert sorted(m.payload["n"] for m in found) == [0, 1, 2]
    assert all(m.delivery_info["redelivered"] is True for m in found)
    for message in found:
        message.ack()


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_live_consumer_keeps_a_message_three_visibility_timeouts(
    connect: Any, store_url: str
) -> None:
    # Given a consumer holding a message (visibility_timeout 1 s, heartbeat every 1/3 s)
    worker, other = connect(**SHORT_LEASE), connect(**SHORT_LEASE)
    publish(worker, "work", {"n": 1})
    message = get(worker, "work")

    # When it works on it for 3.5 visibility timeouts, while another consumer polls
    stolen = []
    end = time.monotonic() + 3.5
    while time.monotonic() < end:
        found = get(other, "work")
        if found is not None:
            stolen.append(found)
        time.sleep(0.1)

    # Then nobody else got it, and its ack finishes it for good
    assert stolen == []
    message.ack()
    worker.default_channel.client.flush()
    time.sleep(1.5)
    assert get(other, "work") is None
    assert stats(store_url, "work").in_flight == 0


# --- priorities, queue operations, routing ---------------------------------------------------


def test_higher_kombu_priority_is_delivered_first(connect: Any) -> None:
    conn = connect()
    for n, priority in enumerate([0, 5, 9, 5, 1]):
        publish(conn, "work", {"n": n}, priority=priority)
    publish(conn, "work", {"n": "unset"})

    order = []
    while (message := get(conn, "work")) is not None:
        order.append(message.payload["n"])
        message.ack()
    # 9 first; equal priorities in publish order; none given = priority 0 (kombu's default).
    assert order == [2, 1, 3, 4, 0, "unset"]


def test_purge_size_delete_and_has_queue(connect: Any, store_url: str) -> None:
    conn = connect()
    channel = conn.default_channel
    publish(conn, "work", *({"n": n} for n in range(4)))
    assert channel.queue_declare("work", passive=True).message_count == 4
    held = channel.basic_get("work")

    assert channel._size("work") == 3  # the held message is not ready
    assert channel.queue_purge("work") == 3
    assert channel._size("work") == 0
    assert channel._has_queue("work")
    held.ack()

    channel.queue_delete("work")
    assert not channel._has_queue("work")
    with pytest.raises(conn.channel_errors):
        channel.queue_declare("work", passive=True)


def test_fanout_reaches_queues_bound_by_another_connection(connect: Any) -> None:
    # Given two workers' queues bound to a fanout exchange by their own connections
    exchange = kombu.Exchange("broadcast", type="fanout")
    workers = [connect(), connect()]
    for n, worker in enumerate(workers):
        kombu.Queue(f"w{n}.bcast", exchange=exchange)(worker.default_channel).declare()

    # When a third connection, which declared no queue, publishes to the exchange
    sender = connect()
    kombu.Producer(sender.default_channel, exchange=exchange).publish({"cmd": "ping"})

    # Then each bound queue gets one copy
    for n, worker in enumerate(workers):
        message = get_soon(worker, f"w{n}.bcast")
        assert message is not None and message.payload == {"cmd": "ping"}
        message.ack()
        assert get(worker, f"w{n}.bcast") is None


def test_direct_routing_uses_bindings_made_elsewhere(connect: Any) -> None:
    exchange = kombu.Exchange("tasks", type="direct")
    worker = connect()
    kombu.Queue("fast", exchange=exchange, routing_key="fast")(worker.default_channel).declare()

    sender = connect()
    kombu.Producer(sender.default_channel, exchange=exchange).publish({"n": 1}, routing_key="fast")

    message = get_soon(worker, "fast")
    assert message is not None and message.payload == {"n": 1}
    message.ack()


def test_a_binding_made_elsewhere_a_moment_ago_routes_at_once(connect: Any) -> None:
    # Given a sender whose cached view of the exchange predates a new binding
    exchange = kombu.Exchange("replies", type="direct")
    worker, sender = connect(), connect()
    kombu.Queue("old", exchange=exchange, routing_key="old")(worker.default_channel).declare()
    producer = kombu.Producer(sender.default_channel, exchange=exchange)
    producer.publish({"n": 0}, routing_key="old")
    # When another connection binds a new queue and the sender publishes to it at once
    kombu.Queue("new", exchange=exchange, routing_key="new")(worker.default_channel).declare()
    producer.publish({"n": 1}, routing_key="new")
    # Then the message is routed to the new queue, not lost to the stale cache
    message = get_soon(worker, "new")
    assert message is not None and message.payload == {"n": 1}
    message.ack()


def test_consumer_drains_a_batch_per_poll(connect: Any) -> None:
    conn = connect()
    publish(conn, "work", *({"n": n} for n in range(25)))
    got: list[int] = []

    def on_message(body: Any, message: Any) -> None:
        got.append(body["n"])
        message.ack()

    with kombu.Consumer(conn, [kombu.Queue("work")], callbacks=[on_message], prefetch_count=10):
        conn.drain_events(timeout=2)
        assert len(got) == 10  # one claim of up to the prefetch limit, delivered in one call
        while len(got) < 25:
            conn.drain_events(timeout=2)
    assert got == list(range(25))


# --- URLs, options and loading ---------------------------------------------------------------


def test_both_url_forms_reach_the_same_store(store_url: str) -> None:
    with kombu.Connection(f"objq+{store_url}") as plus:
        publish(plus, "work", {"n": 1})
    with kombu.Connection("objq://", transport_options={"url": store_url}) as bare:
        message = get_soon(bare, "work")
        assert message is not None and message.payload == {"n": 1}
        message.ack()


@pytest.mark.parametrize(
    ("url", "options", "expected"),
    [
        ("objq://", {}, "no storage URL"),
        ("objq://somewhere", {}, "names no storage"),
        ("objq+file:///tmp/x", {"url": "file:///tmp/y"}, "both in the broker URL"),
        ("objq+file:///tmp/x", {"visibilty_timeout": 5}, "unknown broker_transport_options"),
        ("objq+file:///tmp/x", {"visibility_timeout": 0}, "positive number"),
        (
            "objq+file:///tmp/x",
            {"visibility_timeout": 3, "heartbeat_interval": 3},
            "less than visibility_timeout",
        ),
        ("objq+file:///tmp/x", {"store_options": "fsync"}, "store_options must be a dict"),
        ("objq+bogus://bucket", {}, "unknown scheme"),
        ("objq+file:///tmp/x;objq+file:///tmp/y", {}, "failover URLs"),
    ],
)
def test_bad_urls_and_options_are_refused_clearly(
    url: str, options: dict[str, Any], expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OBJQ_URL", raising=False)
    conn = kombu.Connection(url, transport_options=options)
    with pytest.raises(ConfigurationError, match=expected) as caught:
        conn.connect()
    if "unknown broker_transport_options" in expected:
        assert "visibility_timeout" in str(caught.value)  # the accepted ones are listed


def test_a_consumer_reads_the_state_for_each_poll_unless_told_otherwise(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The engine's default staleness (0.2 s) would serve polls from its cache and leave a
    # message another process sent waiting; the transport's queue reads each time it commits
    # directly (with a broker, the broker's engine is the only writer and never needs to)
    monkeypatch.setenv("OBJQ_BROKER", "off")

    def staleness(conn: kombu.Connection) -> float:
        conn.connect()
        engine = conn.transport.open_queue().committer
        assert isinstance(engine, Engine)
        return engine.max_staleness_seconds

    with kombu.Connection(f"objq+{store_url}") as conn:
        assert staleness(conn) == DEFAULT_MAX_STALENESS_SECONDS < 0.01
    options = {"max_staleness_seconds": 0.5}
    with kombu.Connection(f"objq+{store_url}", transport_options=options) as conn:
        assert staleness(conn) == 0.5


def test_a_store_that_cannot_be_opened_fails_the_connect(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(StorageError, match="Not a directory"):
        kombu.Connection(f"objq+{(blocker / 'objq').as_uri()}").connect()


def test_importing_registers_the_alias() -> None:
    assert TRANSPORT_ALIASES["objq"] == "objq_broker.kombu:Transport"
    assert kombu.Connection("objq+memory://alias").get_transport_cls() is Transport
    assert Transport.driver_type == "objq"


_CELERY_CLASS_PATH = textwrap.dedent(
    """
    import sys
    from celery import Celery
    from kombu.transport import TRANSPORT_ALIASES

    assert "objq" not in TRANSPORT_ALIASES  # nothing imported objq_broker.kombu
    app = Celery("check", set_as_current=False)
    app.conf.broker_transport = "objq_broker.kombu:Transport"
    app.conf.broker_url = "objq://"
    app.conf.broker_transport_options = {"url": sys.argv[1]}
    with app.connection_for_write() as conn:
        conn.SimpleQueue("check").put({"via": "broker_transport"})
        message = conn.SimpleQueue("check").get(timeout=2)
        message.ack()
        print(type(conn.transport).__module__, message.payload["via"])
    """
)


def test_celery_loads_the_transport_by_class_path(store_url: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _CELERY_CLASS_PATH, store_url],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["objq_broker.kombu.transport", "broker_transport"]


def test_a_message_group_id_names_the_jobs_group(connect: Any, store_url: str) -> None:
    # As kombu's SQS transport reads it: Celery's apply_async(..., MessageGroupId=...)
    conn = connect()
    publish(conn, "work", {"n": 1}, MessageGroupId="tenant-42")
    publish(conn, "work", {"n": 2})
    conn.default_channel.client.flush()
    with Queue(store_url) as q:
        assert sorted(str(job.group) for _, job in q.jobs("work")) == ["None", "tenant-42"]


def test_celerys_apply_async_message_group_id_reaches_the_job(store_url: str) -> None:
    from celery import Celery

    app = Celery("groups", broker=f"objq+{store_url}")
    # send_task is what a task's apply_async calls, with the same options
    app.send_task("groups.add", (1, 2), MessageGroupId="tenant-42")
    app.send_task("groups.add", (1, 3))
    app.close()
    with Queue(store_url) as q:
        assert [job.group for _, job in q.jobs("celery")] == ["tenant-42", None]


def test_a_queue_taken_through_a_connection_never_established_is_released_when_it_closes() -> None:
    # Given a connection nobody connected (as Celery's pool hands them out), whose transport's
    # queue is taken all the same (as the task-outcome handler does)
    connection = kombu.Connection(f"objq+memory://lazy-{os.getpid()}-{time.monotonic_ns()}")
    queue = connection.transport.open_queue()
    assert not queue.closed
    # When the connection closes
    connection.close()
    # Then its queue is closed with it: no writer thread left running
    assert queue.closed
