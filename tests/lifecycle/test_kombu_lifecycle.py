"""What purge, delete and expiry do to a kombu queue on objq, and to its bindings, as
docs/celery.md says: ``celery purge -Q`` empties a queue (its bindings stay, as with AMQP);
``Queue.delete_queue`` removes it and every binding to it; a queue declared with ``expires``
goes once unused for that long; a message routed afterwards is dropped, never bringing the
queue back."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from objq_broker import Queue
from objq_broker.engine.bindings import read_exchange
from objq_broker.errors import QueueNotFound
from objq_broker.storage import open_store

kombu = pytest.importorskip("kombu")

ROOT = Path(__file__).resolve().parents[2]


#: Longest wait for a removed queue's bindings to go.
UNBIND_SECONDS = 10.0


def bound(url: str, exchange: str) -> list[str]:
    record, _ = read_exchange(open_store(url), exchange)
    return [] if record is None else sorted(b[2] for b in record.bindings)


def bound_once_unbound(url: str, exchange: str, expected: list[str]) -> list[str]:
    """The queues bound to ``exchange`` once the bindings of a removed queue are gone: a
    commit that removes a queue unbinds it off the writer thread, after the commit, in the
    process that committed it (the broker, maybe another), so a caller cannot wait for it."""
    deadline = time.monotonic() + UNBIND_SECONDS
    while (found := bound(url, exchange)) != expected and time.monotonic() < deadline:
        time.sleep(0.02)
    return found


def publish(conn: Any, exchange: Any, n: int, routing_key: str = "event.x") -> None:
    producer = kombu.Producer(conn.default_channel, exchange=exchange)
    for i in range(n):
        producer.publish({"n": i}, routing_key=routing_key)


def test_celery_purge_empties_and_delete_queue_removes_the_queue_and_its_bindings(
    connect: Any, store_url: str
) -> None:
    exchange = kombu.Exchange("tasks", type="direct")
    conn = connect()
    kombu.Queue("work", exchange=exchange, routing_key="work")(conn.default_channel).declare()
    kombu.Queue("other", exchange=exchange, routing_key="work")(conn.default_channel).declare()
    publish(conn, exchange, 3, routing_key="work")
    with Queue(store_url, broker="off") as q:
        assert q.stats("work").ready == 3

        # When `celery purge -Q work` runs
        env = dict(os.environ, CELERY_BROKER_URL=f"objq+{store_url}", OBJQ_BROKER="off")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        app = "tests.lifecycle.events_app"
        purge = [sys.executable, "-m", "celery", "-A", app, "purge", "-Q", "work", "-f"]
        done = subprocess.run(
            purge, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stderr
        assert "Purged 3 messages" in done.stdout, done.stdout

        # Then the queue is empty, still there and still bound: messages reach it again
        assert q.stats("work").ready == 0
        assert bound(store_url, "tasks") == ["other", "work"]
        publish(conn, exchange, 1, routing_key="work")
        assert q.stats("work").ready == 1

        # When Queue.delete_queue removes it
        assert q.delete_queue("work") == 1
        q.flush()
        # Then it and its binding are gone, and what is routed to it is dropped
        assert bound_once_unbound(store_url, "tasks", ["other"]) == ["other"]
        publisher = connect()
        publish(publisher, exchange, 2, routing_key="work")
        assert q.queues() == ["other"]
        assert q.stats("other").ready == 3 + 1 + 2  # "other" got every copy


def test_a_kombu_queue_with_expires_goes_once_its_consumer_stops(
    connect: Any, store_url: str
) -> None:
    exchange = kombu.Exchange("events", type="topic")
    live, dead, sender = connect(), connect(), connect()
    got: list[Any] = []

    def consumer(conn: Any, name: str) -> Any:
        queue = kombu.Queue(name, exchange=exchange, routing_key="#", expires=1.5)
        return kombu.Consumer(conn, [queue], callbacks=[on_message])

    def on_message(body: Any, message: Any) -> None:
        got.append(body)
        message.ack()

    with consumer(live, "ev.live"), consumer(dead, "ev.dead"):
        # `dead` never drains again, as a process killed without shutdown
        started = time.monotonic()
        while time.monotonic() - started < 6:  # four expiries
            publish(sender, exchange, 1)
            with contextlib.suppress(TimeoutError):
                live.drain_events(timeout=0.3)
        with Queue(store_url, broker="off") as q:
            assert q.queues() == ["ev.live"]
            assert bound(store_url, "events") == ["ev.live"]
            publish(sender, exchange, 3)
            assert q.queues() == ["ev.live"]  # the routed messages did not bring it back
    assert got, "the live consumer received events"


def test_declaring_an_expired_queue_again_brings_it_back_with_its_binding(
    connect: Any, store_url: str
) -> None:
    exchange = kombu.Exchange("replies", type="direct")
    conn = connect()
    queue = kombu.Queue("reply.1", exchange=exchange, routing_key="r1", expires=0.5)
    queue(conn.default_channel).declare()
    # Through the namespace's broker, as the connection's own queue commits: a direct writer
    # beside a broker is seen by the broker only once it conflicts with it
    with Queue(store_url) as q:
        time.sleep(0.6)
        q.expire()  # a commit: the queue is past its expiry
        q.flush()
        assert q.queues() == []
        assert bound_once_unbound(store_url, "replies", []) == []
        # The same connection declares it again (kombu's Consumer does, each time it starts)
        queue(conn.default_channel).declare()
        publish(conn, exchange, 1, routing_key="r1")
        assert q.stats("reply.1").ready == 1


def test_a_queue_that_expired_under_its_stalled_consumer_is_declared_again_when_it_claims(
    connect: Any, store_url: str
) -> None:
    exchange = kombu.Exchange("control", type="fanout")
    conn, sender = connect(), connect()
    got: list[Any] = []

    def on_message(body: Any, message: Any) -> None:
        got.append(body)
        message.ack()

    queue = kombu.Queue("w1.pidbox", exchange=exchange, expires=0.5)
    with kombu.Consumer(conn, [queue], callbacks=[on_message]), Queue(store_url) as q:
        # Given a consumer that goes unheard for longer than its queue's expiry (a blocked
        # event loop), so that the queue expires under it with its binding
        time.sleep(0.6)
        q.expire()
        q.flush()
        assert q.queues() == []
        assert bound_once_unbound(store_url, "control", []) == []
        # When it claims again (this raised QueueNotFound, and a Celery worker stopped)
        with contextlib.suppress(TimeoutError):
            conn.drain_events(timeout=0.3)
        # Then its queue is back, bound as it was, and what is sent now reaches it
        assert q.queues() == ["w1.pidbox"]
        assert bound(store_url, "control") == ["w1.pidbox"]
        publish(sender, exchange, 1)
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                conn.drain_events(timeout=0.3)
    assert got == [{"n": 0}]


def test_a_queue_without_expiry_deleted_under_its_consumer_is_not_brought_back(
    connect: Any, store_url: str
) -> None:
    conn = connect()
    queue = kombu.Queue("work", exchange=kombu.Exchange("tasks", type="direct"), routing_key="w")
    with kombu.Consumer(conn, [queue], callbacks=[]), Queue(store_url) as q:
        # Given a queue declared without expiry, deleted while consumed
        assert q.delete_queue("work") == 0
        # When its consumer claims, then it is told, and the queue stays gone
        with pytest.raises(QueueNotFound, match="'work' is not declared"):
            conn.drain_events(timeout=0.3)
        assert q.queues() == []
