"""The broker: one process runs the commit loop for a namespace and takes the operations of
every other process over gRPC, so they stop racing each other's compare-and-set writes.

One unary method, ``/objq.Broker/Apply``: a request is a batch of operations from one client
(:mod:`objq_broker.broker.wire`); the broker submits them all to its engine (so they share a
commit with every other client's operations), waits until each is durable or refused, and
answers with one outcome per operation. A shared token (gRPC metadata ``objq-token``) is
required for any address beyond loopback; it is compared in constant time and never logged.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import grpc

from objq_broker.broker import wire
from objq_broker.engine.commit import Engine
from objq_broker.engine.port import Committer
from objq_broker.errors import ConfigurationError, ObjqError
from objq_broker.storage.base import ObjectStore

log = logging.getLogger("objq_broker.broker")

#: The service and method a client calls.
SERVICE = "objq.Broker"
APPLY_METHOD = f"/{SERVICE}/Apply"
#: Metadata key that carries the shared token.
TOKEN_METADATA = "objq-token"
#: Threads answering requests; each waits for its batch's commit, most of the time.
DEFAULT_WORKER_THREADS = 64
#: Largest request or response accepted (a batch of large payloads).
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
]


def serve(store: ObjectStore, *, listen: str, token: str | None = None) -> BrokerServer:
    """A broker for ``store`` on ``listen``, started: its own engine, the namespace's one
    writer (it reads the state only after a conflict)."""
    server = BrokerServer(Engine(store, exclusive=True), listen=listen, token=token)
    server.start()
    return server


def is_loopback(address: str) -> bool:
    """Whether ``host:port`` listens on loopback only (no token needed there)."""
    host = address.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class BrokerServer:
    """Serves ``committer`` (the broker's own engine) to clients on ``listen``.

    >>> from objq_broker.engine import Engine
    >>> from objq_broker.storage import MemoryStore
    >>> server = BrokerServer(Engine(MemoryStore()), listen="127.0.0.1:0")
    >>> server.start(); server.port > 0
    True
    >>> server.stop()
    """

    def __init__(
        self,
        committer: Committer,
        *,
        listen: str,
        token: str | None = None,
        worker_threads: int = DEFAULT_WORKER_THREADS,
    ) -> None:
        if not token and not is_loopback(listen):
            raise ConfigurationError(
                f"objq broker: listening on {listen!r} beyond loopback needs a shared token "
                "(--token-env or $OBJQ_BROKER_TOKEN): anyone who can read the bucket can read "
                "the broker's address"
            )
        self.committer = committer
        self.listen = listen
        self._token = token.encode() if token else None
        self._server = grpc.server(
            ThreadPoolExecutor(worker_threads, thread_name_prefix="objq-broker"),
            options=GRPC_OPTIONS,
        )
        handler = grpc.method_handlers_generic_handler(
            SERVICE, {"Apply": grpc.unary_unary_rpc_method_handler(self._apply)}
        )
        self._server.add_generic_rpc_handlers((handler,))
        try:
            self.port = self._server.add_insecure_port(listen)
        except RuntimeError as exc:
            raise ConfigurationError(f"objq broker: cannot listen on {listen!r}: {exc}") from exc

    @property
    def address(self) -> str:
        """The address clients reach (the listened host with the port actually bound)."""
        return f"{self.listen.rsplit(':', 1)[0]}:{self.port}"

    def start(self) -> None:
        self._server.start()
        log.info("objq broker serving %s on %s", self.committer, self.address)

    def stop(self, grace: float | None = 5.0) -> None:
        """Stop taking requests, let those in progress finish (up to ``grace``), then commit
        what is pending and close the engine."""
        self._server.stop(grace).wait()
        self.committer.close()

    def _apply(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self._authorize(context)
        try:
            batch = wire.decode_request(request)
        except ConfigurationError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        futures: list[Future[Any] | BaseException] = []
        for op in batch:
            try:
                futures.append(self.committer.submit(op))
            except ObjqError as exc:  # closed, or fenced: this op is refused, not the batch
                futures.append(exc)
        outcomes = [self._outcome(future) for future in futures]
        return wire.encode_response(outcomes)

    @staticmethod
    def _outcome(future: Future[Any] | BaseException) -> wire.Outcome:
        if isinstance(future, BaseException):
            return wire.outcome_of(error=future)
        try:
            return wire.outcome_of(future.result())
        except ObjqError as exc:
            return wire.outcome_of(error=exc)
        except Exception as exc:  # a bug: the client sees it as an error, the log keeps it
            log.exception("operation failed unexpectedly")
            return wire.outcome_of(error=ObjqError(f"broker error: {type(exc).__name__}: {exc}"))

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
