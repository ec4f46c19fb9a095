"""One client's connection to a broker: requests out, answers back, commit notices pushed.

:class:`BrokerLink` is transport only: one DEALER socket to the broker's address, shared by
every caller of the process (the sender of sessions, waiting claims, hellos), each request
numbered so that many are in flight at once. A caller sends itself, holding the socket's lock;
one reader thread waits for answers and hands each to its caller. Whoever holds the lock also
takes every answer that has arrived: libzmq signals arrivals on a descriptor that any use of
the socket may reset, so a send never leaves an answer unread. Deciding which broker to talk
to, and what to do when it is gone, is :mod:`objq_broker.broker.routing`'s job. Every failure
of the link itself becomes one of three errors: :class:`~objq_broker.errors.BrokerUnreachable`
(gone, paused, not a broker of this namespace: look for another),
:class:`~objq_broker.errors.WriterFenced` (it was replaced: look for its successor) and
:class:`~objq_broker.errors.AccessDenied` (wrong or missing token, or one side secured and the
other not: no other broker will do better, so it is said at once, never waited out).

libzmq drops a peer whose handshake fails without a word to the application; the link watches
its socket's events and turns a refused handshake into that one clear error.

Links do not survive ``fork()``: libzmq's context and threads stay with the parent. The
committer that holds a link makes a new one in a forked child (see
:mod:`objq_broker.broker.elected`), on a context of the child's own (:func:`context`).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import cast

import zmq
from zmq.utils.monitor import parse_monitor_message

from objq_broker.broker import wire
from objq_broker.broker.keys import curve_keys
from objq_broker.broker.server import (
    HEARTBEAT_MS,
    HEARTBEAT_TIMEOUT_MS,
    WATCH_LEASE_SECONDS,
    ZMQ_EVENTS,
    ZMQ_NOBLOCK,
    ZMQ_POLLIN,
    ZMQ_RCVMORE,
)
from objq_broker.errors import (
    AccessDenied,
    BrokerUnreachable,
    ObjqError,
    RequestTooLarge,
    WriterFenced,
)
from objq_broker.model.ops import Outcomes, Session

log = logging.getLogger("objq_broker.broker")

#: How long a hello may take before the broker counts as unreachable.
HELLO_TIMEOUT_SECONDS = 2.0
#: How much longer than its wait a waiting claim's answer may take.
CLAIM_GRACE_SECONDS = 5.0

_contexts: dict[int, zmq.Context[zmq.Socket[bytes]]] = {}
_context_lock = threading.Lock()


def context() -> zmq.Context[zmq.Socket[bytes]]:
    """This process's libzmq context (a forked child makes its own: its parent's entry is
    left alone, since closing a context inherited across ``fork()`` is unsafe)."""
    with _context_lock:
        pid = os.getpid()
        if pid not in _contexts:
            _contexts[pid] = zmq.Context()
        return _contexts[pid]


_TOKEN_HINT = "set the same OBJQ_BROKER_TOKEN (broker_token=) on the broker and its clients"


class _Call:
    """One request in flight: its caller waits on ``done`` (acquired until answered)."""

    __slots__ = ("answer", "done", "error")

    def __init__(self) -> None:
        self.done = threading.Lock()
        self.done.acquire()
        self.answer: tuple[bytes, bytes] | None = None
        self.error: ObjqError | None = None


class BrokerLink:
    """A connection to the broker at ``address``.

    ``token``: the shared token, if the broker requires one (the link is CURVE then).
    ``key``: the broker's public key as its record gives it (None: a broker without a token).
    ``recorded``: whether the address comes from the namespace's broker record, which says
    whether the broker has a token; a broker named by address is judged by its handshake.
    """

    def __init__(
        self,
        address: str,
        *,
        token: str | None = None,
        key: str | None = None,
        recorded: bool = True,
    ) -> None:
        self.address = address
        self._recorded = recorded
        self.max_request_bytes = wire.MAX_REQUEST_BYTES  # until the broker's hello says
        self._check_keys(token, key)
        self._token = token
        self._calls: dict[bytes, _Call] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # the calls waiting for answers
        self._socket_lock = threading.Lock()  # every use of the socket, by any thread
        self._stop_r, self._stop_w = os.pipe()
        self._closed = False
        self._denied: ObjqError | None = None
        self._gone: BrokerUnreachable | None = None  # the connection closed, none since
        self._watcher: Callable[[], None] | None = None
        self._watch_due = 0.0
        ctx = context()
        self._socket: zmq.Socket[bytes] = ctx.socket(zmq.DEALER)
        sock = self._socket
        sock.setsockopt(zmq.LINGER, 0)
        # Picked here and never shown: the broker binds this process's client ids to it.
        sock.setsockopt(zmq.ROUTING_ID, os.urandom(16))
        sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_MS)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
        if token:
            keys = curve_keys(token)
            sock.setsockopt(zmq.CURVE_SERVERKEY, keys.broker_public)
            sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.client_public)
            sock.setsockopt(zmq.CURVE_SECRETKEY, keys.client_secret)
        monitor_at = f"inproc://objq-link-{id(self)}-{os.urandom(4).hex()}"
        sock.monitor(monitor_at, zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | _FAILED)
        self._monitor: zmq.Socket[bytes] = ctx.socket(zmq.PAIR)
        # No bound on unread events: libzmq's I/O thread, every link's, waits while the
        # queue of a link's events is full (see _close_monitored).
        self._monitor.setsockopt(zmq.RCVHWM, 0)
        self._monitor.connect(monitor_at)
        host, _, port = address.rpartition(":")
        try:
            if ":" in host.strip("[]"):
                sock.setsockopt(zmq.IPV6, 1)
            sock.connect(f"tcp://{host}:{port}")
            self._thread = threading.Thread(
                target=self._serve, name=f"objq-link {address}", daemon=True
            )
            self._thread.start()
        except BaseException:
            _close_monitored(sock, self._monitor)
            os.close(self._stop_r)
            os.close(self._stop_w)
            raise

    def __repr__(self) -> str:
        return f"BrokerLink({self.address!r})"

    def _check_keys(self, token: str | None, key: str | None) -> None:
        """Refuse at once what no handshake could pass: the record tells whether the broker
        has a token, and its key tells whether it is ours."""
        if key is not None and not token:
            raise AccessDenied(
                f"broker {self.address}: the broker is secured and this process has no token "
                f"(missing or wrong token): {_TOKEN_HINT}"
            )
        if key is not None and token and curve_keys(token).broker_public.decode() != key:
            raise AccessDenied(
                f"broker {self.address}: missing or wrong token (this process's token does "
                f"not give the broker's key): {_TOKEN_HINT}"
            )

    # --- the calls ----------------------------------------------------------------------------

    def apply(self, session: Session, timeout: float) -> Outcomes:
        """Send ``session``; its outcomes once the broker has committed it."""
        body = wire.encode_request(session)
        _, answer = self._call(wire.APPLY, body, timeout)
        return wire.decode_response(answer, session.ops)

    def claim(self, session: Session, wait_seconds: float, timeout: float) -> Outcomes | None:
        """Send ``session`` (one claim) to wait at the broker up to ``wait_seconds`` for jobs;
        its outcome once it took some, was refused, or the wait is over."""
        body = wire.encode_claim(session, wait_seconds)
        _, answer = self._call(wire.CLAIM, body, timeout + CLAIM_GRACE_SECONDS)
        return wire.decode_response(answer, session.ops)

    def hello(self, timeout: float = HELLO_TIMEOUT_SECONDS) -> wire.Hello:
        """Who answers at this address."""
        body = wire.encode(wire.ClientHello(protocol=1))
        _, answer = self._call(wire.HELLO, body, timeout)
        hello = wire.decode_hello(answer)
        self.max_request_bytes = hello.max_request_bytes
        return hello

    def watch(self, notice: Callable[[], None]) -> None:
        """Call ``notice`` (on this link's thread) after each of the broker's commits that
        made jobs claimable, until :meth:`close`."""
        self._watcher = notice
        self._renew_watch()

    def close(self) -> None:
        with self._socket_lock:
            if self._closed:
                return
            self._closed = True
            os.write(self._stop_w, b"!")
        if threading.current_thread() is not self._thread:
            self._thread.join(2.0)

    def _call(self, kind: bytes, body: bytes, timeout: float) -> tuple[bytes, bytes]:
        if len(body) > self.max_request_bytes:
            raise RequestTooLarge(
                f"broker {self.address}: a request of {len(body):,} bytes is over the "
                f"{self.max_request_bytes:,} bytes the broker takes; send fewer or smaller "
                "jobs at once"
            )
        if self._denied is not None:
            raise self._denied
        if self._closed:
            raise BrokerUnreachable(f"broker {self.address}: the link is closed")
        call = _Call()
        rid = wire.request_id(next(self._ids))
        # A refused handshake, or a closed connection, fails every call registered before it.
        with self._lock:
            if self._denied is not None:
                raise self._denied
            if self._gone is not None:
                raise self._gone
            self._calls[rid] = call
        try:
            self._send(wire.frame(kind, rid, body))
        except BrokerUnreachable:
            with self._lock:
                self._calls.pop(rid, None)
            raise
        if not call.done.acquire(timeout=timeout):
            with self._lock:
                self._calls.pop(rid, None)
            if self._denied is not None:
                raise self._denied
            raise BrokerUnreachable(
                f"broker {self.address}: no answer within {timeout:g} s; "
                "the operations may or may not have been applied"
            )
        if call.error is not None:
            raise call.error
        assert call.answer is not None
        return call.answer

    def _send(self, message: bytes) -> None:
        with self._socket_lock:
            if self._closed:
                raise BrokerUnreachable(f"broker {self.address}: the link is closed")
            try:
                self._socket.send(message, ZMQ_NOBLOCK)
            except zmq.Again:  # libzmq's queue for the broker is full: it reads nothing
                raise BrokerUnreachable(
                    f"broker {self.address}: it takes no more requests (its queue is full)"
                ) from None
            finally:
                self._take_answers()

    def _renew_watch(self) -> None:
        self._watch_due = time.monotonic() + WATCH_LEASE_SECONDS / 3
        with contextlib.suppress(BrokerUnreachable):  # renewed again in a while
            self._send(wire.frame(wire.WATCH, wire.request_id(0), b""))

    # --- the reader thread --------------------------------------------------------------------

    def _serve(self) -> None:
        poller = zmq.Poller()
        # The socket's descriptor, not the socket: another thread may be using the socket.
        poller.register(self._socket.getsockopt(zmq.FD), zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        poller.register(self._stop_r, zmq.POLLIN)
        try:
            while True:  # until close(), seen under the socket's lock
                timeout = 1000
                if self._watcher is not None:
                    due = int((self._watch_due - time.monotonic()) * 1000)
                    timeout = max(min(timeout, due), 0)
                ready = dict(poller.poll(timeout))
                if self._monitor in ready:
                    self._link_event()
                with self._socket_lock:
                    if self._closed:
                        break
                    self._take_answers()
                if self._watcher is not None and time.monotonic() >= self._watch_due:
                    self._renew_watch()
        except Exception:
            log.exception("broker link %s failed", self.address)
        finally:
            self._fail_all(BrokerUnreachable(f"broker {self.address}: the link is closed"))
            with self._socket_lock:
                self._closed = True
                _close_monitored(self._socket, self._monitor)
            os.close(self._stop_r)
            os.close(self._stop_w)

    def _take_answers(self) -> None:
        """Hand out every answer that has arrived (holding the socket's lock)."""
        socket = self._socket
        while cast(int, socket.getsockopt(ZMQ_EVENTS)) & ZMQ_POLLIN:
            message = socket.recv(ZMQ_NOBLOCK)
            while socket.getsockopt(ZMQ_RCVMORE):  # not objq's: a broker sends one part
                socket.recv(ZMQ_NOBLOCK)
                message = b""
            try:
                kind, rid, body = wire.parse(message)
            except ObjqError:
                log.warning("broker %s: unreadable answer ignored", self.address)
                continue
            if kind == wire.NOTICE:
                watcher = self._watcher
                if watcher is not None:
                    watcher()
                continue
            with self._lock:
                call = self._calls.pop(rid, None)
            if call is None:  # its caller gave up waiting
                continue
            if kind == wire.REFUSED:
                call.error = self._refusal(body)
            else:
                call.answer = (kind, body)
            call.done.release()

    def _refusal(self, body: bytes) -> ObjqError:
        error = wire.decode_refused(body)
        if isinstance(error, WriterFenced | AccessDenied | BrokerUnreachable):
            return type(error)(f"broker {self.address}: {error}")
        return error

    def _link_event(self) -> None:
        event = parse_monitor_message(self._monitor.recv_multipart())
        code = event["event"]
        if code == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self._denied = self._gone = None
            return
        if code == zmq.EVENT_DISCONNECTED:
            # The broker's connection closed: its process stopped (a broker that closed
            # resigned first), or the network dropped it. The calls on their way get no answer:
            # they fail now, and their sessions find the route again at once, instead of each
            # waiting its whole patience. libzmq connects again; a handshake clears this.
            gone = BrokerUnreachable(f"broker {self.address}: the connection closed")
            with self._lock:
                self._gone = gone
            self._fail_all(gone)
            return
        denied = self._denial(code, event["value"])
        if denied is None:
            return
        log.warning("%s", denied)
        with self._lock:
            self._denied = denied
        self._fail_all(denied)

    def _denial(self, code: int, value: int) -> AccessDenied | None:
        """What a failed handshake says (None: the peer is no broker at all; it stays
        unreachable, and may be taken over)."""
        if code == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            return AccessDenied(
                f"broker {self.address} refused this process: missing or wrong token; {_TOKEN_HINT}"
            )
        if code == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and value == _MECHANISM_MISMATCH:
            ours = "has a token and the broker has none" if self._token else "has no token"
            return AccessDenied(
                f"broker {self.address} refused this process (missing or wrong token): this "
                f"process {ours}; {_TOKEN_HINT}"
            )
        if code == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL and (self._token or not self._recorded):
            # A greeting the peer would not take: with a token, one it could not decrypt (a
            # record's key was checked before connecting); without one, often a secured broker
            # that hung up before saying why. Only a broker named by address, whose security
            # no record tells, is judged so; a recorded one without a key is no broker at all.
            return AccessDenied(
                f"broker {self.address}: handshake failed: missing or wrong token, or not an "
                f"objq broker; {_TOKEN_HINT}"
            )
        return None

    def _fail_all(self, error: ObjqError) -> None:
        with self._lock:
            calls, self._calls = self._calls, {}
        for call in calls.values():
            call.error = error
            call.done.release()


def _close_monitored(socket: zmq.Socket[bytes], monitor: zmq.Socket[bytes]) -> None:
    """Close ``socket`` and the ``monitor`` that reads its events, its monitor stopped first.
    libzmq sends a socket's events from its I/O thread, one for every process's links, and
    waits while nobody can take them: a connection that drops as its socket closes (the
    broker stopping at that moment) sends its event after the reader is gone, and the I/O
    thread then waits for good, so that no link of the process is answered again."""
    socket.disable_monitor()
    socket.close(0)
    monitor.close(0)


_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)
_MECHANISM_MISMATCH = zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH
