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
  JSON. kombu priority 0-9 (higher first, as with AMQP) becomes objq priority ``-priority``.
* A delivered, unacked message is a lease. One heartbeat per connection extends the leases of
  every message its channels hold (running, prefetched, or ETA tasks Celery keeps), so
  ``visibility_timeout`` is the time to notice a dead consumer, not a limit on task length.
* ``ack`` finishes the job; ``reject(requeue=True)`` makes it ready again at once and the next
  delivery says ``redelivered``; ``reject(requeue=False)`` dead-letters it. A closing channel
  releases what it holds; a killed process's leases expire and their messages come back.
* Exchanges and bindings are kept in the store (:mod:`objq_broker.kombu_exchanges`), so direct,
  topic and fanout routing work across processes (Celery broadcast and remote control).
"""

# mypy: disallow-untyped-calls=False
# (kombu is only partly annotated)
from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterable
from queue import Empty
from typing import Any

try:
    from kombu.transport import TRANSPORT_ALIASES, virtual
    from kombu.utils.json import dumps, loads
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the environment
    raise ModuleNotFoundError(
        "objq_broker.kombu needs kombu (Celery's messaging library): "
        "pip install 'objq-broker[celery]'"
    ) from exc

from objq_broker.errors import (
    ConfigurationError,
    LeaseLost,
    QueueClosed,
    QueueError,
    QueueNotFound,
    StorageError,
    StorageUnavailable,
)
from objq_broker.kombu_exchanges import ExchangeTable
from objq_broker.kombu_options import TransportSettings
from objq_broker.queue import Delivery, Queue

log = logging.getLogger("objq_broker.kombu")

TRANSPORT_ALIASES.setdefault("objq", "objq_broker.kombu:Transport")

#: Why a message rejected without requeue is dead-lettered (kept with the dead letter).
REJECTED = "rejected by the consumer (requeue=False)"


class LeaseQoS(virtual.QoS):
    """Unacked messages are leases in the state, not only entries in this process's memory:
    settling a message settles its lease, and a lost process loses nothing."""

    channel: Channel

    def ack(self, delivery_tag: str) -> None:
        self.channel.settle(delivery_tag, "ack")
        super().ack(delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        self.channel.settle(delivery_tag, "requeue" if requeue else "dead")
        self._quick_ack(delivery_tag)  # not the base class's: it would publish a copy

    def restore_unacked(self) -> list[tuple[BaseException, Any]]:
        self._flush()
        self._delivered.clear()
        self.channel.release_held()
        return []


class Channel(virtual.Channel):
    """A kombu channel whose queues, messages and bindings live in the transport's store."""

    QoS = LeaseQoS
    supports_fanout = True
    connection: Transport

    def __init__(self, connection: Transport, **kwargs: Any) -> None:
        super().__init__(connection, **kwargs)
        self._held: dict[str, Delivery] = {}
        self._held_lock = threading.Lock()
        self._no_ack_queues: set[str] = set()
        self._auto_delete: set[str] = set()
        self._turn = 0

    @property
    def client(self) -> Queue:
        return self.connection.open_queue()

    @property
    def settings(self) -> TransportSettings:
        return self.connection.settings

    # --- queues ----------------------------------------------------------------------------

    def queue_declare(self, queue: str | None = None, passive: bool = False, **kwargs: Any) -> Any:
        declared = super().queue_declare(queue, passive, **kwargs)
        if kwargs.get("auto_delete"):
            self._auto_delete.add(declared.queue)
        return declared

    def _new_queue(self, queue: str, **kwargs: Any) -> None:
        self.connection.declare(queue)

    def _has_queue(self, queue: str, **kwargs: Any) -> bool:
        return queue in self.client.queues()

    def _size(self, queue: str) -> int:
        try:
            stats = self.client.stats(queue)
        except QueueNotFound:
            return 0
        return stats.ready + stats.delayed

    def _purge(self, queue: str) -> int:
        try:
            return self.client.purge(queue)
        except QueueNotFound:
            return 0

    def queue_delete(
        self, queue: str, if_unused: bool = False, if_empty: bool = False, **kwargs: Any
    ) -> None:
        if if_empty and self._size(queue):
            return
        self._delete(queue)

    def _delete(self, queue: str, *args: Any, **kwargs: Any) -> None:
        """Drop the queue, its messages and its bindings (in every process's view)."""
        self.state.queue_bindings_delete(queue)
        for exchange in self.state.exchanges.values():
            table = exchange.get("table", [])
            table[:] = [meta for meta in table if meta[2] != queue]
        self.connection.exchanges.unbind_queue(queue)
        self.connection.forget(queue)
        with contextlib.suppress(QueueNotFound):
            self.client.delete_queue(queue)

    # --- exchanges and bindings ------------------------------------------------------------

    def exchange_declare(  # noqa: PLR0917 (kombu's signature)
        self,
        exchange: str | None = None,
        type: str = "direct",
        durable: bool = False,
        auto_delete: bool = False,
        arguments: dict[str, Any] | None = None,
        nowait: bool = False,
        passive: bool = False,
    ) -> None:
        super().exchange_declare(
            exchange, type, durable, auto_delete, arguments, nowait=nowait, passive=passive
        )
        if exchange and not passive:
            self.connection.exchanges.declare(exchange, self.state.exchanges[exchange]["type"])

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str | None, queue: str) -> None:
        kind = self.state.exchanges[exchange]["type"]
        self.connection.exchanges.bind(exchange, kind, (routing_key, pattern, queue))

    def queue_unbind(
        self, queue: str, exchange: str | None = None, routing_key: str = "", *a: Any, **kw: Any
    ) -> None:
        super().queue_unbind(queue, exchange, routing_key, *a, **kw)
        if exchange:
            meta = self.typeof(exchange).prepare_bind(queue, exchange, routing_key, None)
            self.connection.exchanges.unbind(exchange, tuple(meta))

    def get_table(self, exchange: str) -> list[tuple[str, str | None, str]]:
        """Bindings made here and by every other process on the store."""
        local = self.state.exchanges.get(exchange, {}).get("table", [])
        shared = self.connection.exchanges.lookup(exchange)
        if shared is None:
            if exchange not in self.state.exchanges:
                raise KeyError(exchange)
            return list(local)
        merged = [tuple(meta) for meta in local]
        merged += [meta for meta in shared.bindings if meta not in merged]
        return merged

    def typeof(self, exchange: str, default: str = "direct") -> Any:
        if exchange not in self.state.exchanges:
            shared = self.connection.exchanges.lookup(exchange) if exchange else None
            if shared is not None:
                return self.exchange_types[shared.type]
        return super().typeof(exchange, default)

    def _put_fanout(self, exchange: str, message: dict[str, Any], routing_key: str, **kw: Any):  # type: ignore[no-untyped-def]
        """One copy to each queue bound to ``exchange`` now (read afresh: a broadcast must
        reach a worker that bound its queue a moment ago)."""
        shared = self.connection.exchanges.lookup(exchange, fresh=True)
        bindings = list(shared.bindings) if shared is not None else []
        bindings += self.state.exchanges.get(exchange, {}).get("table", [])
        kind = self.typeof(exchange)
        queues = sorted(kind.lookup(bindings, exchange, routing_key, None))
        if not queues:
            log.info("message to exchange %r (key %r) matched no queue", exchange, routing_key)
        self._put_many(queues, message)

    # --- producing -------------------------------------------------------------------------

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        self._put_many([queue], message)

    def _put_many(self, queues: Iterable[str], message: dict[str, Any]) -> None:
        payload = dumps(message).encode()
        priority = -self._get_message_priority(message)
        futures = [
            self.client.submit_enqueue(
                queue,
                [payload],
                priority=priority,
                max_attempts=self.settings.max_deliveries,
            )
            for queue in queues
        ]
        for future in futures:  # submitted together: usually one commit for all copies
            future.result()

    # --- consuming -------------------------------------------------------------------------

    def basic_consume(self, queue: str, no_ack: bool, *args: Any, **kwargs: Any) -> Any:
        if no_ack:
            self._no_ack_queues.add(queue)
        return super().basic_consume(queue, no_ack, *args, **kwargs)

    def basic_cancel(self, consumer_tag: str) -> Any:
        queue = self._tag_to_queue.get(consumer_tag)
        result = super().basic_cancel(consumer_tag)
        if queue is not None and queue not in self._active_queues:
            self._no_ack_queues.discard(queue)
            if queue in self._auto_delete:
                self._auto_delete.discard(queue)
                self.queue_delete(queue)
        return result

    def basic_get(self, queue: str, no_ack: bool = False, **kwargs: Any) -> Any:
        got = self._claim([queue], 1, no_ack={queue} if no_ack else set())
        if not got:
            return None
        message = self.Message(got[0][0], channel=self)
        if not no_ack:
            self.qos.append(message, message.delivery_tag)
        return message

    def _get(self, queue: str, timeout: float | None = None) -> dict[str, Any]:
        got = self._claim([queue], 1, no_ack=set())
        if not got:
            raise Empty()
        return got[0][0]

    def drain_events(self, timeout: float | None = None, callback: Any = None) -> None:
        """Claim a batch (up to what the prefetch limit allows) from the consumed queues in
        one commit, and deliver each message."""
        callback = callback or self.connection._deliver
        if not self._consumers or not self.qos.can_consume():
            raise Empty()
        self._get_many(self._active_queues, timeout, callback)

    def _get_many(self, queues: list[str], timeout: float | None = None, callback: Any = None):  # type: ignore[no-untyped-def]
        callback = callback or self.connection._deliver
        names = list(dict.fromkeys(queues))
        if not names:
            raise Empty()
        self._turn = (self._turn + 1) % len(names)
        names = names[self._turn :] + names[: self._turn]  # fair: each queue leads in turn
        budget = self.qos.can_consume_max_estimate() or self.settings.batch_size
        got = self._claim(names, min(budget, self.settings.batch_size), self._no_ack_queues)
        if not got:
            raise Empty()
        for index, (raw, queue) in enumerate(got):
            try:
                callback(raw, queue)
            except BaseException:
                # The rest were never handed over: give them back rather than hold them.
                self._release_tags([r["properties"]["delivery_tag"] for r, _ in got[index + 1 :]])
                raise

    def _claim(
        self, queues: list[str], n: int, no_ack: set[str]
    ) -> list[tuple[dict[str, Any], str]]:
        """Lease up to ``n`` messages; returns (raw kombu message, queue) pairs."""
        client = self.client
        lease = self.settings.visibility_timeout
        found = client.submit_claim_many(queues, max(n, 1), lease=lease).result()
        got: list[tuple[dict[str, Any], str]] = []
        now = time.time()
        for delivery in client.fill_deliveries(found):
            raw = loads(delivery.payload)
            props = raw.setdefault("properties", {})
            if _expired(props, delivery.job.enqueued_at, now):
                client.ack(delivery, wait=False)  # its producer gave it an expiration
                continue
            props["delivery_tag"] = delivery.token  # unique per delivery, unlike a publish tag
            info = props.setdefault("delivery_info", {})
            if delivery.job.attempts > 1:
                info["redelivered"] = raw["redelivered"] = True
            if delivery.job.queue in no_ack:
                client.ack(delivery, wait=False)
            else:
                with self._held_lock:
                    self._held[delivery.token] = delivery
            got.append((raw, delivery.job.queue))
        return got

    # --- settling --------------------------------------------------------------------------

    def held(self) -> list[Delivery]:
        with self._held_lock:
            return list(self._held.values())

    def settle(self, delivery_tag: str, how: str) -> None:
        """Ack, requeue or dead-letter one held delivery (returns once submitted)."""
        with self._held_lock:
            delivery = self._held.pop(delivery_tag, None)
        if delivery is None:
            log.debug("%s of %s: not held by this channel (already settled)", how, delivery_tag)
            return
        client = self.client
        if how == "ack":
            client.ack(delivery, wait=False)
        elif how == "requeue":
            client.nack(delivery, retry=True, delay=0, error="requeued", wait=False)
        else:
            client.nack(delivery, retry=False, error=REJECTED, wait=False)

    def _release_tags(self, tags: list[str]) -> None:
        with self._held_lock:
            found = [self._held.pop(tag) for tag in tags if tag in self._held]
        if found:
            self.client.release(found, wait=False)

    def release_held(self) -> None:
        """Give back every message this channel holds, unprocessed (no attempt counted)."""
        with self._held_lock:
            found = list(self._held.values())
            self._held.clear()
        if not found:
            return
        try:
            self.client.release(found)
        except (QueueClosed, StorageError, QueueError) as exc:
            # Their leases run out on their own: the messages come back after the timeout.
            log.warning("could not release %d held messages (%s); they return on expiry",
                        len(found), exc)  # fmt: skip

    def close(self) -> None:
        if not self.closed and self.connection is not None:
            try:
                super().close()
            finally:
                self.release_held()
        else:
            super().close()


def _expired(props: dict[str, Any], enqueued_at: float, now: float) -> bool:
    expiration = props.get("expiration")
    if expiration is None:
        return False
    try:
        return now >= enqueued_at + float(expiration) / 1000.0
    except (TypeError, ValueError):
        return False


class Transport(virtual.Transport):
    """kombu transport for objq; one :class:`~objq_broker.queue.Queue` per connection,
    shared by its channels, and one heartbeat thread for all the messages they hold."""

    Channel = Channel
    driver_type = "objq"
    driver_name = "objq"
    can_parse_url = True
    default_port = None
    implements = virtual.Transport.implements.extend(
        asynchronous=False,
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
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def default_connection_params(self) -> dict[str, Any]:
        return {"port": None, "hostname": None}

    def driver_version(self) -> str:
        from objq_broker import __version__

        return __version__

    def open_queue(self) -> Queue:
        with self._lock:
            if self.queue is None or self.queue.engine.closed:
                self.queue = Queue(self.settings.url, **self.settings.queue_options)
                self._exchanges = ExchangeTable(
                    self.queue.store, ttl_seconds=self.settings.bindings_ttl
                )
                self._declared.clear()
            return self.queue

    @property
    def exchanges(self) -> ExchangeTable:
        self.open_queue()
        assert self._exchanges is not None
        return self._exchanges

    def declare(self, queue: str) -> None:
        if queue in self._declared:
            return
        self.open_queue().declare(queue)
        self._declared.add(queue)

    def forget(self, queue: str) -> None:
        self._declared.discard(queue)

    def establish_connection(self) -> Transport:
        client = self.open_queue()
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
            self._stop.set()
            if self._beat is not None and self._beat is not threading.current_thread():
                self._beat.join(timeout=5)
            self._beat = None
            self._close_queue()

    def _close_queue(self) -> None:
        with self._lock:
            client, self.queue = self.queue, None
        if client is not None:
            client.close()

    # --- heartbeat -------------------------------------------------------------------------

    def _start_heartbeat(self) -> None:
        if self._beat is not None and self._beat.is_alive():
            return
        self._stop = threading.Event()
        self._beat = threading.Thread(
            target=self._heartbeat, args=(self._stop,), name="objq-kombu-heartbeat", daemon=True
        )
        self._beat.start()

    def held(self) -> list[Delivery]:
        channels = list(self.channels) + list(self._avail_channels)
        return [delivery for channel in channels for delivery in channel.held()]

    def _heartbeat(self, stop: threading.Event) -> None:
        while not stop.wait(self.settings.heartbeat_interval):
            held = self.held()
            client = self.queue
            if not held or client is None:
                continue
            try:
                alive = client.heartbeat(held, lease=self.settings.visibility_timeout)
            except (QueueClosed, LeaseLost):
                continue
            except Exception as exc:  # keep beating: the next one may reach the storage
                log.warning("heartbeat of %d held messages failed: %s", len(held), exc)
                continue
            still = {d.token for d in self.held()}
            lost = [d.id for d, ok in zip(held, alive or [], strict=False) if not ok]
            lost = [d.id for d in held if d.token in still and d.id in lost]
            if lost:
                log.warning("leases lost (expired before a heartbeat): %s", lost[:20])
