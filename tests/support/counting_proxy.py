"""A counting HTTP reverse proxy in front of an S3 endpoint: what a store really asks for.

Clients use one of the proxy's URLs as ``endpoint_url``. Every request is passed to the
upstream server as it came (method, target, headers, body) and the answer comes back as it
went (status, headers, body); on the way, the request is counted under the listener it came
through, its verb, the kind of key it names and the status it got. Each listener is a port of
its own, so giving every process its own listener tells whose requests they were.

::

    with CountingProxy(seaweedfs.endpoint) as proxy:
        worker_url = proxy.listen("worker-1")  # http://127.0.0.1:PORT
        ...
        counts = proxy.snapshot()              # Counter of Request(listener, verb, kind, status)

Request signatures stay valid: the ``Host`` header a client signed (the proxy's address) and the
request target are forwarded unchanged, and only hop-by-hop headers, which SigV4 never signs
(``Expect``, ``Connection``, ...), are dropped. Bodies are streamed in both directions, framed
by ``Content-Length`` or relayed chunk by chunk. Standard library only.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import NamedTuple
from urllib.parse import parse_qs, unquote, urlsplit

#: Bytes copied per read while streaming a body.
CHUNK_BYTES = 64 * 1024
#: Seconds the proxy waits on the upstream server for a connection or an answer.
UPSTREAM_TIMEOUT_SECONDS = 60.0
#: Name of the listener ``CountingProxy.url`` belongs to.
DEFAULT_LISTENER = "default"
#: Headers that belong to one connection, never forwarded (RFC 9110 section 7.6.1). ``Expect``
#: is answered by the proxy itself; ``Transfer-Encoding`` is kept, as bodies are relayed framed.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "expect",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "upgrade",
    }
)
#: Statuses whose answers carry no body whatever their headers say.
BODILESS_STATUSES = frozenset({204, 304})


class Request(NamedTuple):
    """What one request is counted as."""

    listener: str
    verb: str  # the HTTP method, or "LIST" for a bucket listing (S3 bills it apart)
    kind: str  # what it names (see ``key_kind``)
    status: int  # the upstream's status; 502 when the upstream could not be reached


def key_kind(method: str, target: str) -> tuple[str, str]:
    """(verb, kind) of a path-style S3 request: a listing is ``LIST`` of ``list <prefix>``;
    an object request names its key without the bucket, with keys deeper than two levels
    folded to their first two (``objq/archive/…``), so one kind covers a family of keys."""
    parts = urlsplit(target)
    key = unquote(parts.path).lstrip("/").partition("/")[2]  # path style: /bucket/key
    query = parse_qs(parts.query, keep_blank_values=True)
    if not key:
        if method == "GET" and ("list-type" in query or not query):
            return "LIST", f"list {query.get('prefix', [''])[0]}"
        return method, f"bucket?{'&'.join(sorted(query))}" if query else "bucket"
    segments = key.split("/")
    return method, key if len(segments) <= 2 else "/".join(segments[:2]) + "/…"


class CountingProxy:
    """Forwards HTTP requests to ``upstream`` (``http://host:port``) and counts them.

    ``classify(method, target)`` gives a request's (verb, kind); the default is ``key_kind``.
    Thread-safe. Use it as a context manager, or call ``close()``.
    """

    def __init__(
        self,
        upstream: str,
        *,
        classify: Callable[[str, str], tuple[str, str]] = key_kind,
    ) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname or parts.port is None:
            raise ValueError(f"expected an upstream http://host:port, found {upstream!r}")
        self.upstream = (parts.hostname, parts.port)
        self.classify = classify
        self._counts: Counter[Request] = Counter()
        self._lock = threading.Lock()
        self._servers: dict[str, _Server] = {}
        self._threads: list[threading.Thread] = []
        self._connections: set[socket.socket] = set()
        self.url = self.listen(DEFAULT_LISTENER)

    def listen(self, listener: str) -> str:
        """Open another listener on a free port of 127.0.0.1; returns its URL."""
        with self._lock:
            if listener in self._servers:
                raise ValueError(f"listener {listener!r} exists already")
            server = _Server(self, listener)
            self._servers[listener] = server
        thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name=f"counting-proxy {listener}",
            daemon=True,
        )
        thread.start()
        self._threads.append(thread)
        host, port = server.server_address[:2]
        return f"http://{host!s}:{port}"

    def snapshot(self) -> Counter[Request]:
        """A copy of the counts so far."""
        with self._lock:
            return Counter(self._counts)

    def count(self, request: Request) -> None:
        with self._lock:
            self._counts[request] += 1

    def track(self, connection: socket.socket, open_: bool) -> None:
        """Remember the client connections that are open (closed at ``close()``)."""
        with self._lock:
            if open_:
                self._connections.add(connection)
            else:
                self._connections.discard(connection)

    def close(self) -> None:
        """Stop every listener and drop the client connections still open."""
        with self._lock:
            servers, self._servers = list(self._servers.values()), {}
            connections, self._connections = list(self._connections), set()
        for server in servers:
            server.shutdown()
            server.server_close()
        for connection in connections:  # wakes handler threads blocked on an idle keep-alive
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join()
        self._threads = []

    def __enter__(self) -> CountingProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, proxy: CountingProxy, listener: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.proxy = proxy
        self.listener = listener


class _Handler(BaseHTTPRequestHandler):
    """One client connection: its requests, one after another, over one upstream connection."""

    protocol_version = "HTTP/1.1"  # keep-alive, as S3 clients expect
    server: _Server
    _upstream: http.client.HTTPConnection | None = None

    def setup(self) -> None:
        super().setup()
        self.server.proxy.track(self.connection, True)

    def finish(self) -> None:
        self.server.proxy.track(self.connection, False)
        if self._upstream is not None:
            self._upstream.close()
        with contextlib.suppress(OSError):  # the client may be gone already
            super().finish()

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: a proxy that logs each request to stderr would drown a benchmark's output."""

    def _forward(self) -> None:
        proxy = self.server.proxy
        verb, kind = proxy.classify(self.command, self.path)
        try:
            response = self._send_upstream()
        except (OSError, http.client.HTTPException) as exc:
            proxy.count(Request(self.server.listener, verb, kind, 502))
            with contextlib.suppress(OSError):  # the client may be what failed
                self._refuse(f"upstream {proxy.upstream[0]}:{proxy.upstream[1]} failed: {exc}")
            self.close_connection = True
            return
        proxy.count(Request(self.server.listener, verb, kind, response.status))
        self._relay(response)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_OPTIONS = do_PATCH = _forward

    def _send_upstream(self) -> http.client.HTTPResponse:
        if self._upstream is None:
            host, port = self.server.proxy.upstream
            self._upstream = http.client.HTTPConnection(
                host, port, timeout=UPSTREAM_TIMEOUT_SECONDS
            )
        upstream = self._upstream
        upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
        for name, value in self.headers.items():
            if name.lower() not in HOP_BY_HOP:
                upstream.putheader(name, value)
        upstream.endheaders()
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self._relay_chunks(upstream)
        else:
            self._copy(int(self.headers.get("Content-Length") or 0), upstream.send)
        try:
            return upstream.getresponse()
        except (OSError, http.client.HTTPException):
            upstream.close()  # a half-used connection is no use to the next request
            raise

    def _copy(self, length: int, send: Callable[[bytes], object]) -> None:
        """Stream ``length`` bytes of the request body to ``send``."""
        while length > 0:
            data = self.rfile.read(min(length, CHUNK_BYTES))
            if not data:
                raise ConnectionError(f"client closed its request body {length} bytes short")
            send(data)
            length -= len(data)

    def _relay_chunks(self, upstream: http.client.HTTPConnection) -> None:
        """Pass a chunked request body through as it comes: sizes, data, trailers."""
        while True:
            size_line = self.rfile.readline(CHUNK_BYTES)
            upstream.send(size_line)
            size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                break
            self._copy(size + 2, upstream.send)  # the data and its CRLF
        while True:  # trailers, then the empty line that ends the body
            line = self.rfile.readline(CHUNK_BYTES)
            upstream.send(line)
            if line in (b"\r\n", b"\n", b""):
                return

    def _relay(self, response: http.client.HTTPResponse) -> None:
        """Send the upstream's answer to the client, its body streamed as it arrives."""
        self.send_response_only(response.status, response.reason)
        framed = response.getheader("Content-Length") is not None
        bodiless = self.command == "HEAD" or response.status in BODILESS_STATUSES
        for name, value in response.getheaders():
            if name.lower() not in HOP_BY_HOP and name.lower() != "transfer-encoding":
                self.send_header(name, value)
        if not framed and not bodiless:
            # http.client undid the upstream's framing (chunked, or end at close): frame anew.
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if bodiless:
            response.read()
        elif framed:
            while data := response.read(CHUNK_BYTES):
                self.wfile.write(data)
        else:
            while data := response.read1(CHUNK_BYTES):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _refuse(self, reason: str) -> None:
        body = reason.encode()
        self.send_response(502)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True
