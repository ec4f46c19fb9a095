"""A commit's small archive object rides in its state and is stored just after it: the calls
that finished no job are answered one write sooner, the acks only once their record is in the
archive, and no record is lost if the writer dies between the two writes."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from objq_broker import Queue, ops
from objq_broker.engine import STATE_KEY, Engine
from objq_broker.engine.archive import iter_archive
from objq_broker.engine.archiving import IN_STATE_MAX_BYTES
from objq_broker.errors import StorageUnavailable
from objq_broker.model.records import StateDoc, decode_state
from objq_broker.storage import MemoryStore


def _state(store: MemoryStore) -> StateDoc:
    return decode_state(store.get(STATE_KEY), "test")


def _claimed(engine: Engine, payload: bytes = b"a") -> ops.Delivery:
    engine.submit(ops.enqueue("q", [payload])).result()
    jobs = engine.submit(ops.claim(["q"], 1, owner="w")).result()
    [delivery] = ops.deliveries(jobs)
    return delivery


class HeldArchive(MemoryStore):
    """Archive writes wait until :attr:`release` is set; :attr:`holding` tells one waits."""

    def __init__(self) -> None:
        super().__init__()
        self.holding = threading.Event()
        self.release = threading.Event()

    def write(self, key: str, data: bytes, **condition: Any) -> str:
        if key.startswith("archive/"):
            self.holding.set()
            assert self.release.wait(10)
        return super().write(key, data, **condition)


def test_an_enqueue_sharing_a_commit_with_an_ack_is_answered_before_the_archive_is_stored() -> None:
    store = HeldArchive()
    engine = Engine(store, linger_seconds=0.3)  # both calls below ride one commit
    try:
        delivery = _claimed(engine)
        acked = engine.submit(ops.ack(delivery))
        enqueued = engine.submit(ops.enqueue("q", [b"b"]))
        assert store.holding.wait(10)
        # The state holding the ack and its record has landed; the archive object waits.
        assert enqueued.result(timeout=10)
        assert not acked.done()
        [pending] = _state(store).archiving
        assert [r.job.id for r in pending.records] == [delivery.id]
        assert list(iter_archive(store)) == []
        store.release.set()
        acked.result(timeout=10)
        # An ack returns once its record is in the archive.
        assert [r.job.id for r in iter_archive(store)] == [delivery.id]
        engine.submit(ops.enqueue("q", [b"c"])).result()
        assert _state(store).archiving == []  # the next commit dropped what was stored
    finally:
        store.release.set()
        engine.close()


class FailingArchive(MemoryStore):
    """Archive writes fail while :attr:`failing` is set (a writer that died between its
    state write and its archive write leaves the same)."""

    def __init__(self) -> None:
        super().__init__()
        self.failing = True

    def write(self, key: str, data: bytes, **condition: Any) -> str:
        if key.startswith("archive/") and self.failing:
            raise StorageUnavailable(f"{key}: injected failure")
        return super().write(key, data, **condition)


def test_records_left_in_the_state_are_archived_by_whoever_commits_next(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = FailingArchive()
    with Queue(store=store) as first:
        first.enqueue("q", b"a")
        [delivery] = first.claim("q")
        with caplog.at_level(logging.WARNING, logger="objq_broker.engine"):
            first.ack(delivery)  # landed: the record is safe in the state
        assert "the next commit stores it" in caplog.text
        assert list(iter_archive(store)) == []
        assert [len(p.records) for p in _state(store).archiving] == [1]
    store.failing = False
    with Queue(store=store) as later:  # another process, which never saw that commit
        later.enqueue("q", b"b")
    [record] = iter_archive(store)
    assert (record.outcome, record.job.id, record.job.payload) == ("done", delivery.id, b"a")
    assert _state(store).archiving == []


def test_a_large_archive_object_is_stored_ahead_of_the_state() -> None:
    order: list[str] = []

    class Recording(MemoryStore):
        def write(self, key: str, data: bytes, **condition: Any) -> str:
            order.append(key.split("/", maxsplit=1)[0])
            return super().write(key, data, **condition)

    store = Recording()
    with Queue(store=store) as queue:
        queue.enqueue("q", b"x" * (IN_STATE_MAX_BYTES + 1))
        [delivery] = queue.claim("q")
        order.clear()
        queue.ack(delivery)
        assert _state(store).archiving == []
    assert order[:2] == ["archive", STATE_KEY]
    [record] = iter_archive(store)
    assert record.job.payload == b"x" * (IN_STATE_MAX_BYTES + 1)
