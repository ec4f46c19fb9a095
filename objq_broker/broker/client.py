"""A :class:`~objq_broker.engine.port.Committer` that forwards operations to a broker.

Operations submitted while a request is in flight wait and go together in the next one, so a
process with many threads sends one request at a time, whatever its thread count (the same
group commit as the local engine, one hop earlier). Payloads kept out of line are still read
from storage directly, in parallel, by the client's own body cache.

A request that fails in transit fails its operations with
:class:`~objq_broker.errors.StorageUnavailable` (the frameworks retry those); one refused for
its token fails them with :class:`~objq_broker.errors.AccessDenied`.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

import grpc

from objq_broker.broker import wire
from objq_broker.broker.server import APPLY_METHOD, GRPC_OPTIONS, TOKEN_METADATA
from objq_broker.engine.bodies import BodyCache
from objq_broker.engine.commit import DEFAULT_COMMIT_DEADLINE_SECONDS, EngineMetrics
from objq_broker.errors import AccessDenied, QueueClosed, StorageError, StorageUnavailable
from objq_broker.model.ops import Nothing, Op
from objq_broker.storage.base import ObjectStore

T = TypeVar("T")
log = logging.getLogger("objq_broker.broker")

#: Most operations one request carries.
MAX_REQUEST_OPS = 5000


class BrokerClient:
    """Sends this process's operations to the broker at ``address``.

    ``store``: the namespace's store (payload bodies are read from it directly).
    ``token``: the broker's shared token, if it requires one.
    """

    def __init__(
        self,
        store: ObjectStore,
        address: str,
        *,
        token: str | None = None,
        commit_deadline_seconds: float = DEFAULT_COMMIT_DEADLINE_SECONDS,
    ) -> None:
        self.store = store
        self.address = address
        self.bodies = BodyCache(store)
        self.commit_deadline_seconds = commit_deadline_seconds
        self.metrics = EngineMetrics()
        self._metadata = ((TOKEN_METADATA, token),) if token else ()
        self._channel = grpc.insecure_channel(address, options=GRPC_OPTIONS)
        self._call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = self._channel.unary_unary(
            APPLY_METHOD
        )
        self._pending: deque[tuple[Op[Any], Future[Any]]] = deque()
        self._cv = threading.Condition()
        self._closing = False
        self._thread: threading.Thread | None = None
        self._listeners: list[Callable[[], None]] = []

    def __repr__(self) -> str:
        return f"BrokerClient({self.address!r} for {self.store.url!r})"

    # --- the Committer interface -----------------------------------------------------------

    def submit(self, op: Op[T]) -> Future[T]:
        future: Future[T] = Future()
        with self._cv:
            if self._closing:
                raise QueueClosed(f"the broker client for {self.store.url} is closed")
            self._pending.append((op, future))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"objq-broker-client {self.address}", daemon=True
                )
                self._thread.start()
            self._cv.notify()
        return future

    def flush(self, timeout: float | None = None) -> None:
        with self._cv:
            if self._thread is None:
                return
        self.submit(Nothing()).result(timeout)

    def close(self, timeout: float | None = None) -> None:
        with self._cv:
            self._closing = True
            self._cv.notify()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
        self._channel.close()
        self.bodies.close()

    def on_commit(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    @property
    def closed(self) -> bool:
        return self._closing

    # --- the sender thread -----------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._pending and not self._closing:
                    self._cv.wait()
                if not self._pending:
                    return
                batch = [
                    self._pending.popleft() for _ in range(min(len(self._pending), MAX_REQUEST_OPS))
                ]
            self._send(batch)
            for listener in self._listeners:
                listener()

    def _send(self, batch: list[tuple[Op[Any], Future[Any]]]) -> None:
        live = [(op, future) for op, future in batch if future.set_running_or_notify_cancel()]
        ops = [op for op, _ in live]
        try:
            response = self._call(
                wire.encode_request(ops),
                timeout=self.commit_deadline_seconds,
                metadata=self._metadata,
            )
            outcomes = wire.decode_response(response, ops)
        except grpc.RpcError as exc:
            error = self._transport_error(exc)
            for _, future in live:
                future.set_exception(error)
            return
        except StorageError as exc:
            for _, future in live:
                future.set_exception(exc)
            return
        self.metrics.batches += 1
        self.metrics.ops += len(ops)
        for (_, future), (ok, value) in zip(live, outcomes, strict=True):
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)

    def _transport_error(self, exc: grpc.RpcError) -> StorageError:
        # A failed call's error is also its grpc.Call, which says why.
        code: Any = getattr(exc, "code", lambda: None)()
        detail: Any = getattr(exc, "details", lambda: str(exc))()
        if code == grpc.StatusCode.UNAUTHENTICATED:
            return AccessDenied(f"broker {self.address}: {detail}")
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return StorageUnavailable(
                f"broker {self.address}: no answer within {self.commit_deadline_seconds:g} s; "
                "the operations may or may not have been applied"
            )
        return StorageUnavailable(f"broker {self.address} unreachable or failed: {detail}")
