"""A fault-injecting TCP proxy in front of an S3 endpoint: storage that misbehaves on cue.

Clients use the proxy's ``url`` as their ``endpoint_url``. Each HTTP request is read whole and,
unless a fault is drawn for it, passed to the upstream server byte for byte (so SigV4 signatures
stay valid) and its answer relayed back. The faults, drawn per request from a seeded random:

* ``unavailable``: answer ``503 Slow Down`` with an S3 XML error body; nothing is forwarded.
* ``reset``: close the client connection with a TCP RST (``SO_LINGER`` 0); nothing forwarded.
* ``drop_after``: forward the request, let the upstream execute it and answer, then reset the
  client connection without relaying the answer: the write landed, the client cannot know.
* ``blackhole``: take the request and never answer (until the client gives up, or the proxy
  closes).
* ``latency``: drawn on its own, on top of any of the above: wait ``latency_seconds`` before
  acting on the request.

Besides the random faults, ``inject_next(...)`` gives the next requests the faults named, one
each, so a test meets every kind however few requests it makes; and ``pause()`` holds every new
request until ``resume()``: a stall whose end the test chooses, to order events across clients.

::

    with FaultProxy(seaweedfs_endpoint, seed=7) as proxy:
        url = f"s3://{bucket}/objq?endpoint_url={proxy.url}"
        proxy.set_faults(Faults(unavailable=0.1, reset=0.05, drop_after=0.05))
        ...                          # the system under test runs against ``url``
        proxy.faults_off()           # every later request is forwarded untouched
        proxy.counts()               # Counter({'forwarded': 812, 'unavailable': 97, ...})

The proxy's event loop runs in a thread of its own; ``set_faults`` and ``faults_off`` take
effect from the next request, whichever thread calls them. A request ``Expect: 100-continue``
is answered by the proxy itself (the header is not signed, and is not forwarded). Standard
library only.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
import threading
import uuid
from collections import Counter, deque
from dataclasses import dataclass
from types import TracebackType
from typing import Literal
from urllib.parse import urlsplit

Fault = Literal["unavailable", "reset", "drop_after", "blackhole"]
#: The faults in the order a draw maps onto them.
FAULTS: tuple[Fault, ...] = ("unavailable", "reset", "drop_after", "blackhole")
#: Seconds the proxy waits for the upstream to accept a connection.
UPSTREAM_CONNECT_SECONDS = 10.0
#: Seconds ``close()`` waits for the proxy's thread to stop.
CLOSE_TIMEOUT_SECONDS = 10.0
#: Statuses whose answers carry no body whatever their headers say.
BODILESS_STATUSES = frozenset({204, 304})
#: How many injected faults ``FaultProxy.injected()`` remembers (the latest).
INJECTED_LOG_SIZE = 1000
#: Headers the proxy consumes rather than forwards.
_DROPPED_HEADERS = frozenset({b"expect"})


@dataclass(frozen=True)
class Faults:
    """What to inject: the probability of each fault per request (together at most 1), and
    of a delay of ``latency_seconds`` (drawn apart, so it can come with any of them)."""

    unavailable: float = 0.0
    reset: float = 0.0
    drop_after: float = 0.0
    blackhole: float = 0.0
    latency: float = 0.0
    latency_seconds: float = 0.0

    def __post_init__(self) -> None:
        for name in (*FAULTS, "latency"):
            chance = getattr(self, name)
            if not 0.0 <= chance <= 1.0:
                raise ValueError(f"Faults.{name}: expected a probability in [0, 1], found {chance}")
        total = sum(getattr(self, name) for name in FAULTS)
        if total > 1.0 + 1e-9:
            raise ValueError(f"Faults: the faults' probabilities add up to {total:g}, over 1")
        if self.latency_seconds < 0:
            raise ValueError(f"Faults.latency_seconds: expected >= 0, found {self.latency_seconds}")

    def draw(self, rng: random.Random) -> tuple[Fault | None, float]:
        """The fault for one request (None: forward it) and its delay in seconds."""
        roll, late = rng.random(), rng.random()
        delay = self.latency_seconds if late < self.latency else 0.0
        for name in FAULTS:
            chance = getattr(self, name)
            if roll < chance:
                return name, delay
            roll -= chance
        return None, delay


#: No faults at all.
NO_FAULTS = Faults()


class FaultProxy:
    """A proxy on a free port of 127.0.0.1 in front of ``upstream`` (``http://host:port``).

    Thread-safe. Use it as a context manager, or call ``close()``.
    """

    def __init__(self, upstream: str, *, seed: int = 0, faults: Faults = NO_FAULTS) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname or parts.port is None:
            raise ValueError(f"expected an upstream http://host:port, found {upstream!r}")
        self.upstream = (parts.hostname, parts.port)
        self._lock = threading.Lock()
        self._rng = random.Random(seed)
        self._faults = faults
        self._counts: Counter[str] = Counter()
        self._injected: deque[tuple[Fault, str]] = deque(maxlen=INJECTED_LOG_SIZE)
        self._scripted: deque[Fault] = deque()  # faults for the next requests, in order
        self._held = 0  # connections blackholed right now
        self._paused: list[str] = []  # requests waiting for ``resume()``
        self._gate: asyncio.Event | None = None  # set (open) unless paused; the loop's own
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="fault-proxy", daemon=True
        )
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result()
        host, port = self._server.sockets[0].getsockname()[:2]
        self.url = f"http://{host}:{port}"

    # --- control (any thread) ----------------------------------------------------------------

    def set_faults(self, faults: Faults, *, seed: int | None = None) -> None:
        """Inject ``faults`` from the next request on; ``seed`` restarts the random draws."""
        with self._lock:
            self._faults = faults
            if seed is not None:
                self._rng.seed(seed)

    def inject_next(self, *faults: Fault) -> None:
        """Give the next requests these faults, one each in order, before any random draw."""
        unknown = sorted(set(faults) - set(FAULTS))
        if unknown:
            raise ValueError(f"inject_next: unknown faults {unknown}; expected some of {FAULTS}")
        with self._lock:
            self._scripted.extend(faults)

    def faults_off(self) -> None:
        """Forward every request from now on (faults given to ``inject_next`` and not used yet
        are dropped). Connections blackholed already stay so: their clients find out by their
        own timeouts, as they would from a real outage."""
        with self._lock:
            self._scripted.clear()
        self.set_faults(NO_FAULTS)

    @property
    def faults(self) -> Faults:
        return self._faults

    def pause(self) -> None:
        """Hold every request that arrives from now on until ``resume()``."""
        asyncio.run_coroutine_threadsafe(self._set_gate(False), self._loop).result()

    def resume(self) -> None:
        """Let the held requests and any later ones go on."""
        asyncio.run_coroutine_threadsafe(self._set_gate(True), self._loop).result()

    def paused(self) -> list[str]:
        """The requests held by ``pause()`` right now (``"PUT /bucket/objq/state.json"``)."""
        with self._lock:
            return list(self._paused)

    @property
    def held(self) -> int:
        """Connections blackholed right now."""
        with self._lock:
            return self._held

    def counts(self) -> Counter[str]:
        """How many requests were forwarded (``forwarded``), met each fault (by name), or were
        delayed (``latency``), so far."""
        with self._lock:
            return Counter(self._counts)

    def injected(self) -> list[tuple[Fault, str]]:
        """The faults injected so far (the latest ``INJECTED_LOG_SIZE``), oldest first, each
        with its request's method and target (``"PUT /bucket/objq/state.json"``)."""
        with self._lock:
            return list(self._injected)

    def close(self) -> None:
        """Stop listening, drop every connection (held ones too) and stop the thread."""
        if self._loop.is_closed():
            return
        stopping = asyncio.run_coroutine_threadsafe(self._stop(), self._loop)
        stopping.result(CLOSE_TIMEOUT_SECONDS)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(CLOSE_TIMEOUT_SECONDS)
        self._loop.close()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # --- the event loop's side ---------------------------------------------------------------

    async def _start(self) -> asyncio.Server:
        self._gate = asyncio.Event()
        self._gate.set()
        return await asyncio.start_server(self._accept, "127.0.0.1", 0)

    async def _set_gate(self, open_: bool) -> None:
        assert self._gate is not None
        if open_:
            self._gate.set()
        else:
            self._gate.clear()

    async def _pass_gate(self, request: _Message) -> None:
        """Wait while the proxy is paused."""
        gate = self._gate
        assert gate is not None
        if gate.is_set():
            return
        line = _request_line(request)
        with self._lock:
            self._paused.append(line)
        try:
            await gate.wait()
        finally:
            with self._lock:
                self._paused.remove(line)

    async def _stop(self) -> None:
        self._server.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await _Connection(self, reader, writer).serve()
        except asyncio.CancelledError:
            # Only ``close()`` cancels a connection. Ending normally matters: asyncio's stream
            # callback asks the finished task for its exception, and a cancelled one raises.
            pass
        finally:
            self._tasks.discard(task)

    def _draw(self, request: _Message) -> tuple[Fault | None, float]:
        fault: Fault | None
        with self._lock:
            if self._scripted:
                fault, delay = self._scripted.popleft(), 0.0
            else:
                fault, delay = self._faults.draw(self._rng)
            self._counts[fault or "forwarded"] += 1
            if fault is not None:
                self._injected.append((fault, _request_line(request)))
            if delay:
                self._counts["latency"] += 1
            return fault, delay

    def _holding(self, change: int) -> None:
        with self._lock:
            self._held += change


@dataclass
class _Message:
    head: bytes  # start line and headers as forwarded, ending with the blank line
    start: bytes  # the start line alone
    headers: dict[bytes, bytes]  # lower-cased names; the last value of a repeated header

    def header(self, name: bytes) -> bytes:
        return self.headers.get(name, b"").strip().lower()

    @property
    def chunked(self) -> bool:
        return b"chunked" in self.header(b"transfer-encoding")

    @property
    def length(self) -> int | None:
        value = self.header(b"content-length")
        return int(value) if value else None

    @property
    def closes(self) -> bool:
        return self.header(b"connection") == b"close"


class _Connection:
    """One client connection: its requests one after another, over one upstream connection."""

    def __init__(
        self, proxy: FaultProxy, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.proxy = proxy
        self.reader = reader
        self.writer = writer
        self.upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def serve(self) -> None:
        try:
            while await self._one_request():
                pass
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            _reset(self.writer)  # a broken peer or a malformed message: end it abruptly
        finally:
            self.writer.close()
            if self.upstream is not None:
                self.upstream[1].close()

    async def _one_request(self) -> bool:
        """Handle one request; False when the connection is done."""
        request = await _read_head(self.reader, drop=_DROPPED_HEADERS)
        if request is None:
            return False
        await self.proxy._pass_gate(request)
        fault, delay = self.proxy._draw(request)
        if delay:
            await asyncio.sleep(delay)
        if request.header(b"expect") == b"100-continue":
            self.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await self.writer.drain()
        body = await _read_body(self.reader, request)
        if fault == "reset":
            _reset(self.writer)
            return False
        if fault == "blackhole":
            await self._hold()
            return False
        if fault == "unavailable":
            self.writer.write(_slow_down(request))
            await self.writer.drain()
            return not request.closes
        answer, keep_alive = await self._forward(request, body)
        if fault == "drop_after":
            _reset(self.writer)  # the upstream executed it; the client never hears so
            return False
        self.writer.write(answer)
        await self.writer.drain()
        return keep_alive and not request.closes

    async def _forward(self, request: _Message, body: bytes) -> tuple[bytes, bool]:
        """Send ``request`` upstream; returns its whole answer and whether the upstream
        connection may carry another request."""
        if self.upstream is None:
            host, port = self.proxy.upstream
            self.upstream = await asyncio.wait_for(
                asyncio.open_connection(host, port), UPSTREAM_CONNECT_SECONDS
            )
        up_reader, up_writer = self.upstream
        up_writer.write(request.head + body)
        await up_writer.drain()
        response = await _read_head(up_reader)
        if response is None:
            raise ConnectionResetError("the upstream closed the connection before answering")
        method = request.start.split(b" ", 1)[0]
        status = int(response.start.split(b" ", 2)[1])
        if method == b"HEAD" or status in BODILESS_STATUSES or 100 <= status < 200:
            payload = b""
        elif response.chunked or response.length is not None:
            payload = await _read_body(up_reader, response)
        else:  # framed by the end of the connection
            payload = await up_reader.read()
            return response.head + payload, False
        return response.head + payload, not response.closes

    async def _hold(self) -> None:
        """Never answer: wait until the client closes (or the proxy does)."""
        self.proxy._holding(+1)
        try:
            while await self.reader.read(64 * 1024):
                pass
        finally:
            self.proxy._holding(-1)


async def _read_head(
    reader: asyncio.StreamReader, *, drop: frozenset[bytes] = frozenset()
) -> _Message | None:
    """The start line and headers of the next message; None at a clean end of stream.
    Headers named in ``drop`` are left out of the forwarded head (but kept in ``headers``)."""
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise
    start, *lines = raw[:-4].split(b"\r\n")
    headers: dict[bytes, bytes] = {}
    kept = [start]
    for line in lines:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
        if name.strip().lower() not in drop:
            kept.append(line)
    return _Message(b"\r\n".join(kept) + b"\r\n\r\n", start, headers)


async def _read_body(reader: asyncio.StreamReader, message: _Message) -> bytes:
    """The body of ``message`` exactly as framed (chunk sizes and trailers included)."""
    if not message.chunked:
        length = message.length or 0
        return await reader.readexactly(length) if length else b""
    parts: list[bytes] = []
    while True:
        size_line = await reader.readuntil(b"\r\n")
        parts.append(size_line)
        size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
        if size == 0:
            break
        parts.append(await reader.readexactly(size + 2))  # the data and its CRLF
    while True:  # trailers, then the blank line that ends the body
        line = await reader.readuntil(b"\r\n")
        parts.append(line)
        if line == b"\r\n":
            return b"".join(parts)


def _request_line(request: _Message) -> str:
    """``"METHOD target"`` of a request, for the logs a test reads."""
    method, target = request.start.decode("latin-1").split(" ")[:2]
    return f"{method} {target}"


def _slow_down(request: _Message) -> bytes:
    """S3's answer to a client it throttles."""
    target = request.start.split(b" ")[1].split(b"?", 1)[0].decode("latin-1")
    request_id = uuid.uuid4().hex[:16].upper()
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message>"
        f"<Resource>{target}</Resource><RequestId>{request_id}</RequestId></Error>"
    ).encode()
    bodiless = request.start.startswith(b"HEAD ")
    head = (
        "HTTP/1.1 503 Slow Down\r\n"
        "Content-Type: application/xml\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"x-amz-request-id: {request_id}\r\n"
        "Server: fault-proxy\r\n\r\n"
    ).encode()
    return head if bodiless else head + body


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST rather than a FIN: the peer sees 'connection reset by peer'."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
