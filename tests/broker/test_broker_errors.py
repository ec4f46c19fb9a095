"""What goes wrong between a client and its broker gives one clear error or a fallback, never
a hang: a wrong or missing token, a token on one side only, and a broker record that points at
a dead address or at something else listening there."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from objq_broker import Queue
from objq_broker.broker.elected import ElectedCommitter
from objq_broker.engine.commit import Engine
from objq_broker.engine.snapshot import Snapshot
from objq_broker.errors import AccessDenied
from objq_broker.model.ops import TakeBroker
from objq_broker.model.records import BrokerRecord
from objq_broker.storage import MemoryStore, ObjectStore


def role(queue: Queue) -> str:
    committer = queue.committer
    assert isinstance(committer, ElectedCommitter)
    return committer.role


def stale_record(store: ObjectStore, address: str) -> None:
    """A broker record left behind by a broker that is gone."""
    engine = Engine(store)
    engine.call(TakeBroker(BrokerRecord("gone", address, 0, 0.0), None))
    engine.close()


@pytest.fixture
def foreign_port() -> Iterator[int]:
    """A port where something that is not a broker accepts connections and answers junk."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    stop = threading.Event()

    def answer() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            conn.close()

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    server.close()


@pytest.mark.parametrize("where", ["dead", "foreign"])
def test_a_stale_record_is_taken_over_after_the_takeover_time(
    where: str, foreign_port: int
) -> None:
    store = MemoryStore()
    stale_record(store, "127.0.0.1:1" if where == "dead" else f"127.0.0.1:{foreign_port}")
    started = time.monotonic()
    with Queue(store=store, broker="auto", broker_takeover_seconds=1) as q:
        q.enqueue("q", b"x")
        took = time.monotonic() - started
        assert role(q) == "leader"
        assert 1.0 <= took < 5.0, took
        assert q.stats("q").ready == 1


def test_a_client_with_no_broker_to_reach_commits_directly() -> None:
    store = MemoryStore()
    stale_record(store, "127.0.0.1:1")
    with Queue(store=store, broker="client", broker_takeover_seconds=0.5) as q:
        q.enqueue("q", b"x")
        assert role(q) == "direct"
    with Queue(store=store) as direct:
        assert direct.stats("q").ready == 1


@pytest.mark.parametrize("given", [None, "wrong"])
def test_a_wrong_or_missing_token_is_one_clear_error(
    given: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OBJQ_BROKER_TOKEN", raising=False)
    store = MemoryStore()
    with Queue(store=store, broker="auto", broker_token="s3cret") as leader:
        leader.declare("q")
        assert role(leader) == "leader"
        options: dict[str, Any] = {} if given is None else {"broker_token": given}
        started = time.monotonic()
        with (
            Queue(store=store, broker="client", **options) as client,
            pytest.raises(AccessDenied, match="missing or wrong token"),
        ):
            client.enqueue("q", b"x")
        assert time.monotonic() - started < 5
        with Queue(store=store, broker="client", broker_token="s3cret") as client:
            client.enqueue("q", b"x")
            assert role(client).startswith("follower")
        assert leader.stats("q").ready == 1


@pytest.mark.parametrize("side", ["broker", "client"])
def test_a_token_on_one_side_only_is_one_clear_error_at_once_and_never_a_takeover(
    side: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OBJQ_BROKER_TOKEN", raising=False)
    store = MemoryStore()
    leader_token: dict[str, Any] = {"broker_token": "s3cret"} if side == "broker" else {}
    client_token: dict[str, Any] = {"broker_token": "s3cret"} if side == "client" else {}
    with Queue(store=store, broker="auto", **leader_token) as leader:
        leader.declare("q")
        record = leader.committer.record  # type: ignore[attr-defined]
        started = time.monotonic()
        with (
            Queue(store=store, broker="auto", **client_token) as client,
            pytest.raises(AccessDenied, match="missing or wrong token"),
        ):
            client.enqueue("q", b"x")
        assert time.monotonic() - started < 2, "said at once, not after the takeover time"
        assert leader.committer.record == record, "the broker was not taken over"  # type: ignore[attr-defined]
        assert leader.stats("q").ready == 0


def test_a_broker_named_by_address_refuses_a_wrong_token_at_the_handshake(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OBJQ_BROKER_TOKEN", raising=False)
    store = MemoryStore()
    with Queue(store=store, broker="auto", broker_token="s3cret") as leader:
        leader.declare("q")
        address = leader.committer.record.address  # type: ignore[attr-defined]
        started = time.monotonic()
        for token in ("wrong", None):
            options: dict[str, Any] = {} if token is None else {"broker_token": token}
            with (
                Queue(store=store, broker=address, **options) as client,
                pytest.raises(AccessDenied, match="missing or wrong token"),
            ):
                client.enqueue("q", b"x")
        assert time.monotonic() - started < 4
        with Queue(store=store, broker=address, broker_token="s3cret") as client:
            client.enqueue("q", b"secured")
        assert leader.stats("q").ready == 1


def test_a_broker_on_another_hosts_loopback_is_never_taken_over_from_here(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryStore()
    engine = Engine(store)
    elsewhere = BrokerRecord("far", "127.0.0.1:1", 0, 0.0, host="another-host/4026531840")
    engine.call(TakeBroker(elsewhere, None))
    engine.close()
    started = time.monotonic()
    with (
        caplog.at_level("WARNING", logger="objq_broker.broker"),
        Queue(store=store, broker="auto", broker_takeover_seconds=0.5) as q,
    ):
        for n in range(20):
            q.enqueue("q", f"{n}".encode())
            time.sleep(0.05)  # past the takeover time, and past a record re-read
        assert role(q) == "direct"
        assert q.stats("q").ready == 20
    assert time.monotonic() - started < 5
    record = Snapshot.read(store).broker
    assert record is not None and record.id == "far", "the broker was not taken over"
    said = [r.getMessage() for r in caplog.records if "only its own host" in r.getMessage()]
    assert len(said) == 1 and "broker_advertise" in said[0]
