# mypy: disallow-untyped-calls=False
# (kombu is only partly annotated)
"""The kombu channel of the objq transport: queues, publishing, batched claims, and a QoS whose
unacked messages are leases in the state (see :mod:`objq_broker.kombu`)."""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from queue import Empty
from typing import TYPE_CHECKING, Any

from kombu.transport import virtual
from kombu.utils.json import dumps, loads

from objq_broker import ops
from objq_broker.errors import QueueClosed, QueueError, QueueNotFound, StorageError
from objq_broker.kombu.settings import TransportSettings
from objq_broker.queue import Delivery, Queue

if TYPE_CHECKING:
    from objq_broker.kombu import Transport

log = logging.getLogger("objq_broker.kombu")

#: Why a message rejected without requeue is dead-lettered (kept with the dead letter).
REJECTED = "rejected by the consumer (requeue=False)"
#: Claimed messages that wait this long for the prefetch window to open are given back.
HOARD_SECONDS = 1.0

_Raw = tuple[dict[str, Any], str]  # (kombu message, queue)


class LeaseQoS(virtual.QoS):
    """Unacked messages are leases in the state, not only entries in this process's memory:
    settling a message settles its lease, and a lost process loses nothing."""

    channel: Channel

    def ack(self, delivery_tag: str) -> None:
        self.channel.settle(delivery_tag, "ack")
        super().ack(delivery_tag)
        self.channel.window_opened()

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        self.channel.settle(delivery_tag, "requeue" if requeue else "dead")
        self._quick_ack(delivery_tag)  # not the base class's: it would publish a copy
        self.channel.window_opened()

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
        # Messages claimed ahead of the prefetch window (leases, heartbeated like the rest),
        # and a claim submitted while they are handed out, so it commits with their acks.
        self._cache: collections.deque[_Raw] = collections.deque()
        self._ahead: Future[list[Delivery]] | None = None
        self._ahead_size = 0
        self._window = 0  # how many to claim at once; starts at the prefetch window
        self._taken_at = 0.0  # when a cached message was last delivered (or the cache filled)
        self._settled = threading.Condition()  # notified when a message is acked or rejected
        self._found_none = False  # the last claim came back empty: evented claims wait a poll

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

    def _lookup(self, exchange: str, routing_key: str, default: Any = None) -> Any:
        """Route with the cached bindings; when they match no queue, read them afresh first:
        a queue bound by another process a moment ago (a reply queue of ``celery inspect``,
        say) must not lose the message to a cache that predates its binding."""
        if exchange:
            routes = self._routes(exchange, routing_key)
            if routes:
                return routes  # routed: the usual case costs one lookup, not two
            self.connection.exchanges.lookup(exchange, fresh=True)
        return super()._lookup(exchange, routing_key, default)

    def _routes(self, exchange: str, routing_key: str) -> list[str]:
        try:
            table = self.get_table(exchange)
            return list(self.typeof(exchange).lookup(table, exchange, routing_key, None))
        except KeyError:
            return []

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
            self.client.submit(
                ops.enqueue(
                    queue, [payload], priority=priority, max_attempts=self.settings.max_deliveries
                )
            )
            for queue in queues
        ]
        for future in futures:  # submitted together: usually one commit for all copies
            future.result()

    # --- consuming -------------------------------------------------------------------------

    def basic_consume(self, queue: str, no_ack: bool, *args: Any, **kwargs: Any) -> Any:
        if no_ack:
            self._no_ack_queues.add(queue)
        result = super().basic_consume(queue, no_ack, *args, **kwargs)
        self._found_none = False  # a new queue may have messages: look now, not at the next poll
        self.connection.wake()
        return result

    def basic_qos(self, *args: Any, **kwargs: Any) -> Any:
        result = super().basic_qos(*args, **kwargs)
        self.connection.wake()  # a larger prefetch window may take cached messages now
        return result

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
        for index, (raw, name) in enumerate(self._cache):
            if name == queue:
                del self._cache[index]
                return raw
        got = self._claim([queue], 1, no_ack=set())
        if not got:
            raise Empty()
        return got[0][0]

    def drain_events(self, timeout: float | None = None, callback: Any = None) -> None:
        """Claim a batch (up to what the prefetch limit allows) from the consumed queues in
        one commit, and deliver each message."""
        callback = callback or self.connection._deliver
        if not self._consumers:
            raise Empty()
        if not self.qos.can_consume():
            if self._cache and time.monotonic() - self._taken_at >= HOARD_SECONDS:
                self._give_back_cache()
            # kombu sleeps a whole polling interval after Empty; the prefetch window usually
            # opens within milliseconds (a task finished), so wait for that here instead.
            with self._settled:
                self._settled.wait_for(self.qos.can_consume, self.settings.polling_interval)
            if not self.qos.can_consume():
                raise Empty()
        self._get_many(self._active_queues, timeout, callback)

    def _get_many(self, queues: list[str], timeout: float | None = None, callback: Any = None):  # type: ignore[no-untyped-def]
        callback = callback or self.connection._deliver
        names = self._in_turn(queues)
        if not names:
            raise Empty()
        budget = self.qos.can_consume_max_estimate() or self.settings.batch_size
        if self._no_ack_queues.intersection(names):
            # Messages of a no-ack queue are settled when claimed: never claim them ahead.
            got = self._claim(names, min(budget, self.settings.batch_size), self._no_ack_queues)
        else:
            got = self._take_ahead(names, budget)
        if not got:
            raise Empty()
        for index, (raw, queue) in enumerate(got):
            try:
                callback(raw, queue)
            except BaseException:
                # The rest were never handed over: give them back rather than hold them.
                self._release_tags([r["properties"]["delivery_tag"] for r, _ in got[index + 1 :]])
                raise

    def _in_turn(self, queues: Iterable[str]) -> list[str]:
        """The queues, each leading in turn (a claim takes the first queue's messages first)."""
        names = list(dict.fromkeys(queues))
        if names:
            self._turn = (self._turn + 1) % len(names)
            names = names[self._turn :] + names[: self._turn]
        return names

    def _take_ahead(self, names: list[str], budget: int) -> list[_Raw]:
        """Up to ``budget`` messages (what the prefetch window allows now), from messages
        claimed ahead. Claims are as large as the window (Celery's prefetch) to start with,
        and double while a full batch is gone before the next one commits (a backlog of short
        tasks), so one commit carries many messages and their acks; messages that wait over a
        second for the window to open are given back for other workers."""
        if not self._window:
            self._window = min(max(budget, 1), self.settings.batch_size)
        self._harvest(0.0)
        if not self._cache:
            self._submit_ahead(names)
            self._harvest(None)  # nothing to hand out: wait for the claim
        got = [self._cache.popleft() for _ in range(min(budget, len(self._cache)))]
        if got:
            self._taken_at = time.monotonic()
        if self._cache and len(self._cache) < self._window // 2:
            # Messages left over mean a backlog: claim the next batch now, so it commits
            # together with the acks of these.
            self._submit_ahead(names)
        return got

    def _submit_ahead(self, names: list[str]) -> None:
        if self._ahead is None:
            self._ahead_size = self._window
            lease = self.settings.visibility_timeout
            claim = self.client.submit_claim(names, self._window, lease=lease)
            self._ahead = self.client.then_fill(claim)  # payloads read off this thread
            self._ahead.add_done_callback(self._claim_done)

    def _claim_done(self, _: Future[list[Delivery]]) -> None:
        self.connection.wake()  # on the engine's writer thread: the event loop takes it over

    def _harvest(self, timeout: float | None) -> None:
        """Cache the claim submitted ahead once it has committed."""
        ahead = self._ahead
        if ahead is None:
            return
        try:
            found = ahead.result(timeout)
        except FutureTimeout:
            return
        finally:
            if ahead.done():
                self._ahead = None
        starved = not self._cache
        self._found_none = not found
        got = self._accept(found, no_ack=set())
        if starved and len(found) >= self._ahead_size:
            self._window = min(self._window * 2, self.settings.batch_size)
        if starved:
            self._taken_at = time.monotonic()
        self._cache.extend(got)

    def _give_back_cache(self) -> None:
        """The prefetch window stayed shut: release what was claimed ahead of it."""
        cached = list(self._cache)
        self._cache.clear()
        self._window = min(max(self.qos.prefetch_count or 1, 1), self.settings.batch_size)
        self._taken_at = time.monotonic()
        self._release_tags([raw["properties"]["delivery_tag"] for raw, _ in cached])

    def _claim(self, queues: list[str], n: int, no_ack: set[str]) -> list[_Raw]:
        """Lease up to ``n`` messages now; returns (raw kombu message, queue) pairs."""
        lease = self.settings.visibility_timeout
        claim = self.client.submit_claim(queues, max(n, 1), lease=lease)
        return self._accept(self.client.then_fill(claim).result(), no_ack)

    def _accept(self, found: list[Delivery], no_ack: set[str]) -> list[_Raw]:
        """Turn claimed deliveries, their payloads loaded (``Queue.then_fill``), into kombu
        messages held by this channel."""
        client = self.client
        got: list[_Raw] = []
        now = time.time()
        for delivery in found:
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

    # --- evented delivery (kombu's Hub, see objq_broker.kombu.events) ---------------------

    def pump(self, poll: bool) -> None:
        """Hand claimed messages to the consumers as far as the prefetch window allows, and
        keep one claim in flight while they can take more; never blocks. ``poll``: the loop's
        timer called, so an empty queue is claimed from again."""
        if self.closed or not self._consumers:
            return
        if poll:
            self._found_none = False
        self._harvest(0.0)
        self._hand_out()
        if self._cache and not self.qos.can_consume():
            if time.monotonic() - self._taken_at >= HOARD_SECONDS:
                self._give_back_cache()
            return
        if self._found_none or self._ahead is not None or not self.qos.can_consume():
            return  # (a shut window with nothing cached: the next ack wakes this up)
        if not self._window:
            budget = self.qos.can_consume_max_estimate() or self.settings.batch_size
            self._window = min(max(budget, 1), self.settings.batch_size)
        if not self._cache or len(self._cache) < self._window // 2:
            self._submit_ahead(self._in_turn(self._active_queues))

    def _hand_out(self) -> None:
        """Deliver cached messages while the prefetch window is open."""
        callbacks = self.connection._callbacks
        orphans: list[str] = []
        while self._cache and self.qos.can_consume():
            raw, queue = self._cache.popleft()
            tag = raw["properties"]["delivery_tag"]
            if queue not in callbacks or queue not in self._active_queues:
                orphans.append(tag)  # its consumer was cancelled after the claim
                continue
            if queue in self._no_ack_queues:
                self.settle(tag, "ack")  # settled on delivery, as no_ack asks
            self._taken_at = time.monotonic()
            callbacks[queue](raw)
        if orphans:
            self._release_tags(orphans)

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

    def window_opened(self) -> None:
        with self._settled:
            self._settled.notify_all()
        self.connection.wake()

    def drop(self, tokens: set[str]) -> None:
        """Stop holding deliveries whose leases were lost (another consumer may have them)."""
        with self._held_lock:
            for token in tokens:
                self._held.pop(token, None)
        kept = [e for e in self._cache if e[0]["properties"]["delivery_tag"] not in tokens]
        if len(kept) != len(self._cache):
            self._cache = collections.deque(kept)

    def _release_tags(self, tags: list[str]) -> None:
        with self._held_lock:
            found = [self._held.pop(tag) for tag in tags if tag in self._held]
        if found:
            self.client.release(found, wait=False)

    def release_held(self) -> None:
        """Give back every message this channel holds, unprocessed (no attempt counted)."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            with contextlib.suppress(Exception):  # a failed claim holds nothing
                self._accept(ahead.result(self.client.commit_deadline_seconds), set())
        self._cache.clear()
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
