"""A dedicated broker (``objq broker``, a real process) committing for clients over libzmq.

Clients are ``Queue(url, broker=address)``: every operation goes to the broker and behaves as
in direct mode, errors included; the broker alone writes the state.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from objq_broker import ConfigurationError, LeaseLost, Queue
from objq_broker.engine.snapshot import Snapshot
from objq_broker.errors import AccessDenied, StorageUnavailable
from objq_broker.storage import open_store
from tests.support.processes import Children


def start_broker(
    children: Children, url: str, *, token: str | None = None, listen: str = "127.0.0.1:0"
) -> tuple[subprocess.Popen[bytes], str]:
    """An ``objq broker`` process serving ``url``; returns it and the address it bound."""
    process, said = broker_process(children, url, token=token, listen=listen)
    return process, said["address"]


def broker_process(
    children: Children,
    url: str,
    *,
    token: str | None = None,
    listen: str = "127.0.0.1:0",
    extra: tuple[str, ...] = (),
) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """An ``objq broker`` process serving ``url`` (with ``extra`` options); returns it and
    the event it announced itself with."""
    env = {k: v for k, v in os.environ.items() if k != "OBJQ_BROKER_TOKEN"}
    if token is not None:
        env["OBJQ_BROKER_TOKEN"] = token
    command = [sys.executable, "-m", "objq_broker.cli", "broker", "--url", url, "--listen", listen]
    process = children.adopt(
        subprocess.Popen(
            [*command, *extra, "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
    )
    assert process.stdout is not None
    line = process.stdout.readline()  # the broker says where it serves once it does
    if not line:
        assert process.stderr is not None
        raise AssertionError(f"objq broker did not start: {process.stderr.read().decode()}")
    said: dict[str, Any] = json.loads(line)
    return process, said


@pytest.fixture
def url(tmp_path: Path) -> str:
    return (tmp_path / "store").as_uri()


@pytest.fixture
def broker(children: Children, url: str) -> Iterator[str]:
    process, address = start_broker(children, url)
    yield address
    children.stop(process)


def test_operations_through_the_broker_behave_as_in_direct_mode(url: str, broker: str) -> None:
    with Queue(url, broker=broker) as producer, Queue(url, broker=broker) as worker:
        producer.declare("q", max_attempts=2)
        big, small = b"x" * 1000, b"y"
        jobs = producer.enqueue_many("q", [big, small], priority=1)
        again = producer.enqueue("q", b"z", key="once")
        assert producer.enqueue("q", b"other", key="once").id == again.id
        assert producer.stats("q").ready == 3

        first = worker.claim("q", 3)
        assert [d.payload for d in first] == [b"z", big, small]  # priority 0 before 1
        worker.ack(first[0])
        assert worker.nack(first[1], error="boom", retry=False) == "dead"
        worker.release([first[2]])
        with pytest.raises(LeaseLost):
            worker.ack(first[1])  # dead-lettered: the stale token is refused, as directly

        [dead] = producer.dead_letters("q")
        assert (dead.id, dead.error, dead.payload) == (jobs[0].id, "boom", big)
        with pytest.raises(ConfigurationError, match="max_attempts: expected int"):
            producer.configure("q", max_attempts=2.5)  # checked before it is sent

    # The broker wrote the state: any process reads the same thing from storage.
    snapshot = Snapshot.read(open_store(url))
    stats = snapshot.stats("q")
    assert (stats.ready, stats.in_flight, stats.dead) == (1, 0, 1)


def test_many_threads_of_two_clients_lose_and_double_nothing(url: str, broker: str) -> None:
    per_thread, threads = 50, 8
    with Queue(url, broker=broker) as a, Queue(url, broker=broker) as b:
        a.declare("q")

        def produce(client: Queue, n: int) -> None:
            for i in range(per_thread):
                client.enqueue("q", f"{n}-{i}".encode())

        producers = [
            threading.Thread(target=produce, args=(a if n % 2 else b, n)) for n in range(threads)
        ]
        for thread in producers:
            thread.start()
        for thread in producers:
            thread.join()
        seen: list[bytes] = []
        while found := b.claim("q", 64):
            seen += [d.payload for d in found]
            for delivery in found:
                a.ack(delivery, wait=False)
        a.flush()
        assert sorted(seen) == sorted(
            f"{n}-{i}".encode() for n in range(threads) for i in range(per_thread)
        )
        assert a.stats("q").ready == a.stats("q").in_flight == 0
        # Coalesced: fewer requests than operations.
        assert a.metrics().batches < a.metrics().ops


def test_a_token_is_required_when_the_broker_has_one(children: Children, url: str) -> None:
    _, address = start_broker(children, url, token="s3cret")
    for given in (None, "wrong"):
        env = {"OBJQ_BROKER_TOKEN": given} if given else {}
        with (
            _env(env),
            Queue(url, broker=address) as q,
            pytest.raises(AccessDenied, match="missing or wrong token"),
        ):
            q.declare("q")
    with _env({"OBJQ_BROKER_TOKEN": "s3cret"}), Queue(url, broker=address) as q:
        assert q.declare("q") is True


def test_beyond_loopback_the_broker_refuses_to_start_without_a_token(url: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "objq_broker.cli", "broker", "--url", url, "--listen", "0.0.0.0:0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "OBJQ_BROKER_TOKEN"},
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "a shared token is needed" in done.stderr


def test_an_unreachable_broker_fails_the_call_instead_of_hanging(url: str) -> None:
    with (
        Queue(url, broker="127.0.0.1:1", commit_deadline_seconds=3) as q,
        pytest.raises(StorageUnavailable, match=r"127\.0\.0\.1:1"),
    ):
        q.declare("q")


def test_a_stopped_broker_commits_what_it_was_given(children: Children, url: str) -> None:
    process, address = start_broker(children, url)
    with Queue(url, broker=address) as q:
        q.declare("q")
        for i in range(20):
            q.enqueue("q", str(i).encode())
    assert children.stop(process)  # SIGTERM: it exits on its own
    assert process.returncode == 0
    assert Snapshot.read(open_store(url)).stats("q").ready == 20


class _env:
    """Set environment variables for a block (the client reads its token when built)."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = values
        self.saved = dict(os.environ)

    def __enter__(self) -> None:
        os.environ.pop("OBJQ_BROKER_TOKEN", None)
        os.environ.update(self.values)

    def __exit__(self, *exc: object) -> None:
        os.environ.clear()
        os.environ.update(self.saved)


def test_the_broker_serves_its_metrics(children: Children, url: str) -> None:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    # Given a dedicated broker with metrics, and a client that commits through it
    process, event = broker_process(children, url, extra=("--metrics-listen", "127.0.0.1:0"))
    with Queue(url, broker=event["address"]) as client:
        client.declare("q")
        for n in range(5):
            client.enqueue("q", bytes([n]))
    # When its endpoint is scraped
    with urllib.request.urlopen(event["metrics"], timeout=10) as response:
        families = {f.name: f for f in text_string_to_metric_families(response.read().decode())}
    children.stop(process)
    # Then the commits it made for the client are there, with their storage requests
    [count] = [
        s.value
        for s in families["objq_engine_commit_duration_seconds"].samples
        if s.name.endswith("_count")
    ]
    assert count >= 6  # the election's, the declare's and the five enqueues'
    writes = {s.labels["kind"]: s.value for s in families["objq_storage_requests"].samples}
    assert writes["write"] >= 6
    assert {s.labels["queue"] for s in families["objq_queue_jobs"].samples} == {"q"}
