# mypy: disallow-untyped-calls=False
# (kombu is only partly annotated)
"""What a kombu channel of the objq transport declares: queues (in the state, with their
``x-expires``) and exchanges with their bindings (shared by every process on the store, see
:mod:`objq_broker.kombu.routing`), and the routing of a message by them.
:class:`~objq_broker.kombu.channel.Channel` publishes and consumes on top of this."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from kombu.transport import virtual
from kombu.transport.base import to_rabbitmq_queue_arguments

from objq_broker.errors import ConfigurationError, QueueNotFound
from objq_broker.kombu.settings import MAX_MILLISECONDS, TransportSettings
from objq_broker.queue import Queue

if TYPE_CHECKING:
    from objq_broker.kombu import Transport


class DeclaringChannel(virtual.Channel):
    """The declaring layer of :class:`~objq_broker.kombu.channel.Channel`."""

    connection: Transport

    def __init__(self, connection: Transport, **kwargs: Any) -> None:
        super().__init__(connection, **kwargs)
        self._auto_delete: set[str] = set()

    @property
    def client(self) -> Queue:
        return self.connection.shared_queue()

    @property
    def settings(self) -> TransportSettings:
        return self.connection.settings

    # --- queues ----------------------------------------------------------------------------

    def queue_declare(self, queue: str | None = None, passive: bool = False, **kwargs: Any) -> Any:
        declared = super().queue_declare(queue, passive, **kwargs)
        if kwargs.get("auto_delete"):
            self._auto_delete.add(declared.queue)
        return declared

    def prepare_queue_arguments(self, arguments: Any, **kwargs: Any) -> dict[str, Any]:
        """kombu's ``Queue(expires=...)`` (and message_ttl, ...) as AMQP arguments, so
        ``x-expires`` reaches :meth:`_new_queue` as it would reach RabbitMQ."""
        prepared: dict[str, Any] = to_rabbitmq_queue_arguments(arguments, **kwargs)
        return prepared

    def _new_queue(self, queue: str, **kwargs: Any) -> None:
        self.connection.declare(queue, _expires_seconds(queue, kwargs.get("arguments")))

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


def _expires_seconds(queue: str, arguments: Any) -> float | None:
    """The queue's ``x-expires`` (milliseconds, as AMQP has it) in seconds; None if unset."""
    raw = (arguments or {}).get("x-expires")
    if raw is None:
        return None
    number = isinstance(raw, int | float) and not isinstance(raw, bool)
    # At least one millisecond, as AMQP has it: a tinier positive value would underflow
    # to zero seconds. NaN compares false, so it is refused too.
    if not number or not 1 <= raw <= MAX_MILLISECONDS:
        raise ConfigurationError(
            f"queue {queue!r}: expected x-expires as a number of milliseconds from 1 "
            f"to {MAX_MILLISECONDS:.0f} (about a century), found {raw!r}"
        )
    return float(raw) / 1000.0
