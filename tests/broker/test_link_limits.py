"""What a peer can make a broker hold: an over-size operation is refused at once and alone,
saying the limit; hundreds of idle followers (connections that watch, claims that wait) leave
a new client answered at once. Real broker, real libzmq peers on 127.0.0.1."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import zmq

from objq_broker import Queue, builders
from objq_broker.broker import wire
from objq_broker.broker.elected import ElectedCommitter
from objq_broker.errors import RequestTooLarge
from objq_broker.model.ops import Session

IDLE_FOLLOWERS = 500
WAITING_CLAIMS = 300


def address_of(queue: Queue) -> str:
    committer = queue.committer
    assert isinstance(committer, ElectedCommitter) and committer.record is not None
    return committer.record.address


def test_an_over_size_operation_is_refused_at_once_and_alone(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/ns"
    with Queue(url, broker="auto") as leader, Queue(url, broker="client") as client:
        leader.declare("q")
        client.enqueue("q", b"joined")
        small_sent: list[str] = []

        def small() -> None:
            for n in range(50):
                client.enqueue("q", f"small {n}".encode())
                small_sent.append(str(n))

        others = threading.Thread(target=small)
        others.start()
        started = time.monotonic()
        with pytest.raises(RequestTooLarge, match=r"over the 67,108,864 bytes the broker takes"):
            client.enqueue("q", b"x" * (70 * 1024 * 1024))
        assert time.monotonic() - started < 10, "said at once, not after the commit deadline"
        others.join()
        assert len(small_sent) == 50
        assert leader.stats("q").ready == 51


def test_hundreds_of_idle_followers_leave_a_new_client_answered_at_once(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/ns"
    with Queue(url, broker="auto") as leader:
        leader.declare("q")
        address = address_of(leader)
        context = zmq.Context()
        peers = []
        try:
            # Given 500 followers' connections, each watching, and 300 claims waiting for jobs
            for n in range(IDLE_FOLLOWERS):
                peer = context.socket(zmq.DEALER)
                peer.setsockopt(zmq.LINGER, 0)
                peer.connect(f"tcp://{address}")
                peer.send(wire.frame(wire.WATCH, wire.request_id(0), b""))
                if n < WAITING_CLAIMS:
                    claim = Session(f"idle{n}", 1, [builders.claim(["q"], 1, owner=f"idle{n}")])
                    body = wire.encode_claim(claim, 30.0)
                    peer.send(wire.frame(wire.CLAIM, wire.request_id(1), body))
                peers.append(peer)
            time.sleep(1.0)  # let the broker take them all

            # When a new client calls
            started = time.monotonic()
            with Queue(url, broker="client") as newcomer:
                newcomer.enqueue("q", b"new")
                took = time.monotonic() - started
            # Then it is answered at once (a generous bound: a blocked broker takes seconds)
            assert took < 2.0, took
            assert leader.stats("q").ready + leader.stats("q").in_flight == 1
        finally:
            for peer in peers:
                peer.close(0)
            context.term()


#: A peer without the token: hundreds of connections that never finish their greeting, and
#: others that pour junk (200 MB each) at the broker's port.
_UNAUTHENTICATED = """
import socket, sys, time
host, port = sys.argv[1], int(sys.argv[2])
idle = [socket.create_connection((host, port)) for _ in range(270)]
junk = b"\\xff" + b"\\x00" * 8 + b"\\x7f" + b"x" * (1 << 20)  # a greeting's start, then junk
for _ in range(4):
    pour = socket.create_connection((host, port))
    try:
        for _ in range(200):
            pour.sendall(junk)
    except OSError:
        pass  # dropped by the broker: what it should do
    pour.close()
print("poured", flush=True)
time.sleep(60)
"""


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def test_unauthenticated_peers_hold_no_thread_or_memory_of_a_secured_broker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OBJQ_BROKER_TOKEN", raising=False)
    url = f"file://{tmp_path}/ns"
    with Queue(url, broker="auto", broker_token="s3cret") as leader:
        leader.declare("q")
        host, port = address_of(leader).rsplit(":", 1)
        threads, memory = threading.active_count(), rss_bytes()
        attacker = subprocess.Popen(
            [sys.executable, "-c", _UNAUTHENTICATED, host, port],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        try:
            assert attacker.stdout is not None
            assert attacker.stdout.readline() == b"poured\n"
            # Then a client with the token is answered at once, while the idle ones stay open
            started = time.monotonic()
            with Queue(url, broker="client", broker_token="s3cret") as client:
                client.enqueue("q", b"served")
                took = time.monotonic() - started
            assert took < 2.0, took
            assert threading.active_count() - threads <= 2  # the client's own link, at most
            assert rss_bytes() - memory < 64 * 1024 * 1024, "the broker kept what it was sent"
            assert leader.stats("q").ready == 1
        finally:
            attacker.kill()
            attacker.communicate()
