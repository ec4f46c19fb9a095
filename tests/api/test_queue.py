"""Queue as a user drives it (AsyncQueue, its asyncio twin, is in ``test_aio.py``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from objq_broker import ConfigurationError, LeaseLost, Queue, builders
from objq_broker.builders import StagedBodies
from objq_broker.errors import QueueClosed
from objq_broker.storage import MemoryStore


@pytest.fixture
def queue() -> Iterator[Queue]:
    q = Queue(store=MemoryStore("api"))
    yield q
    q.close()


def test_priority_then_fifo(queue: Queue) -> None:
    for payload, priority in [(b"low-1", 5), (b"high-1", 0), (b"low-2", 5), (b"high-2", 0)]:
        queue.enqueue("q", payload, priority=priority)
    order = [d.payload for d in queue.claim("q", 4)]
    assert order == [b"high-1", b"high-2", b"low-1", b"low-2"]


def test_delayed_job_waits_until_due(queue: Queue) -> None:
    queue.enqueue("q", b"later", delay=timedelta(milliseconds=300))
    assert queue.claim("q") == []
    assert queue.stats("q").delayed == 1
    [delivery] = queue.claim("q", timeout=5)
    assert delivery.payload == b"later"


def test_claim_with_timeout_wakes_on_a_local_enqueue(queue: Queue) -> None:
    queue.declare("q")
    timer = threading.Timer(0.2, lambda: queue.enqueue("q", b"x"))
    timer.start()
    started = time.monotonic()
    found = queue.claim("q", timeout=10)
    timer.join()
    assert [d.payload for d in found] == [b"x"]
    assert time.monotonic() - started < 5


def test_after_a_claim_that_found_a_job_the_next_empty_one_looks_again_after_poll_seconds() -> None:
    store = MemoryStore("polls")
    # Two engines (no broker): the producer's commits do not wake the consumer's claims.
    with (
        Queue(store=store, broker="off", poll_seconds=0.4, max_poll_seconds=4.0) as consumer,
        Queue(store=store, broker="off") as producer,
    ):
        producer.enqueue("q", b"first")
        assert len(consumer.claim("q", timeout=5)) == 1
        timer = threading.Timer(0.05, lambda: producer.enqueue("q", b"second"))
        timer.start()
        started = time.monotonic()
        found = consumer.claim("q", timeout=5)
        waited = time.monotonic() - started
        timer.join()
        assert [d.payload for d in found] == [b"second"]
        # Found at the first look after poll_seconds, not after twice that.
        assert 0.35 < waited < 0.7, f"found after {waited:.2f} s"


def test_nack_retries_with_backoff_then_dead_letters(queue: Queue) -> None:
    queue.declare("q", max_attempts=2, backoff_base_seconds=0.05, backoff_cap_seconds=0.1)
    queue.enqueue("q", b"flaky")
    [first] = queue.claim("q")
    assert queue.nack(first, error="boom 1") == "retry"
    stats = queue.stats("q")
    assert stats.delayed + stats.ready == 1
    [second] = queue.claim("q", timeout=5)
    assert second.job.attempts == 2
    assert queue.nack(second, error="boom 2") == "dead"
    [dead] = queue.dead_letters("q")
    assert (dead.payload, dead.error, dead.attempts) == (b"flaky", "boom 2", 2)
    assert queue.retry_dead("q") == [dead.id]
    [again] = queue.claim("q")
    assert again.job.attempts == 1
    queue.ack(again)
    assert queue.stats("q").dead == 0


def test_stale_token_cannot_ack_the_new_holders_delivery(queue: Queue) -> None:
    queue.enqueue("q", b"x")
    [old] = queue.claim("q", lease=0.05, owner="slow")
    time.sleep(0.1)  # kept: the lease running out is what this test is about
    [new] = queue.claim("q", owner="fast")
    assert new.id == old.id and new.token != old.token
    with pytest.raises(LeaseLost):
        queue.ack(old)
    with pytest.raises(LeaseLost):
        queue.nack(old)
    queue.ack(new)


def test_keep_alive_holds_a_long_job(queue: Queue) -> None:
    queue.enqueue("q", b"long")
    [delivery] = queue.claim("q", lease=0.2)
    with queue.keep_alive([delivery], every=0.05):
        time.sleep(0.6)  # kept: three leases' time, which the heartbeats must bridge
        assert queue.claim("q") == []
    queue.ack(delivery)


def test_release_returns_jobs_without_an_attempt(queue: Queue) -> None:
    queue.enqueue_many("q", [b"a", b"b"])
    deliveries = queue.claim("q", 2)
    queue.release(deliveries)
    again = queue.claim("q", 2)
    assert [d.payload for d in again] == [b"a", b"b"]
    assert [d.job.attempts for d in again] == [1, 1]


def test_idempotent_enqueue(queue: Queue) -> None:
    first = queue.enqueue("q", b"charge", key="order-7")
    second = queue.enqueue("q", b"charge", key="order-7")
    assert second.id == first.id
    assert queue.stats("q").ready == 1


def test_heartbeat_reports_lost_leases(queue: Queue) -> None:
    queue.enqueue_many("q", [b"a", b"b"])
    held, lost = queue.claim("q", 2)
    queue.ack(lost)
    assert queue.heartbeat([held, lost]) == [True, False]


def test_unacked_wait_false_ops_are_durable_after_flush(tmp_path: Path) -> None:
    url = tmp_path.as_uri()
    with Queue(url) as producer:
        producer.enqueue_many("q", [b"x"] * 50)
        deliveries = producer.claim("q", 50)
        for delivery in deliveries:
            producer.ack(delivery, wait=False)
    with Queue(url) as reader:
        assert reader.stats("q").in_flight == 0
        assert reader.jobs("q") == []


def test_bad_arguments_are_refused_clearly(queue: Queue) -> None:
    with pytest.raises(ConfigurationError, match="expected payload bytes, found str"):
        queue.enqueue("q", "text")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="queue name"):
        queue.enqueue("a/b", b"x")
    for name in (None, 7):
        with pytest.raises(ConfigurationError, match=f"queue: expected str, found {name}"):
            queue.declare(name)  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match=f"queue: expected str, found {name}"):
            queue.enqueue(name, b"x")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="expected a queue name or a list of them"):
        queue.claim(None)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="n: expected int >= 1, found 0"):
        queue.claim("q", 0)
    with pytest.raises(ConfigurationError, match="unknown setting"):
        queue.declare("q2")
        queue.configure("q2", colour=1)
    with pytest.raises(ConfigurationError, match="expected a URL"):
        Queue()


def test_url_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OBJQ_URL", tmp_path.as_uri())
    with Queue() as q:
        q.enqueue("q", b"x")
    assert (tmp_path / "state.json").exists()


def test_store_and_url_together_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="one way to name the store"):
        Queue("memory://x", store=MemoryStore("y"))


def test_closed_queue_refuses_work() -> None:
    q = Queue(store=MemoryStore("closed"))
    q.enqueue("q", b"x")
    q.close()
    with pytest.raises(QueueClosed):
        q.enqueue("q", b"y")


@pytest.mark.parametrize("call", ["enqueue", "enqueue_many"])
def test_a_misspelt_job_option_is_refused_and_adds_nothing(queue: Queue, call: str) -> None:
    queue.declare("q")
    with pytest.raises(TypeError, match=r"unexpected keyword 'priorty'.*priority"):
        if call == "enqueue":
            queue.enqueue("q", b"x", priorty=3)  # type: ignore[call-arg]
        else:
            queue.enqueue_many("q", [b"x"], priorty=3)  # type: ignore[call-arg]
    assert queue.stats("q").ready == 0


def test_a_tenant_with_a_backlog_does_not_hold_up_a_quiet_one(queue: Queue) -> None:
    # Given a queue where tenant "big" enqueued a backlog before tenant "quiet" enqueued one
    queue.declare("q")
    queue.enqueue_many("q", [f"big {n}".encode() for n in range(50)], group="big")
    queue.enqueue("q", b"quiet 0", group="quiet")
    # When a worker claims, then a second worker claims while the first holds its job
    (first,) = queue.claim("q")
    (second,) = queue.claim("q")
    # Then the second gets the quiet tenant's job, not the next of the backlog
    assert (first.job.group, second.job.group) == ("big", "quiet")
    assert second.job.payload == b"quiet 0"


def test_group_concurrency_one_runs_a_groups_jobs_one_after_another(queue: Queue) -> None:
    queue.declare("q", group_concurrency=1)
    queue.enqueue_many("q", [b"a0", b"a1"], group="a")
    (held,) = queue.claim("q", 5)
    assert queue.claim("q") == []  # the next of the group waits while the first is leased
    queue.ack(held)
    (after,) = queue.claim("q")
    assert (held.job.payload, after.job.payload) == (b"a0", b"a1")


def test_a_group_on_staged_bodies_is_refused_and_adds_nothing(queue: Queue) -> None:
    queue.declare("q")
    staged = [StagedBodies("staging/w/b.json", 1)]
    with pytest.raises(ConfigurationError, match="expected no group"):
        queue.enqueue_staged("q", staged, write_id="w", group="tenant")
    assert queue.stats("q").ready == 0


def test_each_payload_may_name_its_own_group_and_a_mismatch_is_refused(queue: Queue) -> None:
    queue.declare("q")
    jobs = queue.submit(builders.enqueue("q", [b"a", b"b"], groups=["t1", None])).result()
    assert [job.group for job in jobs] == ["t1", None]
    with pytest.raises(ConfigurationError, match="2 payloads but 1 groups"):
        builders.enqueue("q", [b"a", b"b"], groups=["t1"])
    with pytest.raises(ConfigurationError, match="expected group or groups, found both"):
        builders.enqueue("q", [b"a"], groups=["t1"], group="t2")
    with pytest.raises(ConfigurationError, match="group"):
        builders.enqueue("q", [b"a"], groups=[""])
