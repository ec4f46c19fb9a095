"""``TypedQueue``: one queue of a :class:`~objq_broker.queue.Queue` whose payloads are values
of one type; and what it shares with :class:`~objq_broker.typed.aio.AsyncTypedQueue`, the
typed delivery and the sorting of claimed jobs into values and dead letters."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar, Unpack

from objq_broker import builders
from objq_broker.builders import Delay, Delivery, JobOptions
from objq_broker.errors import ConfigurationError, job_error
from objq_broker.model.checks import checked_timeout
from objq_broker.model.records import Job, NackResult
from objq_broker.queue import Queue
from objq_broker.typed.schema import PayloadInvalid, Schema

T = TypeVar("T")
log = logging.getLogger("objq_broker.typed")

__all__ = ["TypedDelivery", "TypedQueue"]


@dataclass(frozen=True, slots=True)
class TypedDelivery(Delivery, Generic[T]):
    """A claimed job whose payload validated: ``value`` is the payload decoded.

    It is a :class:`~objq_broker.queue.Delivery` (``id``, ``job``, ``token``, ``payload``),
    so every method of the queue that takes deliveries takes it: ``heartbeat``,
    ``keep_alive``, ``release``.
    """

    value: T


def typed_deliveries(
    queue: Queue, schema: Schema[T], name: str, claimed: Iterable[Delivery]
) -> list[TypedDelivery[T]]:
    """The deliveries of ``claimed`` whose payloads validate, as values. Each of the others is
    dead-lettered at once with the validation error: retrying cannot make it valid. The
    dead-lettering is submitted, not waited for; if it fails, the lease runs out and the job
    comes back, to the same end."""
    typed = []
    for delivery in claimed:
        try:
            value = schema.decode(delivery.payload, where=f"queue {name!r}, job {delivery.id}")
        except PayloadInvalid as exc:
            log.warning("dead-lettering job %s of queue %r: %s", delivery.id, name, exc)
            queue.nack(delivery, error=job_error(exc), retry=False, wait=False)
            continue
        typed.append(TypedDelivery(delivery.job, delivery.token, value))
    return typed


def encode_all(schema: Schema[T], name: str, values: Iterable[T]) -> list[bytes]:
    """The payloads of ``values``, every one checked before any is submitted."""
    return [schema.encode(value, where=f"enqueue to {name!r}") for value in values]


def one_of(where: str, queue: object, url: str | None) -> None:
    """Refuse a typed queue given both, or neither, of a queue and a URL."""
    if (queue is None) == (url is None):
        found = "both" if url is not None else "neither"
        raise ConfigurationError(f"{where}: expected one of queue= or url=, found {found}")


class TypedQueue(Generic[T]):
    """The queue ``name`` of a :class:`~objq_broker.queue.Queue`, with payloads of ``type_``:
    a ``msgspec.Struct``, a dataclass, a ``TypedDict`` or a pydantic model.

    >>> import msgspec
    >>> class Order(msgspec.Struct):
    ...     sku: str
    ...     qty: int
    >>> with TypedQueue("orders", Order, url="memory://typed-doc") as orders:
    ...     _ = orders.enqueue(Order("A-1", 2))
    ...     [delivery] = orders.claim()
    ...     orders.ack(delivery)
    >>> delivery.value
    Order(sku='A-1', qty=2)

    Values are validated when enqueued and again when claimed. A claimed payload that does
    not validate (written by another producer, or by an older version of ``type_``) is
    dead-lettered at once with the validation error, and the claim returns the others.

    Given ``url``, the typed queue opens its own :class:`Queue` and closes it; given
    ``queue``, it shares that one (one per process and store is best) and ``close()`` only
    waits for what it submitted. ``queue`` is there for everything else: ``stats``,
    ``dead_letters``, ``keep_alive``.
    """

    def __init__(
        self,
        name: str,
        type_: type[T],
        /,
        *,
        queue: Queue | None = None,
        url: str | None = None,
    ) -> None:
        one_of("TypedQueue", queue, url)
        self.name = builders.queue_name(name, "TypedQueue")
        self.schema = Schema(type_)
        self._owned = queue is None
        #: The untyped queue underneath.
        self.queue = Queue(url) if queue is None else queue

    def __repr__(self) -> str:
        return f"TypedQueue({self.name!r}, {self.schema.name}, {self.queue!r})"

    def __enter__(self) -> TypedQueue[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def enqueue(
        self,
        value: T,
        *,
        key: str | None = None,
        **options: Unpack[JobOptions],
    ) -> Job:
        """Add ``value`` as one job; durable when this returns. Raises
        :class:`~objq_broker.typed.schema.PayloadInvalid` if it does not validate."""
        [payload] = encode_all(self.schema, self.name, [value])
        return self.queue.enqueue(self.name, payload, key=key, **options)

    def enqueue_many(
        self,
        values: Iterable[T],
        *,
        keys: Sequence[str | None] | None = None,
        **options: Unpack[JobOptions],
    ) -> list[Job]:
        """Add many values in one commit: all are durable, or none (one that does not
        validate stops them all before anything is submitted)."""
        payloads = encode_all(self.schema, self.name, values)
        return self.queue.enqueue_many(self.name, payloads, keys=keys, **options)

    def claim(
        self, n: int = 1, *, lease: Delay = None, timeout: float | None = None
    ) -> list[TypedDelivery[T]]:
        """Lease up to ``n`` jobs and decode them; with ``timeout``, wait up to that many
        seconds for at least one that validates. Those that do not are dead-lettered."""
        timeout = checked_timeout(timeout, f"claim from {self.name!r}")
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if end is None else max(end - time.monotonic(), 0.0)
            claimed = self.queue.claim(self.name, n, lease=lease, timeout=left)
            typed = typed_deliveries(self.queue, self.schema, self.name, claimed)
            if typed or not claimed or end is None or time.monotonic() >= end:
                return typed

    def ack(self, delivery: TypedDelivery[T], *, wait: bool = True) -> None:
        """Finish a delivery (see :meth:`Queue.ack <objq_broker.queue.Queue.ack>`)."""
        self.queue.ack(delivery, wait=wait)

    def nack(
        self,
        delivery: TypedDelivery[T],
        *,
        error: str | None = None,
        retry: bool = True,
        delay: Delay = None,
        wait: bool = True,
    ) -> NackResult | None:
        """Fail a delivery: retry it after the queue's backoff (or ``delay``), or dead-letter
        it when ``retry`` is false or its attempts are spent."""
        return self.queue.nack(delivery, error=error, retry=retry, delay=delay, wait=wait)

    def close(self) -> None:
        """Close the queue this typed queue opened; or, if it was given one, wait until what
        it submitted (acks, dead letters) is durable."""
        if self._owned:
            self.queue.close()
        else:
            self.queue.flush()
