"""The wire protocol as published: a client of another version gets one clear refusal, and
the JSON Schema in the docs is the one the broker decodes with."""

from __future__ import annotations

import json
from pathlib import Path

import zmq

from objq_broker.broker import wire
from objq_broker.broker.server import BrokerServer
from objq_broker.engine import Engine
from objq_broker.errors import ConfigurationError
from objq_broker.storage import MemoryStore


def test_a_client_of_another_protocol_version_is_refused_with_both_versions_named() -> None:
    server = BrokerServer(Engine(MemoryStore()), listen="127.0.0.1:0")
    server.start()
    context = zmq.Context()
    peer = context.socket(zmq.DEALER)
    try:
        peer.connect(f"tcp://127.0.0.1:{server.port}")
        peer.send_multipart([b"objq/2", wire.HELLO, wire.request_id(7), b"{}"])
        assert peer.poll(5000), "the broker must answer, never drop the client silently"
        protocol, kind, rid, body = peer.recv_multipart()
        assert (protocol, kind, rid) == (wire.PROTOCOL, wire.REFUSED, wire.request_id(7))
        error = wire.decode_refused(body)
        assert isinstance(error, ConfigurationError)
        assert "objq/1" in str(error) and "objq/2" in str(error)
    finally:
        peer.close(0)
        context.term()
        server.stop()


def test_the_published_protocol_schema_is_the_one_the_broker_decodes_with() -> None:
    published = Path(__file__).parents[2] / "docs" / "protocol-schema.json"
    assert json.loads(published.read_text()) == json.loads(json.dumps(wire.schema())), (
        "docs/protocol-schema.json is stale: write wire.schema() to it again"
    )


def test_malformed_requests_are_refused_and_the_broker_serves_on() -> None:
    server = BrokerServer(Engine(MemoryStore()), listen="127.0.0.1:0")
    server.start()
    context = zmq.Context()
    peer = context.socket(zmq.DEALER)
    try:
        peer.connect(f"tcp://127.0.0.1:{server.port}")
        bad = [
            [wire.PROTOCOL, wire.APPLY, wire.request_id(1), b"not json"],
            [wire.PROTOCOL, wire.APPLY, wire.request_id(2), b'{"client": "c", "seq": -1}'],
            [wire.PROTOCOL, wire.CLAIM, wire.request_id(3), b"[1,2,3"],
            [wire.PROTOCOL, b"delete-everything", wire.request_id(4), b"{}"],
        ]
        for frames in bad:
            peer.send_multipart(frames)
        for frames in bad:
            assert peer.poll(5000)
            _, kind, rid, body = peer.recv_multipart()
            assert kind == wire.REFUSED and rid == frames[2]
            assert isinstance(wire.decode_refused(body), ConfigurationError)
        peer.send_multipart([b"two", b"frames"])  # not even the protocol: answered, not fatal
        assert peer.poll(5000)
        assert peer.recv_multipart()[1] == wire.REFUSED
        # Then a good request is still answered
        peer.send_multipart([wire.PROTOCOL, wire.HELLO, wire.request_id(9), b'{"protocol":1}'])
        assert peer.poll(5000)
        assert peer.recv_multipart()[1] == wire.HELLO
    finally:
        peer.close(0)
        context.term()
        server.stop()
