"""A Dramatiq worker's consumer on objq: messages claimed ahead by a claim window, handed to
the worker within Dramatiq's prefetch, and settled as leases (ack, nack to the dead letters,
requeue on shutdown)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import dramatiq
from dramatiq.errors import ConnectionClosed
from dramatiq.middleware import Retries

from objq_broker.consume import ClaimWindow
from objq_broker.errors import QueueClosed, StorageError, job_error
from objq_broker.queue import Delivery

if TYPE_CHECKING:
    from objq_broker.dramatiq.broker import ObjqBroker


@contextlib.contextmanager
def connection_errors() -> Iterator[None]:
    """Storage trouble is a broker connection error to Dramatiq: its workers retry those."""
    try:
        yield
    except (StorageError, QueueClosed) as exc:
        raise ConnectionClosed(exc) from exc


class ObjqMessageProxy(dramatiq.MessageProxy):
    """A message and the lease it was delivered under (kept off ``message.options``)."""

    def __init__(self, message: dramatiq.Message[Any], delivery: Delivery) -> None:
        super().__init__(message)
        self._delivery = delivery


class ObjqConsumer(dramatiq.Consumer):
    """Dramatiq's view of a :class:`~objq_broker.consume.ClaimWindow`: the window claims ahead
    and gives back; this hands its messages to the worker within Dramatiq's prefetch."""

    def __init__(self, broker: ObjqBroker, queue_name: str, prefetch: int, timeout: int) -> None:
        self.broker = broker
        self.client = broker.client
        self.queue_name = queue_name
        self.prefetch = prefetch
        self.timeout = timeout
        self.window = ClaimWindow(
            broker.client,
            [queue_name],
            prefetch=prefetch,
            max_window=max(prefetch, broker.max_claim),
        )

    def _settled(self, message: dramatiq.MessageProxy) -> Delivery | None:
        """The message's delivery, no longer held; None if its lease was lost meanwhile (an
        ack would be refused: another worker may hold the message now)."""
        delivery: Delivery = message._delivery
        return self.window.settle(delivery.token)

    def ack(self, message: dramatiq.MessageProxy) -> None:
        delivery = self._settled(message)
        if delivery is None:
            return
        # Dramatiq acks a message whose actor raised when it was not failed for good: the
        # Retries middleware sent it again as a new message, or there is no such middleware.
        exc, outcome = message._exception, "done"
        if exc is not None:
            outcome = "retried" if self._retries else "failed"
        with connection_errors():
            self.client.ack(delivery, outcome=outcome, error=job_error(exc), wait=False)

    @property
    def _retries(self) -> bool:
        return any(isinstance(m, Retries) for m in self.broker.middleware)

    def nack(self, message: dramatiq.MessageProxy) -> None:
        delivery = self._settled(message)
        if delivery is None:
            return
        exc = message._exception
        self.broker.remember_failure(message.message_id, exc)
        with connection_errors():
            self.client.nack(delivery, error=job_error(exc), retry=False, wait=False)

    def requeue(self, messages: Iterable[dramatiq.MessageProxy]) -> None:
        tokens = [message._delivery.token for message in messages]
        with connection_errors():
            self.window.give_back(tokens, wait=True)

    def _room_or_closed(self) -> bool:
        return self.window.closed or self.window.in_hand < self.prefetch

    def __next__(self) -> dramatiq.MessageProxy | None:
        timeout = self.timeout / 1000.0
        with connection_errors():
            room = self.prefetch - self.window.in_hand
            if room <= 0:
                # Prefetch is full: claim ahead (or give back a hoard), then wait for a worker
                # thread to finish one, or for the timeout (the worker needs its wake-ups).
                self.window.poll(0)
                self.window.wait(self._room_or_closed, timeout)
                return None
            got = self.window.take(1, timeout=timeout)
        if not got:
            return None
        [delivery] = got
        return ObjqMessageProxy(dramatiq.Message.decode(delivery.payload), delivery)

    def close(self) -> None:
        """Give back prefetched messages that never reached a worker thread (the ones that
        did stay leased until the worker settles them)."""
        self.window.close()
