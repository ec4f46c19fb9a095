"""The broker's service: one process runs the commit loop for a namespace and takes the
operations of every other process over gRPC, so they stop racing each other's writes.

Three methods under ``/objq.Broker/``:

* ``Apply``: a request is one client's :class:`~objq_broker.model.ops.Session` (a numbered
  batch of operations, :mod:`objq_broker.broker.wire`). The broker submits it to its engine, so
  it shares a commit with every other client's, and answers once it is durable (or refused)
  with one outcome per operation. A broker that a newer one has fenced answers
  ``FAILED_PRECONDITION``: the client looks up the new one and sends the same session there.
* ``Hello``: which broker this is (its id, namespace and epoch), so a client never mistakes
  another process on a reused port for its broker.
* ``Claim``: a session holding one claim that may wait: the broker commits it, and while it
  finds nothing parks it (:mod:`objq_broker.broker.parking`): the commit that readies a job in
  its queues applies it too, up to the wait the request gives. Nobody polls, and one job
  answers one claimer.
* ``Watch``: a stream with one small message after each commit that made jobs claimable, for
  claimers that wait on their own (an event loop's claim-ahead).

A shared token (metadata ``objq-token``) is required for any address beyond loopback; it is
compared in constant time and never logged. TLS is on when a certificate and key are given.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from pathlib import Path
from typing import ParamSpec, TypeVar

import grpc

from objq_broker.broker import wire
from objq_broker.broker.parking import ClaimPark
from objq_broker.engine.batch import NOT_READIED, ReadyMark
from objq_broker.engine.commit import Engine
from objq_broker.errors import ConfigurationError, ObjqError, WriterFenced
from objq_broker.model.ops import Outcomes, Session

log = logging.getLogger("objq_broker.broker")
P = ParamSpec("P")
T = TypeVar("T")

#: The service and its methods.
SERVICE = "objq.Broker"
APPLY_METHOD = f"/{SERVICE}/Apply"
HELLO_METHOD = f"/{SERVICE}/Hello"
WATCH_METHOD = f"/{SERVICE}/Watch"
CLAIM_METHOD = f"/{SERVICE}/Claim"
#: Metadata key that carries the shared token.
TOKEN_METADATA = "objq-token"
#: Threads answering calls: each waits for its batch's commit, or holds one watch stream.
DEFAULT_WORKER_THREADS = 256
#: A watch stream says something at least this often, so both ends notice a dead peer.
WATCH_KEEPALIVE_SECONDS = 10.0
#: Largest request or response accepted (a batch of large payloads).
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),  # a port someone else holds is refused, never shared
]


def is_loopback(address: str) -> bool:
    """Whether ``host:port`` listens on loopback only (no token needed there)."""
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def require_token(listen: str, token: str | None) -> None:
    """Refuse to serve beyond loopback without a shared token."""
    if not token and not is_loopback(listen):
        raise ConfigurationError(
            f"broker_listen {listen!r} is beyond loopback: a shared token is needed "
            "(broker_token= or $OBJQ_BROKER_TOKEN), since anyone who can read the bucket can "
            "read the broker's address"
        )


class BrokerServer:
    """Serves ``committer`` (the broker's own engine) to clients on ``listen``.

    ``hello``: who this broker is. ``tls``: paths of a PEM certificate and its key.

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
        tls: tuple[str, str] | None = None,
        worker_threads: int = DEFAULT_WORKER_THREADS,
    ) -> None:
        require_token(listen, token)
        self.committer = committer
        self.listen = listen
        self.hello = hello or wire.Hello("", "", None)
        self._token = token.encode() if token else None
        self._commits = 0
        self._readied_seen: ReadyMark = NOT_READIED
        self._changed = threading.Condition()
        self._stopping = False
        committer.on_commit(self._committed)
        #: Claims waiting for jobs, this process's own included.
        self.park = ClaimPark(committer, max_parked=max(worker_threads // 2, 1))
        self._threads = DaemonThreads(worker_threads, name="objq-broker")
        # grpc's stubs ask for a ThreadPoolExecutor; gRPC itself only calls submit().
        self._server = grpc.server(self._threads, options=GRPC_OPTIONS)  # type: ignore[arg-type]
        handler = grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "Apply": grpc.unary_unary_rpc_method_handler(self._apply),
                "Hello": grpc.unary_unary_rpc_method_handler(self._hello),
                "Watch": grpc.unary_stream_rpc_method_handler(self._watch),
                "Claim": grpc.unary_unary_rpc_method_handler(self._claim),
            },
        )
        self._server.add_generic_rpc_handlers((handler,))
        try:
            if tls is None:
                self.port = self._server.add_insecure_port(listen)
            else:
                self.port = self._server.add_secure_port(listen, _server_credentials(*tls))
        except RuntimeError as exc:
            raise ConfigurationError(f"objq broker: cannot listen on {listen!r}: {exc}") from exc

    @property
    def address(self) -> str:
        """The address clients reach (the listened host with the port actually bound)."""
        return f"{self.listen.rsplit(':', 1)[0]}:{self.port}"

    def start(self) -> None:
        self._server.start()
        log.info("objq broker serving %s on %s", self.committer, self.address)

    def stop(self, grace: float | None = 5.0, *, close_committer: bool = True) -> None:
        """Stop taking calls, let those in progress finish (up to ``grace``), end the watch
        streams, then (``close_committer``) commit what is pending and close the engine."""
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        self.park.close()
        self._server.stop(grace).wait()
        self._threads.shutdown(wait=False)
        if close_committer:
            self.committer.close()

    # --- the methods -----------------------------------------------------------------------

    def _apply(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        session = self._decoded(wire.decode_request, request, context)
        return self._answer(lambda: self.committer.submit(session).result(), session, context)

    def _claim(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        asked = self._decoded(wire.decode_claim, request, context)
        return self._answer(
            lambda: self.park.claim(asked.session, asked.wait_seconds), asked.session, context
        )

    def _decoded(
        self, decode: Callable[[bytes], T], request: bytes, context: grpc.ServicerContext
    ) -> T:
        """``request`` decoded, once the caller is authorized; the call aborted otherwise."""
        self._authorize(context)
        try:
            return decode(request)
        except ConfigurationError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise  # abort() raises; this line is for the type checker

    def _answer(
        self, commit: Callable[[], Outcomes], session: Session, context: grpc.ServicerContext
    ) -> bytes:
        """The encoded outcomes of ``commit`` (of ``session``), or the call aborted with why."""
        try:
            outcomes = commit()
        except WriterFenced as exc:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"objq broker fenced: {exc}")
        except ObjqError as exc:  # the whole batch failed (storage, closed): each op says so
            outcomes = [(False, exc)] * len(session.ops)
        except Exception as exc:  # a bug: the client sees it as an error, the log keeps it
            log.exception("session failed unexpectedly")
            error = ObjqError(f"broker error: {type(exc).__name__}: {exc}")
            outcomes = [(False, error)] * len(session.ops)
        return wire.encode_outcomes(outcomes)

    def _hello(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self._authorize(context)
        return wire.encode_hello(self.hello)

    def _watch(self, request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        self._authorize(context)
        seen = self._commits
        while context.is_active():
            with self._changed:
                if self._commits == seen and not self._stopping:
                    self._changed.wait(WATCH_KEEPALIVE_SECONDS)  # a commit, a stop or a beat
                if self._stopping:
                    return
                seen = self._commits
            yield b"."

    def _committed(self) -> None:
        # Only a commit that made a job claimable wakes the waiting claimers: after an ack or
        # a claim that found nothing, each of them would look and find nothing (and wake the
        # others' claims again with their own commits).
        readied = self.committer.readied
        with self._changed:
            if readied == self._readied_seen:
                return
            self._readied_seen = readied
            self._commits += 1
            self._changed.notify_all()

    def _authorize(self, context: grpc.ServicerContext) -> None:
        if self._token is None:
            return
        given = dict(context.invocation_metadata()).get(TOKEN_METADATA)
        presented = given.encode() if isinstance(given, str) else (given or b"")
        if not hmac.compare_digest(presented, self._token):
            context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "objq broker: missing or wrong token (set the same OBJQ_BROKER_TOKEN on the "
                "broker and its clients)",
            )


class DaemonThreads(Executor):
    """The threads that answer calls: up to ``max_threads``, started as needed, reused, and
    daemon threads, so that serving never keeps the process from exiting.

    A ``ThreadPoolExecutor``'s threads are joined when the interpreter exits, and a Watch call
    lasts as long as its client stays connected. A process that became the broker and then
    exits without closing its queue (a script or web process sending Celery tasks never closes
    kombu's connections) would wait for its clients forever; the executor, shut down at exit,
    also refuses every new call, which ends gRPC's serving thread, so nobody is answered either.
    With these threads it exits at once, like a killed broker: the next process takes over.
    """

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
        """Let each thread end after the calls already taken (``wait`` and ``cancel_futures``
        are not supported: gRPC ends its calls itself before this is called)."""
        with self._lock:
            self._shut = True
            for _ in range(self._started):
                self._calls.put(None)

    def _work(self) -> None:
        while (call := self._calls.get()) is not None:
            call()
            self._idle.release()


def _server_credentials(cert: str, key: str) -> grpc.ServerCredentials:
    try:
        pair = (Path(key).read_bytes(), Path(cert).read_bytes())
    except OSError as exc:
        raise ConfigurationError(f"objq broker: cannot read TLS certificate or key: {exc}") from exc
    return grpc.ssl_server_credentials([pair])
