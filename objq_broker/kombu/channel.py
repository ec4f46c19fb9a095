# mypy: disallow-untyped-calls=False
# (kombu is only partly annotated)
"""The kombu channel of the objq transport: publishing, consuming through a claim window
(:class:`~objq_broker.consume.ClaimWindow`), and a QoS whose unacked messages are leases in the
state (see :mod:`objq_broker.kombu`), on the layer that declares queues and exchanges
(:mod:`objq_broker.kombu.declaring`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Set
from concurrent.futures import Future
from queue import Empty
from typing import TYPE_CHECKING, Any

from kombu.transport import virtual
from kombu.utils.json import dumps, loads

from objq_broker import builders
from objq_broker.consume import ClaimWindow
from objq_broker.errors import QueueNotFound
from objq_broker.kombu.batch import BATCH_KEYWORD, Copies, PublishBatch
from objq_broker.kombu.declaring import DeclaringChannel
from objq_broker.kombu.outcomes import JOB_PROPERTY, QUEUE_PROPERTY, TOKEN_PROPERTY
from objq_broker.queue import Delivery

if TYPE_CHECKING:
    from objq_broker.kombu import Transport

log = logging.getLogger("objq_broker.kombu")
#: The message property a job's group is taken from: kombu's SQS transport reads the same one.
GROUP_PROPERTY = "MessageGroupId"

#: Why a message rejected without requeue is dead-lettered (kept with the dead letter).
REJECTED = "rejected by the consumer (requeue=False)"

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


class Channel(DeclaringChannel):
    """A kombu channel whose queues, messages and bindings live in the transport's store."""

    QoS = LeaseQoS
    supports_fanout = True
    connection: Transport

    def __init__(self, connection: Transport, **kwargs: Any) -> None:
        super().__init__(connection, **kwargs)
        self._no_ack_queues: set[str] = set()
        self._turn = 0
        # Every delivery this channel holds, claimed ahead or handed to kombu (made on first
        # use: a channel that never consumes opens nothing).
        self._window: ClaimWindow | None = None

    @property
    def window(self) -> ClaimWindow:
        """The claim window: claims ahead of the prefetch window (``basic_qos``), doubling up
        to ``batch_size`` under a backlog, given back when the window stays shut a second."""
        if self._window is None:
            self._window = ClaimWindow(
                self.client,
                self._claim_order,
                prefetch=self.qos.prefetch_count or None,
                max_window=self.settings.batch_size,
                lease_seconds=self.settings.visibility_timeout,
                on_claimed=self.connection.wake,  # the event loop hands the claim out
            )
        return self._window

    # --- producing -------------------------------------------------------------------------

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
        self._put_many(queues, message, kw.get(BATCH_KEYWORD))

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        self._put_many([queue], message, kwargs.get(BATCH_KEYWORD))

    def create_publish_batch(self, max_size: int) -> PublishBatch:
        """What ``Producer.batch()`` publishes through (kombu 5.7 on): see
        :mod:`objq_broker.kombu.batch`."""
        return PublishBatch(self, max_size)

    def _put_many(
        self, queues: Iterable[str], message: dict[str, Any], batch: PublishBatch | None
    ) -> None:
        """One copy of ``message`` to each queue: committed now, or held by ``batch``."""
        copies = self._copies(queues, message)
        if batch is not None:
            batch.hold(copies)
        else:
            self.commit_copies([copies])

    def _copies(self, queues: Iterable[str], message: dict[str, Any]) -> Copies:
        """The enqueue of ``message`` to each of ``queues``."""
        payload = dumps(message).encode()
        priority = -self._get_message_priority(message)
        properties = message.get("properties", {})
        routed = bool(properties.get("delivery_info", {}).get("exchange"))
        # The property kombu's SQS transport sends as the message group: a Celery task sent
        # with apply_async(..., MessageGroupId="tenant-42") names its tenant the same way here.
        group = properties.get(GROUP_PROPERTY)
        names = list(queues)
        ops = [
            builders.enqueue(
                queue,
                [payload],
                priority=priority,
                max_attempts=self.settings.max_deliveries,
                to_declared=routed,
                group=None if group is None else str(group),
            )
            for queue in names
        ]
        return names, ops

    def commit_copies(self, messages: list[Copies]) -> None:
        """Commit the copies of ``messages`` together (usually one commit) and wait for all.

        A message routed through an exchange goes only to queues that exist: a binding that
        outlived its queue (deleted, or expired after its consumer was killed) must not bring
        the queue back to gather messages for ever. Such a binding is removed here. Sent to a
        queue by name, a message declares it."""
        names = [name for queues, _ in messages for name in queues]
        ops = [op for _, ops in messages for op in ops]
        if not ops:
            return  # routed to no queue (an event with nobody listening): nothing to commit
        if len(ops) == 1:
            # The caller commits it (or sends it to the broker) itself when nothing else is
            # pending: a hand-off to the writer thread and back would cost two thread switches.
            stored = [self.client.core.call(ops[0])]
        else:
            stored = _all_settled(self.client.submit_many(ops))
        gone = [name for name, jobs in zip(names, stored, strict=True) if not jobs]
        if gone:
            log.info("dropped a message routed to removed queue(s) %s; unbinding them", gone)
            self.connection.exchanges.unbind_queues(sorted(set(gone)))

    def _get_message_priority(self, message: dict[str, Any], reverse: bool = False) -> int:
        """kombu's reading of a message's priority: a number clamped into 0-9 (``300`` is 9,
        ``-3`` is 0, ``1.5`` is 1, ``True`` is 1), the default (0) when it is missing or not a
        number (``None``, ``"high"``, NaN), as kombu's Redis, MongoDB and ZooKeeper transports
        read it. kombu's own raises ``OverflowError`` on an infinite one; here it is clamped
        like any other."""
        try:
            priority: int = super()._get_message_priority(message, reverse)
        except OverflowError:
            infinite = message["properties"]["priority"]
            clamped = self.max_priority if infinite > 0 else self.min_priority
            priority = self.max_priority - clamped if reverse else clamped
        return priority

    # --- consuming -------------------------------------------------------------------------

    def basic_consume(self, queue: str, no_ack: bool, *args: Any, **kwargs: Any) -> Any:
        if no_ack:
            self._no_ack_queues.add(queue)
        result = super().basic_consume(queue, no_ack, *args, **kwargs)
        self.window.look_again()  # a new queue may have messages: look now, not at the next poll
        self.connection.wake()
        return result

    def basic_qos(self, *args: Any, **kwargs: Any) -> Any:
        result = super().basic_qos(*args, **kwargs)
        self.window.prefetch = self.qos.prefetch_count or None
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
        got = self._claim([queue], 1, no_ack=set())
        if not got:
            raise Empty()
        return got[0][0]

    def drain_events(self, timeout: float | None = None, callback: Any = None) -> None:
        """Deliver a batch of claimed messages (up to what the prefetch limit allows), from
        the claim window or from one claim over the consumed queues."""
        callback = callback or self.connection._deliver
        if not self._consumers:
            raise Empty()
        if not self.qos.can_consume():
            self.window.poll(0)  # claims ahead, or gives back what waited a second for room
            # kombu sleeps a whole polling interval after Empty; the prefetch window usually
            # opens within milliseconds (a task finished), so wait for that here instead.
            self.window.wait(self.qos.can_consume, self.settings.polling_interval)
            if not self.qos.can_consume():
                raise Empty()
        self._get_many(self._active_queues, timeout, callback)

    def _get_many(self, queues: list[str], timeout: float | None = None, callback: Any = None):  # type: ignore[no-untyped-def]
        callback = callback or self.connection._deliver
        names = self._in_turn(queues)
        if not names:
            raise Empty()
        budget = self.qos.can_consume_max_estimate() or self.settings.batch_size
        try:
            if self._no_ack_queues.intersection(names):
                # Messages of a no-ack queue are settled when claimed: never claim them ahead.
                no_ack = self._no_ack_queues
                got = self._claim(names, min(budget, self.settings.batch_size), no_ack)
            else:
                got = self._accept(self.window.take(budget, timeout=0, queues=names), set())
        except QueueNotFound:
            if not self._revived(self.riders()):
                raise
            raise Empty() from None
        if not got:
            raise Empty()
        for index, (raw, queue) in enumerate(got):
            try:
                callback(raw, queue)
            except BaseException:
                # The rest were never handed over: give them back rather than hold them.
                self._release_tags([r["properties"]["delivery_tag"] for r, _ in got[index + 1 :]])
                raise

    def _revived(self, riders: Iterable[str]) -> bool:
        """After a claim was refused for a queue not declared: whether the queues it named
        that expired under their consumers here were declared again
        (:meth:`Transport.revive`), so the next claim goes through."""
        return self.connection.revive([*riders, *self._active_queues])

    def _in_turn(self, queues: Iterable[str]) -> list[str]:
        """The queues, each leading in turn (a claim takes the first queue's messages first)."""
        names = list(dict.fromkeys(queues))
        if names:
            self._turn = (self._turn + 1) % len(names)
            names = names[self._turn :] + names[: self._turn]
        return names

    def _claim_order(self) -> list[str]:
        """This channel's queues in turn, after the no-ack queues its connection's other
        channels consume (see :meth:`riders`)."""
        own = self._in_turn(self._active_queues)
        return [*(q for q in self.riders() if q not in own), *own]

    def consumed_without_ack(self) -> set[str]:
        """This channel's no-ack queues that it consumes now."""
        return self._no_ack_queues.intersection(self._active_queues)

    def riders(self) -> frozenset[str]:
        """The no-ack queues consumed on this channel's connection, which its claims take
        from too, first. Celery's remote control (a revoke, a broadcast) and its events come
        on no-ack queues of their own channels; a claim of the task queue that finds a task
        also finds any such message sent before it (both are read from one state), so the
        worker sees the control message first, as on a broker that pushes messages in the
        order they were sent. They are settled when handed out and counted against no
        prefetch window, so riding along costs a queue name in the claim and nothing else."""
        return self.connection.no_ack_queues() if self.connection is not None else frozenset()

    def _claim(self, queues: list[str], n: int, no_ack: set[str]) -> list[_Raw]:
        """Lease up to ``n`` messages now, outside the window; (raw kombu message, queue)."""
        # In the order given: control queues first, then this channel's own in turn.
        claim = self.client.submit_claim(
            queues, max(n, 1), lease=self.settings.visibility_timeout, ordered=True
        )
        found = self.client.then_fill(claim).result()
        self.window.hold(found)
        return self._accept(found, no_ack)

    def _accept(self, found: list[Delivery], no_ack: Set[str]) -> list[_Raw]:
        """Turn held deliveries, their payloads loaded, into kombu messages; settles those
        that expired on the way and those of ``no_ack`` queues."""
        got: list[_Raw] = []
        now = time.time()
        for delivery in found:
            raw = loads(delivery.payload)
            props = raw.setdefault("properties", {})
            if _expired(props, delivery.job.enqueued_at, now):
                self.settle(delivery.token, "ack")  # its producer gave it an expiration
                continue
            props["delivery_tag"] = delivery.token  # unique per delivery, unlike a publish tag
            # Which job this is, for the task's outcome (see objq_broker.kombu.outcomes).
            props[JOB_PROPERTY], props[QUEUE_PROPERTY] = delivery.job.id, delivery.job.queue
            props[TOKEN_PROPERTY] = delivery.token  # the lease its note must show
            info = props.setdefault("delivery_info", {})
            if delivery.job.attempts > 1:
                info["redelivered"] = raw["redelivered"] = True
            if delivery.job.queue in no_ack:
                self.settle(delivery.token, "ack")  # settled on delivery, as no_ack asks
            got.append((raw, delivery.job.queue))
        return got

    # --- evented delivery (kombu's Hub, see objq_broker.kombu.events) ---------------------

    def collect(self, poll: bool, riders: frozenset[str]) -> list[Delivery]:
        """Claimed messages the consumers can take now (as far as the prefetch window allows;
        ``riders``, this connection's :meth:`riders`, whatever it allows), in the order
        claimed; keeps one claim in flight while they can take more. Never blocks. ``poll``:
        the loop's timer called, so an empty queue is claimed from again. Hand them out with
        :meth:`hand_out`."""
        if self.closed or not self._consumers:
            return []
        window = self.window
        if poll:
            window.look_again()
        room = self.qos.can_consume_max_estimate() if self.qos.can_consume() else 0
        try:
            # (with the window shut: gives back a hoard)
            return window.poll(room, unmetered=riders)
        except QueueNotFound:
            if not self._revived(riders):
                raise
            return []

    def hand_out(self, delivery: Delivery, riders: frozenset[str]) -> None:
        """Deliver one collected message to its consumer's callback (a rider, one of
        ``riders``, to the consumer on its own channel); give it back if that consumer was
        cancelled since the claim."""
        queue = delivery.job.queue
        callback = self.connection._callbacks.get(queue)
        if callback is None or (queue not in self._active_queues and queue not in riders):
            self._release_tags([delivery.token])
            return
        for raw, _ in self._accept([delivery], self._no_ack_queues | riders):
            callback(raw)

    def give_back(self, deliveries: Iterable[Delivery]) -> None:
        """Release collected messages that were not handed out."""
        self._release_tags([d.token for d in deliveries])

    # --- settling --------------------------------------------------------------------------

    def held(self) -> list[Delivery]:
        return [] if self._window is None else self._window.held()

    def settle(self, delivery_tag: str, how: str) -> None:
        """Ack, requeue or dead-letter one held delivery (returns once submitted)."""
        delivery = None if self._window is None else self._window.settle(delivery_tag)
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
        if self._window is not None:
            self._window.notify()
        if self.connection is not None:
            self.connection.wake()

    def drop(self, tokens: Set[str]) -> None:
        """Stop holding deliveries whose leases were lost (another consumer may have them)."""
        if self._window is not None:
            self._window.drop(tokens)

    def _release_tags(self, tags: list[str]) -> None:
        if self._window is not None and tags:
            self._window.give_back(tags)

    def release_held(self) -> None:
        """Give back every message this channel holds, unprocessed (no attempt counted); if
        that fails, their leases run out and they come back after the visibility timeout."""
        if self._window is not None:
            self._window.release_held()

    def close(self) -> None:
        if not self.closed and self.connection is not None:
            try:
                super().close()
            finally:
                if self._window is not None:
                    self._window.close()
                self.release_held()
        else:
            super().close()


def _all_settled(futures: list[Future[Any]]) -> list[Any]:
    """The results of ``futures`` once every one is settled: a copy that fails fails alone,
    the others are committed, and the first failure is raised after all of them."""
    results: list[Any] = []
    failures: list[BaseException] = []
    for future in futures:
        try:
            results.append(future.result())
        except Exception as exc:
            failures.append(exc)
    if failures:
        log.error(
            "%d of %d message copies could not be published; the others were",
            len(failures),
            len(futures),
        )
        raise failures[0]
    return results


def _expired(props: dict[str, Any], enqueued_at: float, now: float) -> bool:
    expiration = props.get("expiration")
    if expiration is None:
        return False
    try:
        return now >= enqueued_at + float(expiration) / 1000.0
    except (TypeError, ValueError):
        return False
