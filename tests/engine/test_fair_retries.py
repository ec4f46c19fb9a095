"""Direct mode under contention: a writer that lost a race goes again at once and does not pay
again for what it already wrote; a broker's epoch does not stop writers that are not brokers."""

from __future__ import annotations

from typing import Any

import pytest

from objq_broker import Queue
from objq_broker.engine.commit import Engine
from objq_broker.errors import StorageError, StorageUnavailable
from objq_broker.model.ops import TakeBroker
from objq_broker.model.records import BrokerRecord
from objq_broker.storage import MemoryStore


def test_a_retry_after_a_conflict_reuses_the_archive_object_it_wrote() -> None:
    store = MemoryStore()
    # (an archive object for every commit that finishes jobs, not a tail in the state)
    with Queue(store=store, archive_tail_bytes=0) as worker, Queue(store=store) as producer:
        worker.enqueue("q", b"job")
        [delivery] = worker.claim("q")
        producer.enqueue("q", b"another")  # the worker's cached state is now stale
        worker.ack(delivery)
        metrics = worker.metrics()
        assert metrics.conflicts == 1
        assert metrics.archive_writes == 1  # written once, kept for the retry
        assert len(store.list("archive/")) == 1
        [record] = [line for key in store.list("archive/") for line in store.get(key).splitlines()]
        assert b'"outcome":"done"' in record


class _Conflicting(MemoryStore):
    """Another writer commits just before each of the first ``n`` state writes."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def write(self, key: str, data: bytes, **condition: Any) -> str:
        if key == "state.json" and self.n > 0 and condition.get("if_version"):
            self.n -= 1
            blob = self.read(key)
            assert blob is not None
            super().write(key, blob.data + b" ", if_version=blob.version)  # progress elsewhere
        return super().write(key, data, **condition)


def test_conflicts_that_are_progress_never_fail_a_call_at_the_deadline() -> None:
    store = _Conflicting(0)
    with Queue(store=store, commit_deadline_seconds=0.2) as q:
        q.declare("q")
        store.n = 200  # far more conflicts than fit in the deadline at any backoff
        q.enqueue("q", b"x")
        assert q.metrics().conflicts == 200
        assert q.stats("q").ready == 1


def test_storage_errors_still_fail_at_the_deadline() -> None:
    class Down(MemoryStore):
        def write(self, key: str, data: bytes, **condition: Any) -> str:
            raise StorageUnavailable("down")

    with (
        Queue(store=Down(), commit_deadline_seconds=0.3) as q,
        pytest.raises(StorageError, match=r"after \d+ tries"),
    ):
        q.declare("q")


def test_a_direct_writer_is_not_fenced_by_a_broker_epoch() -> None:
    store = MemoryStore()
    engine = Engine(store)
    engine.call(TakeBroker(BrokerRecord("b", "127.0.0.1:1", 0, 0.0), None))
    engine.close()
    with Queue(store=store) as direct:
        direct.enqueue("q", b"x")  # a client with no broker to reach commits directly
        assert direct.stats("q").ready == 1


class _LandsLate(MemoryStore):
    """The first conditional state write times out, and lands only when the next one is
    sent: a PUT still in flight when its caller gave up and read the state again."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight: tuple[bytes, str] | None = None
        self.armed = False

    def write(self, key: str, data: bytes, **condition: Any) -> str:
        version = condition.get("if_version")
        if key == "state.json" and version:
            if self.armed:
                self.armed = False
                self.in_flight = (data, version)
                raise StorageUnavailable("read timeout (the write is still in flight)")
            if self.in_flight is not None:
                late, self.in_flight = self.in_flight, None
                super().write(key, late[0], if_version=late[1])
        return super().write(key, data, **condition)


def test_a_write_that_lands_after_its_caller_gave_up_is_found_not_doubled() -> None:
    store = _LandsLate()
    big = b"x" * 1000  # kept out of the state, in a bodies object
    with Queue(store=store) as q:
        q.declare("q")
        store.armed = True
        job = q.enqueue("q", big)  # its first try lands late, under the second one
        assert [d.payload for d in q.claim("q", 5)] == [big]
        assert q.job(job.id) is not None
        assert q.stats("q").in_flight == 1
