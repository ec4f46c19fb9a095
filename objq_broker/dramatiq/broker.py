"""The Dramatiq broker on objq (:class:`ObjqBroker`): its settings, sending, queues, joining,
dead letters and closing. What a worker's consumer does is :mod:`objq_broker.dramatiq.consumer`;
the package's description says how Dramatiq maps onto objq."""

from __future__ import annotations

import collections
import threading
import time
import weakref
from typing import Annotated, Any

import dramatiq
import msgspec
from dramatiq.common import current_millis, dq_name
from dramatiq.errors import QueueJoinTimeout, QueueNotFound
from msgspec import Meta

from objq_broker.builders import default_owner
from objq_broker.consume import LeaseKeeper
from objq_broker.consume.leases import heartbeat_every
from objq_broker.dramatiq.consumer import ObjqConsumer, connection_errors
from objq_broker.errors import ConfigurationError
from objq_broker.model.checks import (
    MAX_SECONDS,
    PRIORITY_RANGE,
    Attempts,
    ClaimCount,
    Identifier,
    PositiveSeconds,
    checked,
)
from objq_broker.model.records import DEFAULT_LEASE_SECONDS
from objq_broker.model.settings import read_settings
from objq_broker.queue import Queue
from objq_broker.storage import ObjectStore

#: Dead-lettered messages are kept a week, as with Dramatiq's Redis and RabbitMQ brokers.
DEFAULT_DEAD_MESSAGE_TTL_MS = 7 * 24 * 3600 * 1000
#: How many lease expiries (killed workers) a message survives before it is dead-lettered.
DEFAULT_MAX_DELIVERIES = 20
#: Environment variable for ``lease_seconds`` (read when the broker is built).
LEASE_ENV = "OBJQ_LEASE_SECONDS"
#: Most messages a consumer claims ahead of its worker threads (see ``max_claim``).
DEFAULT_MAX_CLAIM = 256
#: How many actor exceptions the broker remembers for ``join(fail_fast=True)``.
_REMEMBERED_FAILURES = 1000
#: Longest delay (or dead-letter retention) accepted, in milliseconds: objq's bound on any
#: span of time, about a century.
MAX_DELAY_MS = MAX_SECONDS * 1000.0
#: ``broker_priority`` is stored negated (objq runs lower first), so its range is symmetric.
BROKER_PRIORITY_RANGE = (-PRIORITY_RANGE[1], PRIORITY_RANGE[1])

Milliseconds = Annotated[float, Meta(ge=-MAX_DELAY_MS, le=MAX_DELAY_MS)]
BrokerPriority = Annotated[int, Meta(ge=BROKER_PRIORITY_RANGE[0], le=BROKER_PRIORITY_RANGE[1])]


class DramatiqSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The broker's own settings, checked when it is built (not when a queue is declared).
    Numbers may be given as text too (``lease_seconds="1m"``), as the environment gives them."""

    #: How long a message stays invisible without a heartbeat.
    lease_seconds: Annotated[PositiveSeconds, Meta(extra={"env": LEASE_ENV})] = (
        DEFAULT_LEASE_SECONDS
    )
    #: How often held messages' leases are extended (None: lease_seconds / 3).
    heartbeat_seconds: PositiveSeconds | None = None
    #: How long dead letters are kept, in milliseconds.
    dead_message_ttl: Annotated[float, Meta(gt=0, le=MAX_DELAY_MS, extra={"unit": "ms"})] = (
        DEFAULT_DEAD_MESSAGE_TTL_MS
    )
    #: Lease expiries (killed workers) a message survives before it is dead-lettered.
    max_deliveries: Attempts = DEFAULT_MAX_DELIVERIES
    #: Most messages a consumer holds claimed ahead of its worker threads.
    max_claim: ClaimCount = DEFAULT_MAX_CLAIM


class _SendOptions(msgspec.Struct):
    """What a message asks of ``enqueue``, checked before it is copied or stored."""

    delay: Milliseconds | None = None
    broker_priority: BrokerPriority | None = None
    #: The message's group (a tenant): ``docs/groups.md``.
    group: Identifier | None = None


class ObjqBroker(dramatiq.Broker):
    """A Dramatiq broker whose queues live in object storage.

    Parameters:
      url: storage URL (``file:///var/lib/objq``, ``s3://bucket/prefix``, ...); defaults to
        ``$OBJQ_URL``.
      store: an already opened :class:`~objq_broker.storage.ObjectStore` instead of a URL.
      queue: an existing :class:`~objq_broker.queue.Queue` to share (instead of url/store).
      lease_seconds: how long a message stays invisible without a heartbeat; defaults to
        ``$OBJQ_LEASE_SECONDS``, else 30.
      heartbeat_seconds: how often held messages' leases are extended (lease / 3).
      dead_message_ttl: how long dead letters are kept, in milliseconds.
      max_claim: most messages a consumer holds claimed ahead of its worker threads. Dramatiq's
        prefetch bounds the messages handed to worker threads; the claim window starts there
        and doubles while the threads drain each batch before the next one commits (a backlog
        of short tasks), up to this. Claimed messages that wait over a second for a thread are
        given back, so slow tasks never hoard a queue that other workers could run.
      fail_fast_default: what ``join`` does when ``fail_fast`` is not given. True (as with
        Dramatiq 2's StubBroker, for tests) also keeps the exceptions of the messages this
        broker dead-letters, so ``join`` can re-raise them; False keeps only their ids.
      middleware: as for any Dramatiq broker.
      **options: engine and storage options, as for ``Queue(url, **options)``.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        store: ObjectStore | None = None,
        queue: Queue | None = None,
        lease_seconds: float | None = None,
        heartbeat_seconds: float | None = None,
        dead_message_ttl: float = DEFAULT_DEAD_MESSAGE_TTL_MS,
        max_deliveries: int = DEFAULT_MAX_DELIVERIES,
        max_claim: int = DEFAULT_MAX_CLAIM,
        fail_fast_default: bool = False,
        middleware: list[dramatiq.Middleware] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(middleware=middleware)
        if queue is not None and (url is not None or store is not None or options):
            raise ConfigurationError(
                "ObjqBroker: got queue= together with a URL, store= or options; expected one"
            )
        given = {
            "lease_seconds": lease_seconds,
            "heartbeat_seconds": heartbeat_seconds,
            "dead_message_ttl": dead_message_ttl,
            "max_deliveries": max_deliveries,
            "max_claim": max_claim,
        }
        # Checked before the queue is opened: a refused broker leaves nothing running.
        settings = read_settings(
            DramatiqSettings,
            {name: value for name, value in given.items() if value is not None},
            where="ObjqBroker",
            lax=True,
        )
        heartbeat = heartbeat_every(
            settings.lease_seconds,
            settings.heartbeat_seconds,
            "ObjqBroker",
            ("lease_seconds", "heartbeat_seconds"),
        )
        if queue is None:
            options.setdefault("owner", default_owner("dramatiq"))  # shown by objq workers
            queue = Queue(url, store=store, **options)
        self.client = queue
        self.queues: set[str] = set()
        self.lease_seconds = settings.lease_seconds
        self.heartbeat_seconds = heartbeat
        self.dead_message_ttl = settings.dead_message_ttl
        self.max_deliveries = settings.max_deliveries
        self.max_claim = settings.max_claim
        self.fail_fast_default = fail_fast_default
        self.actor_options.update({"broker_priority", "group"})
        self._consumers: weakref.WeakSet[ObjqConsumer] = weakref.WeakSet()
        # message id -> the exception it was dead-lettered with (kept only in fail-fast mode)
        self._failures: collections.OrderedDict[str, BaseException | None] = (
            collections.OrderedDict()
        )
        self._lock = threading.Lock()
        self._keeper: LeaseKeeper | None = None  # started by the first consumer

    @property
    def consumer_class(self) -> type[ObjqConsumer]:
        return ObjqConsumer

    # --- the broker interface --------------------------------------------------------------

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 5000) -> dramatiq.Consumer:
        if queue_name not in self.queues and queue_name not in self.delay_queues:
            raise QueueNotFound(queue_name)
        consumer = self.consumer_class(self, queue_name, prefetch, timeout)
        with self._lock:
            self._consumers.add(consumer)
            if self._keeper is None:
                self._keeper = LeaseKeeper(
                    self.client,
                    interval_seconds=self.heartbeat_seconds,
                    lease_seconds=self.lease_seconds,
                    name="objq-dramatiq-heartbeat",
                )
            keeper = self._keeper
        # Prefetched and running messages alike, until the worker settles them.
        keeper.register(consumer.window)
        return consumer

    def declare_actor(self, actor: dramatiq.Actor[Any, Any]) -> None:
        """Declare ``actor``, refusing a ``broker_priority`` no message could be sent with."""
        priority = actor.options.get("broker_priority")
        where = f"ObjqBroker: actor {actor.actor_name!r}"
        checked({"broker_priority": priority}, _SendOptions, where)
        group = actor.options.get("group")
        if group is not None and not callable(group):
            checked({"group": group}, _SendOptions, where)
        super().declare_actor(actor)

    def declare_queue(self, queue_name: str) -> None:
        if queue_name in self.queues:
            return
        self.emit_before("declare_queue", queue_name)
        settings = {
            "lease_seconds": self.lease_seconds,
            "max_attempts": self.max_deliveries,
            "dead_ttl_seconds": self.dead_message_ttl / 1000.0,
        }
        delayed = dq_name(queue_name)
        with connection_errors():
            self.client.declare(queue_name, **settings)
            self.client.declare(delayed, **settings)
        self.queues.add(queue_name)
        self.emit_after("declare_queue", queue_name)
        self.delay_queues.add(delayed)
        self.emit_after("declare_delay_queue", delayed)

    def enqueue(
        self, message: dramatiq.Message[Any], *, delay: int | None = None
    ) -> dramatiq.Message[Any]:
        sent = self._send_options(message, delay)
        queue_name = message.queue_name
        if sent.delay is not None:
            queue_name = dq_name(queue_name)
            eta = current_millis() + sent.delay
            message = message.copy(queue_name=queue_name, options={"eta": eta})
        if queue_name not in self.queues and queue_name not in self.delay_queues:
            raise QueueNotFound(queue_name)
        self.emit_before("enqueue", message, delay)
        with connection_errors():
            self.client.enqueue(
                queue_name,
                message.encode(),
                priority=-(sent.broker_priority or 0),
                delay=None if sent.delay is None else max(sent.delay, 0) / 1000.0,
                group=sent.group,
            )
        self.emit_after("enqueue", message, delay)
        return message

    def _send_options(self, message: dramatiq.Message[Any], delay: float | None) -> _SendOptions:
        """The message's delay (milliseconds), ``broker_priority`` and ``group`` (its own,
        else its actor's; an actor's ``group`` may be a function of the message), checked;
        :class:`ConfigurationError` naming the one refused."""
        actor = self.actors.get(message.actor_name)
        options = actor.options if actor is not None else {}
        priority = message.options.get("broker_priority")
        if priority is None:
            priority = options.get("broker_priority")
        group = message.options.get("group")
        if group is None:
            group = options.get("group")
        if callable(group):
            group = group(message)
        where = f"ObjqBroker: message to actor {message.actor_name!r} (delay in milliseconds)"
        given = {"delay": delay, "broker_priority": priority, "group": group}
        return checked(given, _SendOptions, where)

    def get_declared_queues(self) -> set[str]:
        return set(self.queues)

    def get_declared_delay_queues(self) -> set[str]:
        return set(self.delay_queues)

    def flush(self, queue_name: str) -> None:
        """Drop the queue's waiting messages (and its delay queue's)."""
        with connection_errors():
            for name in (queue_name, dq_name(queue_name)):
                if name in self.queues or name in self.delay_queues:
                    self.client.purge(name)

    def flush_all(self) -> None:
        """Drop every waiting message and every dead letter of the declared queues."""
        with connection_errors():
            for name in self.queues | self.delay_queues:
                self.client.purge(name)
                self.client.purge_dead(name)
        with self._lock:
            self._failures.clear()

    def join(
        self,
        queue_name: str,
        *,
        timeout: int | None = None,
        fail_fast: bool | None = None,
        interval: int = 10,
    ) -> None:
        """Wait until the queue and its delay queue are empty and nothing is in flight.

        With ``fail_fast`` (default: ``fail_fast_default``), re-raise the failure of a message
        of this queue that this broker dead-lettered, as Dramatiq's StubBroker does in tests.
        Dead letters left by other processes or earlier runs are not raised.
        """
        if queue_name not in self.queues:
            raise QueueNotFound(queue_name)
        deadline = None if timeout is None else time.monotonic() + timeout / 1000.0
        names = (queue_name, dq_name(queue_name))
        while True:
            with connection_errors():
                self.client.flush()
                busy = self._busy(names)
            if not busy:
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise QueueJoinTimeout(queue_name)
            time.sleep(interval / 1000.0)
        if self.fail_fast_default if fail_fast is None else fail_fast:
            self._raise_failure(queue_name)

    def _busy(self, names: tuple[str, ...]) -> bool:
        """Whether any of ``names`` holds a message, read from one state: a message moving
        from the delay queue to its queue between two reads would otherwise be missed."""
        every = self.client.stats_many(names)
        return any(stats.ready + stats.delayed + stats.in_flight > 0 for stats in every)

    def _raise_failure(self, queue_name: str) -> None:
        for message in self.dead_letters_of(queue_name):
            with self._lock:
                if message.message_id not in self._failures:
                    continue  # dead-lettered elsewhere, or before this broker was built
                failure = self._failures[message.message_id]
            raise failure or Exception(
                f"message {message.message_id} ({message.actor_name}) was dead-lettered"
            ) from None

    @property
    def dead_letters(self) -> list[dramatiq.Message[Any]]:
        """The dead-lettered messages of every declared queue, oldest first."""
        return [m for name in sorted(self.queues) for m in self.dead_letters_of(name)]

    def dead_letters_of(self, queue_name: str) -> list[dramatiq.Message[Any]]:
        with connection_errors():
            jobs = [
                *self.client.dead_letters(queue_name),
                *self.client.dead_letters(dq_name(queue_name)),
            ]
        return [dramatiq.Message.decode(job.payload) for job in jobs]

    def close(self) -> None:
        if self._keeper is not None:
            self._keeper.stop()
        for consumer in list(self._consumers):
            consumer.close()
        self.client.close()

    # --- bookkeeping for consumers ---------------------------------------------------------

    def remember_failure(self, message_id: str, exc: BaseException | None) -> None:
        # An exception holds its traceback's frames: keep it only when asked to (tests).
        with self._lock:
            self._failures[message_id] = exc if self.fail_fast_default else None
            while len(self._failures) > _REMEMBERED_FAILURES:
                self._failures.popitem(last=False)
