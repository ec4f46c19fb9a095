"""The broker's service: one process runs the commit loop for a namespace and takes the
operations of every other process over libzmq, so they stop racing each other's writes.

One ROUTER socket takes every client's connection, and one I/O thread serves it: it reads a
request (:mod:`objq_broker.broker.wire`), hands its session to the engine and goes on; the
commit's completion puts the answer in an outbox and wakes the thread, which sends it. No
thread waits on a commit, and an idle connection costs a socket and nothing else.

* ``hello``: which broker this is (id, namespace, epoch, protocol, largest request), so a client
  never mistakes another process on a reused port for its broker.
* ``apply``: a :class:`~objq_broker.model.ops.Session` shares a commit with everyone else's and
  is answered once durable (or refused) with one outcome per operation. A broker that a newer
  one fenced refuses it with :class:`~objq_broker.errors.WriterFenced`: the client looks up
  the new one and sends the same session there.
* ``claim``: one claim that may wait: while it finds nothing it is parked
  (:mod:`objq_broker.broker.parking`) and the commit that readies a job applies it too.
  Parked claims wait on threads of their own, at most ``max_parked`` at once; beyond that a
  claim is answered at once and its client waits for a notice instead.
* ``watch``: the connection gets a ``notice`` after each commit that made jobs claimable, for
  the next :data:`WATCH_LEASE_SECONDS` (the client renews it).

A client id is bound to the connection that first used it (by its routing id, which the client
picks at random and never shows): a session under another connection's id is refused, so
nobody can replay or fence another client's work. With a token the socket is a CURVE server
(:mod:`objq_broker.broker.keys`) and admits only clients whose key derives from it: libzmq
drops anyone else before a frame of theirs is read. A request over ``max_request_bytes`` is
dropped by libzmq unread, so no peer can make the broker hold more than that per message.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, ParamSpec, TypeVar

import zmq
import zmq.utils.z85

from objq_broker.broker import wire
from objq_broker.broker.keys import curve_keys, require_token
from objq_broker.broker.parking import ClaimPark
from objq_broker.engine.batch import NOT_READIED, ReadyMark
from objq_broker.engine.commit import Engine
from objq_broker.errors import (
    AccessDenied,
    BrokerUnreachable,
    ConfigurationError,
    ObjqError,
    WriterFenced,
)
from objq_broker.model.ops import Outcomes, Session

log = logging.getLogger("objq_broker.broker")
P = ParamSpec("P")
T = TypeVar("T")
#: What a request decodes to (a session, or a claim that holds one).
R = TypeVar("R")

#: Parked claims at once (each waits on a thread of its own).
DEFAULT_MAX_PARKED = 128
#: A watch lasts this long unless renewed; clients renew it three times as often.
WATCH_LEASE_SECONDS = 30.0
#: Most client ids a broker remembers the connection of (the oldest unused are forgotten).
MAX_BOUND_CLIENTS = 100_000
#: libzmq's heartbeats: a peer silent this long is dropped, so a dead client's pipe goes.
HEARTBEAT_MS, HEARTBEAT_TIMEOUT_MS = 5_000, 30_000
#: The ZAP endpoint libzmq asks who may connect to a CURVE server (fixed by libzmq).
ZAP_ENDPOINT = "inproc://zeromq.zap.01"
ZAP_DOMAIN = b"objq"
#: libzmq's flags as plain ints: pyzmq's enums cost more than the calls they go with.
ZMQ_NOBLOCK, ZMQ_SNDMORE, ZMQ_EVENTS, ZMQ_RCVMORE, ZMQ_POLLIN = (
    int(zmq.NOBLOCK),
    int(zmq.SNDMORE),
    int(zmq.EVENTS),
    int(zmq.RCVMORE),
    int(zmq.POLLIN),
)
_NOTICE = wire.frame(wire.NOTICE, wire.request_id(0), b"")


def endpoint(address: str) -> tuple[str, bool]:
    """The libzmq endpoint of ``host:port`` (port 0: any free port), and whether it is IPv6."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    if host in ("", "0.0.0.0", "*"):
        return f"tcp://*:{port if port != '0' else '*'}", False
    try:
        info = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ConfigurationError(f"objq broker: cannot resolve {host!r}: {exc}") from exc
    family, *_, sockaddr = info[0]
    ip = str(sockaddr[0])
    ipv6 = family == socket.AF_INET6
    shown = f"[{ip}]" if ipv6 else ip
    return f"tcp://{shown}:{port if port != '0' else '*'}", ipv6


class BrokerServer:
    """Serves ``committer`` (the broker's own engine) to clients on ``listen``.

    ``hello``: who this broker is. ``token``: the shared token (the link is CURVE then).

    >>> from objq_broker.engine import Engine
    >>> from objq_broker.storage import MemoryStore
    >>> server = BrokerServer(Engine(MemoryStore()), listen="127.0.0.1:0")
    >>> server.start(); server.port > 0
    True
    >>> server.stop()
    """

    def __init__(
        self,
        committer: Engine,
        *,
        listen: str,
        token: str | None = None,
        hello: wire.Hello | None = None,
        max_parked: int = DEFAULT_MAX_PARKED,
        max_request_bytes: int = wire.MAX_REQUEST_BYTES,
    ) -> None:
        require_token(listen, token)
        self.committer = committer
        self.listen = listen
        self.max_request_bytes = max_request_bytes
        self.hello = hello or wire.Hello("", "", None)
        self.public_key = curve_keys(token).broker_public.decode() if token else None
        self._readied_seen: ReadyMark = NOT_READIED
        self._stopping = False
        self._outbox: collections.deque[tuple[bytes, bytes]] = collections.deque()
        self._wake_r, self._wake_w = os.pipe()
        self._woken = False  # a byte is in the pipe and the thread has not read it yet
        self._lock = threading.Lock()
        self._bound: collections.OrderedDict[str, bytes] = collections.OrderedDict()
        self._watchers: dict[bytes, float] = {}  # routing id -> when its watch lapses
        self._notify = False  # a commit readied jobs: the thread tells the watchers
        committer.on_commit(self._committed)
        #: Claims waiting for jobs, this process's own included.
        self.park = ClaimPark(committer, max_parked=max_parked)
        self._claimers = DaemonThreads(max_parked, name="objq-broker-claim")
        self._context = zmq.Context()
        self._router, self._zap = self._bind(listen, token)
        self._thread: threading.Thread | None = None

    def _bind(self, listen: str, token: str | None) -> tuple[zmq.Socket[bytes], Any]:
        router: zmq.Socket[bytes] = self._context.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.setsockopt(zmq.MAXMSGSIZE, self.max_request_bytes)
        router.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a client that reconnects keeps its replies
        router.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_MS)
        router.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
        zap = None
        if token:
            keys = curve_keys(token)
            zap = self._context.socket(zmq.REP)
            zap.bind(ZAP_ENDPOINT)
            self._client_key = zmq.utils.z85.decode(keys.client_public)
            router.setsockopt(zmq.CURVE_SERVER, 1)
            router.setsockopt(zmq.CURVE_SECRETKEY, keys.broker_secret)
            router.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN)
        where, ipv6 = endpoint(listen)
        router.setsockopt(zmq.IPV6, int(ipv6))
        try:
            router.bind(where)
        except zmq.ZMQError as exc:
            router.close(0)
            if zap is not None:
                zap.close(0)
            self._context.term()
            raise ConfigurationError(f"objq broker: cannot listen on {listen!r}: {exc}") from exc
        bound = router.getsockopt(zmq.LAST_ENDPOINT)
        self.port = int(bytes(bound).decode().rsplit(":", 1)[1])
        return router, zap

    @property
    def address(self) -> str:
        """The address clients reach (the listened host with the port actually bound)."""
        return f"{self.listen.rsplit(':', 1)[0]}:{self.port}"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._serve, name="objq-broker-io", daemon=True)
        self._thread.start()
        log.info("objq broker serving %s on %s", self.committer, self.address)

    def stop(self, grace: float | None = 5.0, *, close_committer: bool = True) -> None:
        """Stop taking requests; answer those in progress (up to ``grace``), then
        (``close_committer``) commit what is pending and close the engine."""
        end = time.monotonic() + (grace or 0.0)
        self.park.close()
        self._claimers.shutdown(wait=False)
        while len(self.park) and time.monotonic() < end:  # their last tries, committed
            time.sleep(0.01)
        if close_committer:
            self.committer.close(max(end - time.monotonic(), 0.1))
        while self._outbox and time.monotonic() < end:  # answers of the last commits
            time.sleep(0.01)
        self._stopping = True
        self._wake()
        if self._thread is not None:
            self._thread.join(max(end - time.monotonic(), 1.0))

    # --- the I/O thread ---------------------------------------------------------------------

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        if self._zap is not None:
            poller.register(self._zap, zmq.POLLIN)
        try:
            while not self._stopping:
                ready = dict(poller.poll(1000))
                if self._zap is not None and self._zap in ready:
                    self._admit()
                if self._router in ready:
                    self._take_requests()
                if self._wake_r in ready:
                    with self._lock:
                        os.read(self._wake_r, 4096)
                        self._woken = False
                self._send_outbox()
                if self._notify:
                    self._notify = False
                    self._tell_watchers()
        except Exception:  # a bug: the clients see the broker gone and take over
            log.exception("objq broker: the I/O thread failed")
        finally:
            self._close_sockets()

    def _take_requests(self) -> None:
        router = self._router
        for _ in range(1000):  # then answer what is ready before reading on
            if not router.getsockopt(ZMQ_EVENTS) & ZMQ_POLLIN:  # type: ignore[operator]
                return
            # Plain receives, not recv_multipart (ten times dearer in pyzmq): a routing id,
            # then one message; more parts than that are not objq's, and are dropped.
            peer = router.recv(ZMQ_NOBLOCK)
            message = router.recv(ZMQ_NOBLOCK) if router.getsockopt(ZMQ_RCVMORE) else b""
            while router.getsockopt(ZMQ_RCVMORE):
                router.recv(ZMQ_NOBLOCK)
                message = b""
            try:
                self._request(peer, message)
            except Exception:  # one bad request never stops the others
                log.exception("objq broker: a request failed unexpectedly")

    def _request(self, peer: bytes, message: bytes) -> None:
        try:
            kind, rid, body = wire.parse(message)
        except ConfigurationError as exc:
            return self._refuse(peer, wire.request_id(0), exc)
        if kind == wire.APPLY:
            self._apply(peer, rid, body)
        elif kind == wire.CLAIM:
            self._claim(peer, rid, body)
        elif kind == wire.HELLO:
            self._reply(peer, wire.ANSWER_HELLO, rid, wire.encode_hello(self.hello))
        elif kind == wire.WATCH:
            self._watchers[peer] = time.monotonic() + WATCH_LEASE_SECONDS
            self._reply(peer, wire.DONE, rid, b"[]")
        else:
            self._refuse(peer, rid, ConfigurationError(f"broker: unknown request {kind!r}"))
        return None

    def _apply(self, peer: bytes, rid: bytes, body: bytes) -> None:
        session = self._accepted(peer, rid, body, wire.decode_request, lambda s: s)
        if session is not None:
            self._commit(peer, rid, session)

    def _accepted(
        self,
        peer: bytes,
        rid: bytes,
        body: bytes,
        decode: Callable[[bytes], R],
        session_of: Callable[[R], Session],
    ) -> R | None:
        """``body`` decoded, if it decodes and its session is this connection's; else None,
        the request refused."""
        try:
            request = decode(body)
        except ConfigurationError as exc:
            self._refuse(peer, rid, exc)
            return None
        return request if self._owned(peer, rid, session_of(request)) else None

    def _commit(self, peer: bytes, rid: bytes, session: Session) -> None:
        try:
            future = self.committer.submit(session)
        except ObjqError as exc:  # closed meanwhile: the client sends it to the next broker
            return self._refuse(peer, rid, BrokerUnreachable(f"broker stopping: {exc}"))
        future.add_done_callback(lambda done: self._answered(peer, rid, session, done.result))
        return None

    def _claim(self, peer: bytes, rid: bytes, body: bytes) -> None:
        asked = self._accepted(peer, rid, body, wire.decode_claim, lambda a: a.session)
        if asked is None:
            return None
        if len(self.park) >= self.park.max_parked:  # no room to wait: answered at once
            return self._commit(peer, rid, asked.session)
        try:
            self._claimers.submit(
                self._answered,
                peer,
                rid,
                asked.session,
                lambda: self.park.claim(asked.session, asked.wait_seconds),
            )
        except RuntimeError:  # stopping: no more waiting, but the engine may still commit it
            self._commit(peer, rid, asked.session)
        return None

    def _owned(self, peer: bytes, rid: bytes, session: Session) -> bool:
        """Whether ``session``'s client id is this connection's (it is, once it first used
        it); refused if not."""
        owner = session.client.split(".", 1)[0]
        bound = self._bound.get(owner)
        if bound is None:
            self._bound[owner] = peer
            if len(self._bound) > MAX_BOUND_CLIENTS:
                self._bound.popitem(last=False)
        elif bound != peer:
            self._refuse(
                peer,
                rid,
                AccessDenied(
                    f"broker: client id {owner!r} belongs to another connection; each "
                    "process uses its own"
                ),
            )
            return False
        else:
            self._bound.move_to_end(owner)
        return True

    def _answered(
        self, peer: bytes, rid: bytes, session: Session, outcome: Callable[[], Outcomes]
    ) -> None:
        """Queue the answer to ``session`` (on the committing thread, or a claim's)."""
        try:
            outcomes = outcome()
        except WriterFenced as exc:
            return self._refuse(peer, rid, WriterFenced(f"objq broker fenced: {exc}"))
        except ObjqError as exc:  # the whole batch failed (storage, closed): each op says so
            outcomes = [(False, exc)] * len(session.ops)
        except Exception as exc:  # a bug: the client sees it as an error, the log keeps it
            log.exception("session failed unexpectedly")
            error = ObjqError(f"broker error: {type(exc).__name__}: {exc}")
            outcomes = [(False, error)] * len(session.ops)
        self._reply(peer, wire.DONE, rid, wire.encode_outcomes(outcomes))
        return None

    def _refuse(self, peer: bytes, rid: bytes, error: ObjqError) -> None:
        self._reply(peer, wire.REFUSED, rid, wire.encode(wire.outcome_of(error=error)))

    def _reply(self, peer: bytes, kind: bytes, rid: bytes, body: bytes) -> None:
        self._outbox.append((peer, wire.frame(kind, rid, body)))
        if threading.current_thread() is not self._thread:
            self._wake()

    def _wake(self) -> None:
        # Under the lock: the I/O thread closes the pipe under it when it ends. One byte at
        # most is ever in the pipe, so the write never blocks.
        with self._lock:
            if self._woken or self._wake_w < 0:
                return
            self._woken = True
            os.write(self._wake_w, b"!")

    def _send_outbox(self) -> None:
        outbox, router = self._outbox, self._router
        while outbox:
            peer, message = outbox.popleft()
            try:
                router.send(peer, ZMQ_SNDMORE | ZMQ_NOBLOCK)
                router.send(message, ZMQ_NOBLOCK)
            except zmq.Again:  # that client reads nothing: its answers are dropped
                log.debug("objq broker: a client's queue is full; answer dropped")

    def _tell_watchers(self) -> None:
        now = time.monotonic()
        for peer, until in list(self._watchers.items()):
            if until < now:
                del self._watchers[peer]
                continue
            with contextlib.suppress(zmq.Again):  # that client reads nothing: no notice either
                self._router.send(peer, ZMQ_SNDMORE | ZMQ_NOBLOCK)
                self._router.send(_NOTICE, ZMQ_NOBLOCK)

    def _committed(self) -> None:
        # Only a commit that made a job claimable wakes the watchers: after an ack or a claim
        # that found nothing, each would look and find nothing (and wake the others again).
        readied = self.committer.readied
        if readied == self._readied_seen:
            return
        self._readied_seen = readied
        self._notify = True
        self._wake()

    def _admit(self) -> None:
        """Answer libzmq's question whether a client may connect: only with the clients' key."""
        request = self._zap.recv_multipart()
        version, rid, _domain, _address, _identity, mechanism, *credentials = request
        ok = mechanism == b"CURVE" and credentials[:1] == [self._client_key]
        status = (b"200", b"OK") if ok else (b"400", b"wrong token")
        self._zap.send_multipart([version, rid, *status, b"", b""])

    def _close_sockets(self) -> None:
        self._router.close(0)
        if self._zap is not None:
            self._zap.close(0)
        self._context.term()
        with self._lock:
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._wake_w = -1


class DaemonThreads(Executor):
    """Threads for parked claims: up to ``max_threads``, started as needed, reused, and
    daemon threads, so that a claim waiting at the broker never keeps the process from
    exiting (a script that became the broker and exits without closing its queue must exit
    at once, like a killed broker: the next process takes over)."""

    def __init__(self, max_threads: int, *, name: str) -> None:
        self.max_threads = max_threads
        self.name = name
        self._calls: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._started = 0
        self._shut = False

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        future: Future[T] = Future()

        def call() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # the caller gets it, as from any executor
                future.set_exception(exc)

        with self._lock:
            if self._shut:
                raise RuntimeError(f"{self.name}: cannot take calls after shutdown")
            self._calls.put(call)
            if not self._idle.acquire(blocking=False) and self._started < self.max_threads:
                self._started += 1
                name = f"{self.name}_{self._started}"
                threading.Thread(target=self._work, name=name, daemon=True).start()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Let each thread end after the calls already taken."""
        with self._lock:
            self._shut = True
            for _ in range(self._started):
                self._calls.put(None)

    def _work(self) -> None:
        while (call := self._calls.get()) is not None:
            call()
            self._idle.release()
