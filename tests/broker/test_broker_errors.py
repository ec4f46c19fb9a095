"""What goes wrong between a client and its broker gives one clear error or a fallback, never
a hang: a wrong or missing token, TLS on one side only, and a broker record that points at a
dead address or at something else listening there."""

from __future__ import annotations

import datetime
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from objq_broker import Queue
from objq_broker.engine.commit import Engine
from objq_broker.errors import AccessDenied
from objq_broker.model.ops import TakeBroker
from objq_broker.model.records import BrokerRecord
from objq_broker.storage import MemoryStore, ObjectStore

pytest.importorskip("grpc")

from objq_broker.broker.elected import ElectedCommitter


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


def _self_signed(folder: Path) -> tuple[str, str]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "broker.pem", folder / "broker.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return str(cert_path), str(key_path)


def test_tls_works_with_the_right_authority_and_fails_clearly_without(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    store = MemoryStore()
    tls: dict[str, Any] = {"broker_tls_cert": cert, "broker_tls_key": key}
    with Queue(store=store, broker="auto", broker_listen="localhost:0", **tls) as leader:
        leader.declare("q")
        assert role(leader) == "leader"
        with Queue(store=store, broker="client", broker_tls_ca=cert) as client:
            client.enqueue("q", b"over TLS")
            assert role(client).startswith("follower")
        with (
            Queue(store=store, broker="client", commit_deadline_seconds=5) as untrusting,
            pytest.raises(AccessDenied, match="TLS"),
        ):
            untrusting.enqueue("q", b"x")
        assert leader.stats("q").ready == 1
