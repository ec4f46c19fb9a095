"""Serving the dashboard: uvicorn in a background thread, on a socket bound here first.

Binding before uvicorn starts makes an address that cannot be listened on an ``OSError`` at
the call (uvicorn would log it and exit its thread), and lets port 0 pick a free port whose
number :attr:`DashboardServer.url` then tells.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass

import uvicorn
from starlette.applications import Starlette

#: Seconds ``start()`` waits for uvicorn to accept connections.
START_TIMEOUT_SECONDS = 15.0
#: Seconds ``stop()`` waits for requests in progress and the serving thread.
STOP_TIMEOUT_SECONDS = 10.0
#: Connections waiting to be accepted.
BACKLOG = 128


@dataclass
class DashboardServer:
    """A running dashboard.

    >>> from objq_broker.dashboard.app import create_app
    >>> from objq_broker.storage import MemoryStore
    >>> server = DashboardServer.start(create_app(MemoryStore("doc-server")), "127.0.0.1", 0)
    >>> server.url.startswith("http://127.0.0.1:")
    True
    >>> server.stop()
    """

    server: uvicorn.Server
    thread: threading.Thread
    sock: socket.socket

    @classmethod
    def start(cls, app: Starlette, host: str, port: int) -> DashboardServer:
        """Listen on ``host:port`` (port 0: one the system picks) and serve ``app`` in the
        background. Raises ``OSError`` when the address cannot be listened on."""
        sock = _bind(host, port)
        config = uvicorn.Config(
            app,
            log_config=None,  # the process's own logging, not uvicorn's handlers
            # Its start-up lines would say again what the caller's one line says; its
            # warnings and errors still show.
            log_level="warning",
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=int(STOP_TIMEOUT_SECONDS / 2),
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, name="objq-dashboard", daemon=True
        )
        thread.start()
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                sock.close()
                raise RuntimeError(f"the dashboard did not start on {host}:{port}")
            time.sleep(0.01)
        return cls(server, thread, sock)

    @property
    def url(self) -> str:
        """Where the dashboard is, with the port actually listened on."""
        host, port = self.sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}/"

    def stop(self) -> None:
        """Finish the requests in progress, close the socket, run the app's shutdown."""
        self.server.should_exit = True
        self.thread.join(STOP_TIMEOUT_SECONDS)
        self.sock.close()


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
        sock.set_inheritable(True)
    except OSError:
        sock.close()
        raise
    return sock
