"""Queue expiry and deletion through the commit loop: a removed queue's bindings go with it,
in direct mode and through the elected broker."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from objq_broker import Queue
from objq_broker.engine.bindings import ExchangeRecord, change_exchange, read_exchange
from objq_broker.engine.commit import Engine
from objq_broker.model.ops import Declare, Enqueue, Expire
from objq_broker.model.records import QueueConfig
from objq_broker.model.values import NewJob
from objq_broker.storage import MemoryStore, ObjectStore, open_store
from tests.support.clock import ManualClock
from tests.support.waiting import wait_for


def bind(store: ObjectStore, exchange: str, queue: str, kind: str = "topic") -> None:
    def add(record: ExchangeRecord) -> bool:
        record.bindings.append(("#", "^.*?$", queue))
        return True

    change_exchange(store, exchange, kind, add)


def bound(store: ObjectStore, exchange: str) -> list[str]:
    record, _ = read_exchange(store, exchange)
    return [] if record is None else [b[2] for b in record.bindings]


def test_an_expired_queue_loses_its_bindings_once_the_commit_landed() -> None:
    store, clock = MemoryStore(), ManualClock(1_000.0)
    engine = Engine(store, clock=clock)
    try:
        engine.call(Declare("celeryev.dead", QueueConfig(expires_seconds=2.0)))
        engine.call(Declare("celeryev.live", QueueConfig(expires_seconds=2.0)))
        bind(store, "celeryev", "celeryev.dead")
        bind(store, "celeryev", "celeryev.live")
        bind(store, "other", "celeryev.dead", kind="fanout")

        clock.now += 1.5
        engine.call(Declare("celeryev.live", QueueConfig(expires_seconds=2.0)))  # in use
        clock.now += 1.0
        engine.call(Enqueue([NewJob(id="e1", queue="celeryev.dead", body="event")]))
        engine.flush()

        assert bound(store, "celeryev") == ["celeryev.live"]
        assert bound(store, "other") == []
        assert engine.call(Expire()) == 0
    finally:
        engine.close()


def test_delete_queue_removes_every_binding_to_it() -> None:
    with Queue("memory://lifecycle-delete") as q:
        q.declare("orders")
        q.declare("audit")
        bind(q.store, "amq.topic", "orders")
        bind(q.store, "amq.topic", "audit")
        q.enqueue("orders", b"x")

        assert q.delete_queue("orders") == 1
        q.flush()
        assert bound(q.store, "amq.topic") == ["audit"]
        assert q.queues() == ["audit"]


@pytest.mark.timeout(120)
def test_expiry_through_the_elected_broker(tmp_path: Path) -> None:
    """A queue used by a claimer parked at the broker stays; the other one expires, and its
    binding goes, with the broker as the only writer."""
    url = f"file://{tmp_path}"
    with Queue(url, broker="auto", broker_listen="127.0.0.1:0") as q:
        q.declare("kept", expires_seconds=2.0)
        q.declare("idle", expires_seconds=2.0)
        bind(q.store, "ev", "kept")
        bind(q.store, "ev", "idle")
        started = time.monotonic()
        # One claim that waits 6 s at the broker (three expiries): it is tried again in time.
        assert q.claim("kept", timeout=6) == []
        assert time.monotonic() - started >= 5
        assert q.queues() == ["kept"]
        wait_for(lambda: bound(q.store, "ev") == ["kept"], 10, "the idle queue's binding to go")
    store = open_store(url)
    assert bound(store, "ev") == ["kept"]
