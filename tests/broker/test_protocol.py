"""The wire protocol as published: a client of another version gets one clear refusal, and
the JSON Schema in the docs is the one the broker decodes with."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from objq_broker.broker import wire
from objq_broker.broker.server import BrokerServer
from objq_broker.engine import Engine
from objq_broker.errors import ConfigurationError
from objq_broker.storage import MemoryStore


@pytest.fixture
def peer() -> Iterator[zmq.Socket[bytes]]:
    """A raw DEALER connected to a broker of its own, as a client in any language would be."""
    server = BrokerServer(Engine(MemoryStore()), listen="127.0.0.1:0")
    server.start()
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.connect(f"tcp://127.0.0.1:{server.port}")
    yield socket
    socket.close(0)
    context.term()
    server.stop()


def test_a_client_of_another_protocol_version_is_refused_with_both_versions_named(
    peer: zmq.Socket[bytes],
) -> None:
    peer.send(b"objq/2" + wire.HELLO + wire.request_id(7) + b"{}")
    assert peer.poll(5000), "the broker must answer, never drop the client silently"
    kind, _, body = wire.parse(peer.recv())
    assert kind == wire.REFUSED
    error = wire.decode_refused(body)
    assert isinstance(error, ConfigurationError)
    assert "objq/1" in str(error) and "objq/2" in str(error)


def test_the_published_protocol_schema_is_the_one_the_broker_decodes_with() -> None:
    published = Path(__file__).parents[2] / "docs" / "protocol-schema.json"
    assert json.loads(published.read_text()) == json.loads(json.dumps(wire.schema())), (
        "docs/protocol-schema.json is stale: write wire.schema() to it again"
    )


def test_malformed_requests_are_refused_and_the_broker_serves_on(
    peer: zmq.Socket[bytes],
) -> None:
    bad = [
        (wire.APPLY, wire.request_id(1), b"not json"),
        (wire.APPLY, wire.request_id(2), b'{"client": "c", "seq": -1}'),
        (wire.CLAIM, wire.request_id(3), b"[1,2,3"),
        (b"x", wire.request_id(4), b"{}"),  # no such kind
    ]
    for kind, rid, body in bad:
        peer.send(wire.frame(kind, rid, body))
    for _, sent_rid, _ in bad:
        assert peer.poll(5000)
        kind, rid, body = wire.parse(peer.recv())
        assert kind == wire.REFUSED and rid == sent_rid
        assert isinstance(wire.decode_refused(body), ConfigurationError)
    for junk in ([b"two", b"frames"], [b"short"]):  # not even the protocol: answered
        peer.send_multipart(junk)
        assert peer.poll(5000)
        assert wire.parse(peer.recv())[0] == wire.REFUSED
    # Then a good request is still answered
    peer.send(wire.frame(wire.HELLO, wire.request_id(9), b'{"protocol":1}'))
    assert peer.poll(5000)
    assert wire.parse(peer.recv())[0] == wire.ANSWER_HELLO
