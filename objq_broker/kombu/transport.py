"""A kombu transport on objq, so Celery keeps every task and setting and changes its broker line.

>>> import objq_broker.kombu  # registers the "objq" transport alias
>>> from kombu import Connection
>>> with Connection("objq+memory://kombu-doc") as conn:
...     with conn.SimpleQueue("hello") as q:
...         q.put({"n": 1})
...         message = q.get(timeout=1)
...         message.ack()
...         message.payload
{'n': 1}

Broker URLs: ``objq+<storage URL>`` (``objq+file:///var/lib/objq``, ``objq+s3://bucket/prefix``,
``objq+gs://bucket/prefix``, ``objq+memory://name``), or ``objq://`` with the storage URL in
``transport_options={"url": ...}``. Celery can also name the class with
``broker_transport = "objq_broker.kombu:Transport"`` without importing this module.

Mapping onto objq (see ``docs/celery.md``):

* A kombu queue is an objq queue; a message is one job whose payload is the kombu message as
  JSON. kombu priority 0-9 (higher first, as with AMQP) becomes objq priority ``-priority``;
  as on kombu's Redis transport, a priority beyond 0-9 (infinity included) is clamped into it
  and one that is not a number (``None``, ``"high"``, NaN) is 0. Other properties and
  headers (Celery's ``eta`` and ``expires``) travel in the payload, never into the state.
* A delivered, unacked message is a lease. One heartbeat per connection extends the leases of
  every message its channels hold (running, prefetched, or ETA tasks Celery keeps), so
  ``visibility_timeout`` is the time to notice a dead consumer, not a limit on task length.
* ``ack`` finishes the job; ``reject(requeue=True)`` makes it ready again at once and the next
  delivery says ``redelivered``; ``reject(requeue=False)`` dead-letters it. A closing channel
  releases what it holds; a killed process's leases expire and their messages come back.
* Exchanges and bindings are kept in the store (:mod:`objq_broker.kombu.routing`), so direct,
  topic and fanout routing work across processes (Celery broadcast and remote control).
* A queue declared with ``expires`` (``x-expires``) is deleted with its bindings once unused
  that long (Celery's event, pidbox and ``rpc://`` reply queues); a routed message never
  brings a deleted queue back. One that expired under a consumer of this connection that went
  unheard for that long is declared again, with its bindings, by that consumer's next claim.
* The transport joins kombu's event loop through a wakeup socket
  (:mod:`objq_broker.kombu.events`), so Celery runs its event-driven consumer on it.
"""

# mypy: disallow-untyped-calls=False
# (kombu is only partly annotated)
from __future__ import annotations

import collections
import dataclasses
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterable, Sequence, Set
from typing import Any

try:
    from kombu.transport import TRANSPORT_ALIASES, virtual
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the environment
    raise ModuleNotFoundError(
        "objq_broker.kombu needs kombu (Celery's messaging library): "
        "pip install 'objq-broker[celery]'"
    ) from exc

from objq_broker.broker.settings import BrokerSettings, broker_settings
from objq_broker.builders import default_owner
from objq_broker.consume import LeaseKeeper
from objq_broker.errors import ConfigurationError, QueueClosed, QueueError, StorageUnavailable
from objq_broker.kombu import outcomes
from objq_broker.kombu.channel import Channel as ObjqChannel
from objq_broker.kombu.events import LoopBinding
from objq_broker.kombu.routing import ExchangeTable
from objq_broker.kombu.settings import TransportSettings
from objq_broker.queue import Delivery, Queue

log = logging.getLogger("objq_broker.kombu")

#: The process that imported this module: a Celery worker's main process, or a publisher.
_IMPORTED_IN = os.getpid()


def _broker_settings() -> BrokerSettings:
    """Where the transport's queues commit: through the namespace's broker, as every queue's,
    unless ``OBJQ_BROKER`` says otherwise.

    Celery's prefork pool forks its children from the worker's main process; a pool child
    leaves with ``os._exit``, so as the broker it would never hand the role over. A forked
    child's queues therefore join as clients, never serving (the broker's links are made anew
    in a child: :mod:`objq_broker.broker.client`)."""
    settings = broker_settings(None, {})
    if settings.mode == "auto" and os.getpid() != _IMPORTED_IN:
        return dataclasses.replace(settings, mode="client")
    return settings


class _SharedQueues:
    """One :class:`Queue` per process and store for all connections: Celery opens a pool of
    connections (one per publishing thread), and connections that share one engine share its
    commits instead of racing each other's compare-and-set writes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queues: dict[tuple[int, str, str], tuple[Queue, int]] = {}

    def acquire(self, url: str, options: dict[str, Any]) -> Queue:
        # The pid: a forked child (Celery's prefork pool) must not use its parent's engine,
        # whose writer thread did not survive the fork.
        key = (os.getpid(), url, repr(sorted(options.items())))
        with self._lock:
            queue, users = self._queues.get(key, (None, 0))
            if queue is None or queue.closed:
                options = {"owner": _owner(), **options}
                queue, users = Queue(url, broker=_broker_settings(), **options), 0
            self._queues[key] = (queue, users + 1)
            return queue

    def release(self, queue: Queue) -> None:
        with self._lock:
            for key, (held, users) in list(self._queues.items()):
                if held is queue:
                    if users > 1:
                        self._queues[key] = (held, users - 1)
                        return
                    del self._queues[key]
                    break
        queue.close()


_shared_queues = _SharedQueues()

TRANSPORT_ALIASES.setdefault("objq", "objq_broker.kombu:Transport")

try:
    from celery.app.backends import BACKEND_ALIASES
except ModuleNotFoundError:  # kombu without Celery: there is no result backend to name
    pass
else:
    # Only the name: the backend module (and its Celery imports) loads when an app uses it.
    BACKEND_ALIASES.setdefault("objq", "objq_broker.results.celery:ObjqBackend")
    outcomes.connect()


class Transport(virtual.Transport):
    """kombu transport for objq; one :class:`~objq_broker.queue.Queue` per connection,
    shared by its channels, and one heartbeat thread for all the messages they hold."""

    Channel = ObjqChannel
    driver_type = "objq"
    driver_name = "objq"
    can_parse_url = True
    default_port = None
    implements = virtual.Transport.implements.extend(
        asynchronous=True,  # through a wakeup socket: see objq_broker.kombu.events
        batch_publish=True,  # Producer.batch(): see objq_broker.kombu.batch
        exchange_type=frozenset(["direct", "topic", "fanout"]),
        heartbeats=False,
    )
    # Worth a reconnect: the storage did not answer. A missing bucket, denied access or an
    # unusable directory are raised at once (no retry can fix them).
    connection_errors = (  # type: ignore[assignment]
        *virtual.Transport.connection_errors,
        StorageUnavailable,
        QueueClosed,
    )
    channel_errors = (*virtual.Transport.channel_errors, QueueError)  # type: ignore[assignment]

    def __init__(self, client: Any, **kwargs: Any) -> None:
        if len(getattr(client, "alt", None) or ()) > 1:
            raise ConfigurationError(
                f"objq transport: got failover URLs {client.alt!r}; expected one store (an "
                "alternate store would hold other queues: use storage with its own redundancy)"
            )
        self.settings = TransportSettings.from_connection(client.hostname, client.transport_options)
        super().__init__(client, **kwargs)
        self.polling_interval = self.settings.polling_interval
        self.queue: Queue | None = None
        self._exchanges: ExchangeTable | None = None
        self._declared: set[str] = set()
        #: The queues this connection declared with an expiry, and that expiry (seconds).
        self._expiring: dict[str, float] = {}
        #: Extends the leases of every message this connection's channels hold.
        self.lease_keeper: LeaseKeeper | None = None
        self._lock = threading.Lock()
        self._binding: LoopBinding | None = None
        self._stop_arrivals: Callable[[], None] | None = None

    @property
    def default_connection_params(self) -> dict[str, Any]:
        return {"port": None, "hostname": None}

    def driver_version(self) -> str:
        from objq_broker import __version__

        return __version__

    def open_queue(self) -> Queue:
        """This connection's queue, shared with the process's other connections to the store.
        kombu releases what a connection holds only when it closes one it established, so a
        connection not established yet (one from Celery's pool, say) is established first:
        otherwise its queue, with its writer thread, stayed open for good."""
        client = self.client
        if client is not None and client._connection is None:
            client.connect()  # (which takes the queue, through establish_connection)
        return self.shared_queue()

    def shared_queue(self) -> Queue:
        """The queue, taken as it is (by the connection's own parts, which exist only while
        it is established or being established)."""
        with self._lock:
            if self.queue is None or self.queue.closed:
                self.queue = _shared_queues.acquire(self.settings.url, self.settings.queue_options)
                self._exchanges = ExchangeTable(
                    self.queue.store, ttl_seconds=self.settings.bindings_ttl
                )
                self._declared.clear()
            return self.queue

    @property
    def exchanges(self) -> ExchangeTable:
        self.shared_queue()
        assert self._exchanges is not None
        return self._exchanges

    def declare(self, queue: str, expires_seconds: float | None = None) -> None:
        """Declare ``queue`` once per connection; a queue that expires is declared every
        time, as declaring it again counts as using it (and brings it back once expired)."""
        if expires_seconds is not None:
            self.shared_queue().declare(queue, expires_seconds=expires_seconds)
            self._expiring[queue] = expires_seconds
            self._declared.discard(queue)
            return
        if queue in self._declared:
            return
        self.shared_queue().declare(queue)
        self._declared.add(queue)

    def forget(self, queue: str) -> None:
        self._declared.discard(queue)
        self._expiring.pop(queue, None)

    def revive(self, queues: Iterable[str]) -> bool:
        """Declare again, with the bindings this connection made, each of ``queues`` that is
        gone after this connection declared it with an expiry: it expired while its consumer
        here went unheard for that long (a stalled process, a blocked event loop). RabbitMQ
        keeps a queue while it has a consumer; here a Celery worker whose remote-control queue
        vanished would stop. True when a claim of ``queues`` may go again; False when one of
        them is gone that this connection cannot bring back (deleted, or declared elsewhere)."""
        present = set(self.shared_queue().queues())
        gone = [queue for queue in dict.fromkeys(queues) if queue not in present]
        if any(queue not in self._expiring for queue in gone):
            return False
        for queue in gone:
            log.warning(
                "queue %r expired while consumed here (its consumer went unheard for its "
                "expiry, %g s): declared again; what was sent to it meanwhile is lost",
                queue,
                self._expiring[queue],
            )
            self.declare(queue, self._expiring[queue])
            for exchange, declared in (self.state.exchanges or {}).items():
                for meta in declared.get("table", []):
                    if meta[2] == queue:
                        self.exchanges.bind(exchange, declared["type"], tuple(meta))
        return True

    def establish_connection(self) -> Transport:
        client = self.shared_queue()
        try:
            client.queues()  # reach the store now: a wrong bucket or a dead endpoint fails here
        except BaseException:
            self._close_queue()
            raise
        self._start_heartbeat()
        result: Transport = super().establish_connection()
        return result

    def close_connection(self, connection: Any) -> None:
        try:
            super().close_connection(connection)
        finally:
            self._leave_event_loop()
            keeper, self.lease_keeper = self.lease_keeper, None
            if keeper is not None:
                keeper.stop(timeout=5)
            self._close_queue()

    def _close_queue(self) -> None:
        with self._lock:
            client, self.queue = self.queue, None
        if client is not None:
            _shared_queues.release(client)

    # --- event loop ------------------------------------------------------------------------

    def register_with_event_loop(self, connection: Any, loop: Any) -> None:
        """Deliver through ``loop`` (kombu's Hub, as Celery's worker runs it) from now on."""
        self._leave_event_loop()
        binding = self._binding = LoopBinding(loop, self.polling_interval, self.pump)
        # Told of jobs committed (here, or at the broker this process follows), the loop
        # claims at once instead of at its next poll: a worker between tasks is not kept
        # waiting for its timer, and in broker mode for most of what other processes send.
        self._stop_arrivals = self.shared_queue().on_arrivals(binding.look_now)
        self.wake()

    def wake(self) -> None:
        """Have the event loop (if any) deliver what can be delivered now; any thread."""
        binding = self._binding
        if binding is not None:
            binding.wakeup.signal()

    def pump(self, poll: bool = False) -> int:
        """In the loop: hand every channel's claimed messages to its consumers (``poll``: the
        loop's timer called, so empty queues are claimed from again); how many it handed out.

        What the channels hold goes out in the order it was sent (each job's sequence number
        in the state), not channel by channel: a worker consumes its tasks on one channel and
        its remote control on another, and a revoke sent just before a task must reach it
        first. Each channel's own order (priorities, its queues' turns) is kept."""
        handed_out = 0
        while True:
            # Once a round, not once a message: it walks every channel of the connection.
            riders = self.no_ack_queues()
            collected = [(c, c.collect(poll, riders)) for c in list(self.channels)]
            poll = False
            if not any(found for _, found in collected):
                return handed_out
            merged = in_sent_order(collected)
            for index, (channel, delivery) in enumerate(merged):
                try:
                    channel.hand_out(delivery, riders)
                except BaseException:
                    # The rest were never handed over: give them back rather than hold them.
                    for owner, rest in _by_channel(merged[index + 1 :]).items():
                        owner.give_back(rest)
                    raise
            handed_out += len(merged)

    def no_ack_queues(self) -> frozenset[str]:
        """The queues this connection's channels consume without acks (see
        :meth:`Channel.riders <objq_broker.kombu.channel.Channel.riders>`)."""
        return frozenset(
            queue
            for channel in list(self.channels)
            if not channel.closed
            for queue in channel.consumed_without_ack()
        )

    def _leave_event_loop(self) -> None:
        stop, self._stop_arrivals = self._stop_arrivals, None
        if stop is not None:
            stop()
        binding, self._binding = self._binding, None
        if binding is not None:
            binding.close()

    # --- heartbeat (the lease holder of every channel) -------------------------------------

    def _start_heartbeat(self) -> None:
        if self.lease_keeper is not None and self.lease_keeper.running:
            return
        self.lease_keeper = LeaseKeeper(
            self.shared_queue(),
            interval_seconds=self.settings.heartbeat_interval,
            lease_seconds=self.settings.visibility_timeout,
            name="objq-kombu-heartbeat",
        )
        self.lease_keeper.register(self)

    def _all_channels(self) -> list[ObjqChannel]:
        return list(self.channels) + [c for c in self._avail_channels if c not in self.channels]

    def held(self) -> list[Delivery]:
        return [delivery for channel in self._all_channels() for delivery in channel.held()]

    def drop(self, tokens: Set[str]) -> None:
        for channel in self._all_channels():
            channel.drop(tokens)


def in_sent_order(
    collected: Sequence[tuple[ObjqChannel, list[Delivery]]],
) -> list[tuple[ObjqChannel, Delivery]]:
    """The channels' deliveries as one sequence: each time, the first undelivered one of
    each channel is compared and the one sent first (lowest sequence number) goes. Each
    channel's own order is kept even where it is not the order sent (a priority, a queue's
    turn): only the choice between channels follows the sending order."""
    heads = [(channel, collections.deque(found)) for channel, found in collected if found]
    merged: list[tuple[ObjqChannel, Delivery]] = []
    while heads:
        channel, pending = min(heads, key=lambda head: head[1][0].job.seq)
        merged.append((channel, pending.popleft()))
        if not pending:
            heads = [head for head in heads if head[1]]
    return merged


def _by_channel(
    pairs: Iterable[tuple[ObjqChannel, Delivery]],
) -> dict[ObjqChannel, list[Delivery]]:
    grouped: dict[ObjqChannel, list[Delivery]] = {}
    for channel, delivery in pairs:
        grouped.setdefault(channel, []).append(delivery)
    return grouped


def _owner() -> str:
    """The lease holder's name ``objq workers`` shows: host, process, and Celery when this
    runs in a Celery worker (kombu is also used on its own)."""
    return default_owner("celery" if "celery" in sys.modules else "kombu")
