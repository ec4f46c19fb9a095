"""Serving ``/metrics`` with prometheus_client's own HTTP server: its WSGI app on wsgiref, in a
daemon thread, one thread per request."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    start_http_server,
)
from prometheus_client.registry import Collector, CollectorRegistry

from objq_broker.metrics.commits import CommitCollector
from objq_broker.metrics.store import StoreCollector
from objq_broker.queue import Queue
from objq_broker.storage import ObjectStore

#: Seconds ``stop()`` waits for the serving thread once the server was told to shut down.
STOP_TIMEOUT_SECONDS = 5.0


def exporter_registry(store: ObjectStore) -> CollectorRegistry:
    """What ``objq exporter`` serves: the store's numbers (:class:`StoreCollector`), and the
    exporter process's own CPU, memory and Python runtime, as any prometheus_client process
    exposes them (a fresh registry: nothing registered elsewhere in the process leaks in)."""
    return _with_process(StoreCollector(store))


def worker_registry(queue: Queue) -> CollectorRegistry:
    """What a long-running objq process (``objq worker --metrics-listen``) serves: its own
    commit, job and storage counters (:class:`CommitCollector`), the store's numbers, and its
    CPU, memory and Python runtime."""
    return _with_process(CommitCollector(queue), StoreCollector(queue.store))


def _with_process(*collectors: Collector) -> CollectorRegistry:
    registry = CollectorRegistry()
    for collector in collectors:
        registry.register(collector)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


@dataclass
class MetricsServer:
    """A running ``/metrics`` endpoint.

    >>> server = MetricsServer.start(CollectorRegistry(), "127.0.0.1", 0)
    >>> server.url.startswith("http://127.0.0.1:")
    True
    >>> server.stop()
    """

    server: WSGIServer
    thread: threading.Thread

    @classmethod
    def start(cls, registry: CollectorRegistry, host: str, port: int) -> MetricsServer:
        """Listen on ``host:port`` (port 0: one the system picks) and serve in the background.
        Raises ``OSError`` when the address cannot be listened on."""
        server, thread = start_http_server(port, addr=host, registry=registry)
        return cls(server, thread)

    @property
    def url(self) -> str:
        """Where the metrics are, with the port actually listened on."""
        host = str(self.server.socket.getsockname()[0])
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{self.server.server_port}/metrics"

    def stop(self) -> None:
        """Stop accepting scrapes and close the socket."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(STOP_TIMEOUT_SECONDS)
