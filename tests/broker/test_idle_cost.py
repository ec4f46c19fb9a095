"""Idle consumers cost no storage requests in broker mode: the broker is the only writer, so it
never polls, and its clients wait on its commit notices. ``objq status`` shows the broker."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from typing import Any

from objq_broker import Queue
from objq_broker.storage import MemoryStore

IDLE_SECONDS = 3.0
CONSUMERS = 6


class CountingStore(MemoryStore):
    """Counts every storage request (a real store bills each of them)."""

    def __init__(self) -> None:
        super().__init__()
        self.requests = 0

    def read(self, key: str) -> Any:
        self.requests += 1
        return super().read(key)

    def write(self, key: str, data: bytes, **condition: Any) -> str:
        self.requests += 1
        return super().write(key, data, **condition)

    def list(self, prefix: str = "") -> list[str]:
        self.requests += 1
        return super().list(prefix)


def idle_requests(broker: str) -> tuple[int, list[bytes]]:
    """Storage requests while ``CONSUMERS`` queues wait for jobs; then one job is enqueued and
    must reach a waiting consumer. Returns the count and what the consumers got."""
    store = CountingStore()
    queues = [Queue(store=store, broker=broker) for _ in range(CONSUMERS)]
    queues[0].declare("q")
    got: list[bytes] = []
    stop = threading.Event()

    def consume(queue: Queue) -> None:
        while not stop.is_set():
            for delivery in queue.claim("q", timeout=0.5):
                got.append(delivery.payload)
                queue.ack(delivery)

    threads = [threading.Thread(target=consume, args=(q,)) for q in queues]
    for thread in threads:
        thread.start()
    time.sleep(1.0)  # everyone has found its route and is waiting
    before = store.requests
    time.sleep(IDLE_SECONDS)
    idle = store.requests - before
    queues[-1].enqueue("q", b"wake")
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    for thread in threads:
        thread.join()
    for queue in queues:
        queue.close()
    return idle, got


def test_idle_consumers_cost_no_requests_in_broker_mode_and_still_wake() -> None:
    idle, got = idle_requests("auto")
    assert idle == 0, f"{idle} storage requests in {IDLE_SECONDS:g} idle seconds"
    assert got == [b"wake"]
    direct, got = idle_requests("off")
    assert direct > 0  # what the broker saves: direct consumers must look at storage
    assert got == [b"wake"]


def test_status_shows_the_broker(tmp_path: Any) -> None:
    url = (tmp_path / "store").as_uri()
    with Queue(url, broker="auto") as queue:
        queue.enqueue("q", b"x")
        done = subprocess.run(
            [sys.executable, "-m", "objq_broker.cli", "status", "--url", url],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
    assert "broker 127.0.0.1:" in done.stdout and "(epoch 1," in done.stdout
    assert "1 client committed" in done.stdout
