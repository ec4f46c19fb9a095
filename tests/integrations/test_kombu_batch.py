"""kombu's publish batches on the objq transport (``Producer.batch()``, kombu 5.7 on): the
messages of a batch are committed together when it flushes, none before; a batch that raises
sends nothing; a Celery chord sends its group callback through one."""

from __future__ import annotations

from typing import Any

import kombu
import pytest

from objq_broker import Queue

pytestmark = pytest.mark.skipif(
    not hasattr(kombu.Producer, "batch"), reason="kombu before 5.7 has no publish batches"
)
MESSAGES = 50


def _ready(store_url: str, queue: str) -> int:
    with Queue(store_url, broker="client") as q:
        return q.stats(queue).ready if queue in q.queues() else 0


def _writes(conn: kombu.Connection) -> int:
    return int(conn.transport.open_queue().metrics().state_writes)


def _target(name: str) -> kombu.Queue:
    return kombu.Queue(name, routing_key=name)


def test_a_batch_commits_its_messages_together_when_it_ends(connect: Any, store_url: str) -> None:
    conn = connect()
    producer = kombu.Producer(conn.default_channel)
    producer.publish("declare", routing_key="q", declare=[_target("q")])
    assert _ready(store_url, "q") == 1
    before = _writes(conn)
    with producer.batch():
        for n in range(MESSAGES):
            producer.publish({"n": n}, routing_key="q")
        # Held: nothing of the batch is in the store before it ends
        assert _ready(store_url, "q") == 1
    # Every message is stored once it ends, in a commit or two, not one each
    assert _ready(store_url, "q") == MESSAGES + 1
    assert _writes(conn) - before <= 2
    channel = conn.default_channel
    bodies = [channel.basic_get("q") for _ in range(MESSAGES + 1)]
    assert [m.decode() for m in bodies[1:]] == [{"n": n} for n in range(MESSAGES)]


def test_a_batch_that_raises_sends_nothing_and_the_producer_goes_on(
    connect: Any, store_url: str
) -> None:
    conn = connect()
    producer = kombu.Producer(conn.default_channel)
    producer.publish("declare", routing_key="q", declare=[_target("q")])
    with pytest.raises(RuntimeError, match="changed my mind"), producer.batch():
        for n in range(5):
            producer.publish({"n": n}, routing_key="q")
        raise RuntimeError("changed my mind")
    assert _ready(store_url, "q") == 1
    producer.publish("after", routing_key="q")
    assert _ready(store_url, "q") == 2


def test_a_full_batch_flushes_on_the_way(connect: Any, store_url: str) -> None:
    conn = connect()
    producer = kombu.Producer(conn.default_channel)
    producer.publish("declare", routing_key="q", declare=[_target("q")])
    with producer.batch(max_size=10):
        for n in range(25):
            producer.publish({"n": n}, routing_key="q")
        # Two full batches went out; the last five wait for the end
        assert _ready(store_url, "q") == 21
    assert _ready(store_url, "q") == 26


def test_a_bad_message_in_a_batch_is_refused_at_its_publish(connect: Any, store_url: str) -> None:
    conn = connect()
    producer = kombu.Producer(conn.default_channel)
    producer.publish("declare", routing_key="q", declare=[_target("q")])
    with pytest.raises(ValueError, match="queue name"), producer.batch():
        producer.publish({"n": 1}, routing_key="q")
        producer.publish({"n": 2}, routing_key="bad\nname")
    # The batch was left by an error: what it held is discarded, as kombu asks
    assert _ready(store_url, "q") == 1


def test_a_fanout_batch_sends_a_copy_to_each_bound_queue(connect: Any, store_url: str) -> None:
    conn = connect()
    exchange = kombu.Exchange("news", type="fanout")
    channel = conn.default_channel
    for name in ("a", "b"):
        kombu.Queue(name, exchange=exchange)(channel).declare()
    producer = kombu.Producer(channel, exchange=exchange)
    with producer.batch():
        for n in range(10):
            producer.publish({"n": n})
        assert (_ready(store_url, "a"), _ready(store_url, "b")) == (0, 0)
    assert (_ready(store_url, "a"), _ready(store_url, "b")) == (10, 10)
