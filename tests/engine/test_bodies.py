"""Large payloads live out of the state, in immutable bodies objects, and never get lost.

Most tests here send every large payload out of line (``inline_state_bytes=0``); by default a
small state keeps them inline (the last tests)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from objq_broker import ConfigurationError, Queue, StateCorrupt, builders
from objq_broker.engine import STATE_KEY
from objq_broker.engine.archive import iter_archive
from objq_broker.engine.bodies import BodyCache
from objq_broker.model.bodies import BODIES_PREFIX, INLINE_MAX_BYTES, encode_bodies
from objq_broker.model.encoding import decode_state
from objq_broker.storage import MemoryStore, open_store

BIG = b"B" * (INLINE_MAX_BYTES + 1)
SMALL = b"s" * INLINE_MAX_BYTES
#: Every large payload out of line, however small the state.
OUT: dict[str, Any] = {"inline_state_bytes": 0}


def test_large_payloads_leave_the_state_and_come_back_on_claim(tmp_path: Path) -> None:
    url = tmp_path.as_uri()
    with Queue(url, **OUT) as producer:
        producer.enqueue_many("q", [BIG + bytes([n]) for n in range(10)] + [SMALL])
    store = open_store(url)
    state = decode_state(store.get(STATE_KEY), "state")
    assert sum(job.ref is not None for job in state.jobs) == 10
    assert all(job.body == "" for job in state.jobs if job.ref is not None)
    assert b"B" * 100 not in store.get(STATE_KEY)
    [bodies] = store.list(BODIES_PREFIX)
    assert state.bodies == {bodies: 10}
    with Queue(url, **OUT) as consumer:  # another process's view: it reads the bodies object
        deliveries = consumer.claim("q", 11)
        assert sorted(d.payload for d in deliveries) == sorted(
            [BIG + bytes([n]) for n in range(10)] + [SMALL]
        )
        for delivery in deliveries:
            consumer.ack(delivery)
    assert store.list(BODIES_PREFIX) == []  # the last reference went: the object is deleted
    records = list(iter_archive(store))
    assert sorted(r.job.payload for r in records) == sorted(d.payload for d in deliveries)
    assert all(r.job.ref is None for r in records)


def test_dead_letters_keep_their_bodies_until_purged() -> None:
    store = MemoryStore("bodies-dead")
    with Queue(store=store, **OUT) as queue:
        queue.enqueue("q", BIG, max_attempts=1)
        [delivery] = queue.claim("q")
        queue.nack(delivery, error="boom")
        [dead] = queue.dead_letters("q")
        assert dead.payload == BIG
        [(state, job)] = queue.jobs("q")
        assert (state, job.payload) == ("dead", BIG)
        assert queue.job(dead.id) is not None
        queue.retry_dead("q")
        [again] = queue.claim("q")
        assert again.payload == BIG
        queue.nack(again, retry=False)
        assert queue.purge_dead("q") == 1
    assert store.list(BODIES_PREFIX) == []


def test_a_job_enqueued_and_finished_in_one_batch_writes_no_bodies_object() -> None:
    store = MemoryStore("bodies-same-batch")
    with Queue(store=store, **OUT) as queue:
        queue.enqueue("q", BIG)
        [delivery] = queue.claim("q")
        queue.ack(delivery)
        # Given a job whose enqueue and ack share a commit
        enqueue = queue.submit(builders.enqueue("q", [BIG]))
        enqueue.result()
    assert len(store.list(BODIES_PREFIX)) == 1  # only the second, still queued job's


def test_purge_drops_the_bodies_objects() -> None:
    store = MemoryStore("bodies-purge")
    with Queue(store=store, **OUT) as queue:
        queue.enqueue_many("q", [BIG] * 5)
        assert len(store.list(BODIES_PREFIX)) == 1
        assert queue.purge("q") == 5
    assert store.list(BODIES_PREFIX) == []


def _enqueue_with_its_body_missing(url: str) -> None:
    """One large job in ``url``'s queue "q", whose bodies object is then deleted."""
    with Queue(url, **OUT) as queue:
        queue.enqueue("q", BIG)
    store = open_store(url)
    [key] = store.list(BODIES_PREFIX)
    store.delete(key)


def test_a_job_whose_bodies_object_is_missing_is_dead_lettered_saying_so(
    tmp_path: Path,
) -> None:
    url = tmp_path.as_uri()
    _enqueue_with_its_body_missing(url)
    with Queue(url, **OUT) as queue:
        assert queue.claim("q") == []
        queue.flush()
        [dead] = queue.dead_letters("q")
        assert dead.attempts == 1 and "missing" in (dead.error or "")


def test_idempotent_enqueue_returns_the_earlier_payload() -> None:
    store = MemoryStore("bodies-key")
    with Queue(store=store, **OUT) as queue:
        first = queue.enqueue("q", BIG, key="k")
    with Queue(store=store, **OUT) as queue:
        again = queue.enqueue("q", b"other", key="k")
        assert again.id == first.id and again.payload == BIG


def test_a_claim_filled_off_the_callers_thread_reads_other_processes_bodies(
    tmp_path: Path,
) -> None:
    url = tmp_path.as_uri()
    with Queue(url, **OUT) as producer:
        for n in range(30):  # one commit, so one bodies object, per message
            producer.enqueue("q", BIG + bytes([n]))
    assert len(open_store(url).list(BODIES_PREFIX)) == 30
    with Queue(url, **OUT) as consumer:
        filled = consumer.then_fill(consumer.submit_claim(["q"], 30)).result(10)
        assert all(d.job.body for d in filled)  # loaded before anyone asks for a payload
        assert sorted(d.payload for d in filled) == sorted(BIG + bytes([n]) for n in range(30))
        for delivery in filled:
            consumer.ack(delivery, wait=False)
    assert open_store(url).list(BODIES_PREFIX) == []  # deleted once the last job finished


def test_a_missing_body_leaves_the_filled_claim_without_that_job(tmp_path: Path) -> None:
    url = tmp_path.as_uri()
    _enqueue_with_its_body_missing(url)
    with Queue(url, **OUT) as consumer:
        filled = consumer.then_fill(consumer.submit_claim(["q"], 1))
        assert filled.result(10) == []
        consumer.flush()
        assert [job.attempts for job in consumer.dead_letters("q")] == [1]


def test_the_body_cache_keeps_recent_objects_up_to_its_byte_budget() -> None:
    store = MemoryStore("bodies-budget")
    cache = BodyCache(store, max_bytes=1000)
    for n in range(5):
        store.write(f"bodies/{n}.json", encode_bodies([("x" * 400, False)]))
    for n in range(5):
        assert cache.load(f"bodies/{n}.json#0") == ("x" * 400, False)
    store.delete("bodies/0.json")
    store.delete("bodies/4.json")
    assert cache.load("bodies/4.json#0") == ("x" * 400, False)  # the newest: still cached
    with pytest.raises(StateCorrupt, match="missing"):
        cache.load("bodies/0.json#0")  # the oldest: dropped to keep 1,000 bytes at most


def test_a_small_state_keeps_large_payloads_until_it_reaches_its_budget() -> None:
    store = MemoryStore("bodies-inline")
    payload = b"L" * 1000  # a Celery message's size
    with Queue(store=store, inline_state_bytes=8000) as queue:
        # Given a state far under its budget: the payloads stay in it, no bodies object
        for n in range(5):
            queue.enqueue("q", payload + bytes([n]))
        assert store.list(BODIES_PREFIX) == []
        # When the state has grown past it: the next ones go out of line
        for n in range(5, 15):
            queue.enqueue("q", payload + bytes([n]))
        out_of_line = len(store.list(BODIES_PREFIX))
        assert 0 < out_of_line < 10
        doc = decode_state(store.get(STATE_KEY), "state")
        assert len(doc.jobs) == 15 and sum(job.ref is None for job in doc.jobs) == 15 - out_of_line
        # (the state grows by every job's record either way; the payloads it holds stop)
        assert sum(len(job.body) for job in doc.jobs) <= 8000
        # Then every payload comes back, whichever way it was kept
        deliveries = queue.claim("q", 15)
        assert sorted(d.payload for d in deliveries) == [payload + bytes([n]) for n in range(15)]
        for delivery in deliveries:
            queue.ack(delivery)
    assert store.list(BODIES_PREFIX) == []


def test_inline_state_bytes_is_checked() -> None:
    with pytest.raises(
        ConfigurationError,
        match="inline_state_bytes: expected a whole number, zero or more, found -1",
    ):
        Queue("memory://bodies-bad-budget", inline_state_bytes=-1)
