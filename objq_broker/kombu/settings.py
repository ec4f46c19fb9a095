"""The kombu transport's settings: the broker URL forms and ``transport_options``.

No kombu import here: the values come in as plain strings and dicts, and every refusal is a
:class:`~objq_broker.errors.ConfigurationError` that lists what is accepted. The numbers are
refused when the connection is made if a claim or the state would refuse them later (a
``visibility_timeout`` beyond a century, a ``batch_size`` beyond one claim's limit).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from objq_broker.consume import option_count, option_seconds
from objq_broker.engine.options import ENGINE_OPTIONS, URL_ENV
from objq_broker.errors import ConfigurationError, redacted
from objq_broker.kombu.routing import DEFAULT_TABLE_TTL_SECONDS
from objq_broker.model.checks import MAX_SECONDS, Attempts, ClaimCount, PositiveSeconds, checked

#: Seconds a delivered message stays leased without a heartbeat: how long a dead consumer's
#: messages take to come back. Not a limit on task length (live consumers heartbeat).
DEFAULT_VISIBILITY_TIMEOUT_SECONDS = 60.0
#: Seconds an idle consumer waits between polls of the store (each poll is one state read).
#: Right after work it polls sooner (see ``objq_broker.kombu.events``). Idle, it reads as often
#: as it did when its polls every 0.2 s were served from a cache up to 0.2 s old: every other
#: one read.
DEFAULT_POLLING_INTERVAL_SECONDS = 0.4
#: How old the engine's cached state may be when a claim is served from it. The engine's own
#: default (0.2 s) saves reads for scripts; a worker's poll must read, or a message sent by
#: another process waits out the cache (the whole round trip of ``delay().get()`` took ~260 ms
#: on file://; ~20 ms with this). Polls are paced, so this costs at most one read per poll.
DEFAULT_MAX_STALENESS_SECONDS = 0.005
#: Most messages one poll claims when the consumer sets no prefetch limit.
DEFAULT_BATCH_SIZE = 100
#: Deliveries (expired leases and requeues) before a message is dead-lettered.
DEFAULT_MAX_DELIVERIES = 20

#: Longest span of time a message or queue property may give, in milliseconds (AMQP's unit;
#: objq's bound on any span of time, about a century).
MAX_MILLISECONDS = MAX_SECONDS * 1000.0

#: Options this transport reads.
OWN_OPTIONS = frozenset(
    {
        "url",
        "visibility_timeout",
        "polling_interval",
        "heartbeat_interval",
        "store_options",
        "max_deliveries",
        "batch_size",
        "bindings_ttl",
    }
)
#: Options kombu itself reads from ``transport_options`` (connection retries, body encoding).
KOMBU_OPTIONS = frozenset(
    {
        "max_retries",
        "interval_start",
        "interval_step",
        "interval_max",
        "connect_retries_timeout",
        "body_encoding",
        "deadletter_queue",
    }
)
#: Engine options accepted as they are (see ``objq_broker.engine.options``).
ACCEPTED_OPTIONS = OWN_OPTIONS | KOMBU_OPTIONS | (ENGINE_OPTIONS - {"clock", "seed"})
#: Broker URLs that name no storage (it then comes from ``transport_options["url"]``).
_BARE = ("", "objq://", "objq:///", "objq:")


class _Numbers(msgspec.Struct):
    """The numeric settings within what a claim and the state accept."""

    visibility_timeout: PositiveSeconds
    polling_interval: PositiveSeconds
    heartbeat_interval: PositiveSeconds
    max_deliveries: Attempts
    batch_size: ClaimCount
    bindings_ttl: PositiveSeconds


@dataclass(frozen=True)
class TransportSettings:
    """What one kombu connection to objq uses; built from the broker URL and options."""

    url: str
    visibility_timeout: float = DEFAULT_VISIBILITY_TIMEOUT_SECONDS
    polling_interval: float = DEFAULT_POLLING_INTERVAL_SECONDS
    heartbeat_interval: float = DEFAULT_VISIBILITY_TIMEOUT_SECONDS / 3.0
    max_deliveries: int = DEFAULT_MAX_DELIVERIES
    batch_size: int = DEFAULT_BATCH_SIZE
    bindings_ttl: float = DEFAULT_TABLE_TTL_SECONDS
    queue_options: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:  # the options may hold credentials: show only their names
        return (
            f"TransportSettings(url={redacted(self.url)!r}, "
            f"visibility_timeout={self.visibility_timeout}, "
            f"options={sorted(self.queue_options)})"
        )

    @classmethod
    def from_connection(
        cls, hostname: str | None, options: Mapping[str, Any] | None
    ) -> TransportSettings:
        options = dict(options or {})
        unknown = sorted(set(options) - ACCEPTED_OPTIONS)
        if unknown:
            raise ConfigurationError(
                f"objq transport: unknown broker_transport_options {unknown}; "
                f"accepted: {sorted(ACCEPTED_OPTIONS)}"
            )
        url = _storage_url(hostname, options.get("url"))
        where = "objq transport"
        visibility = option_seconds(
            options, "visibility_timeout", DEFAULT_VISIBILITY_TIMEOUT_SECONDS, where=where
        )
        heartbeat = option_seconds(options, "heartbeat_interval", visibility / 3.0, where=where)
        if heartbeat >= visibility:
            raise ConfigurationError(
                f"objq transport: heartbeat_interval must be shorter than visibility_timeout "
                f"({visibility} s), found {heartbeat}"
            )
        store_options = options.get("store_options") or {}
        if not isinstance(store_options, Mapping):
            raise ConfigurationError(
                f"objq transport: store_options must be a dict of storage adapter options, "
                f"found {store_options!r}"
            )
        engine = {"max_staleness_seconds": DEFAULT_MAX_STALENESS_SECONDS}
        engine.update((k, v) for k, v in options.items() if k in ENGINE_OPTIONS)
        numbers = {
            "visibility_timeout": visibility,
            "polling_interval": option_seconds(
                options, "polling_interval", DEFAULT_POLLING_INTERVAL_SECONDS, where=where
            ),
            "heartbeat_interval": heartbeat,
            "max_deliveries": option_count(
                options, "max_deliveries", DEFAULT_MAX_DELIVERIES, where=where
            ),
            "batch_size": option_count(options, "batch_size", DEFAULT_BATCH_SIZE, where=where),
            "bindings_ttl": option_seconds(
                options, "bindings_ttl", DEFAULT_TABLE_TTL_SECONDS, where=where
            ),
        }
        checks = msgspec.structs.asdict(checked(numbers, _Numbers, where))
        return cls(url=url, queue_options={**dict(store_options), **engine}, **checks)


def _storage_url(hostname: str | None, option: object) -> str:
    """The storage URL from the broker URL (``objq+file:///...`` arrives as ``file:///...``)
    or from ``transport_options["url"]``, never both; ``$OBJQ_URL`` when neither."""
    given = (hostname or "").strip()
    in_url = None if given in _BARE else given
    if in_url is not None and (in_url.startswith("objq://") or "://" not in in_url):
        raise ConfigurationError(
            f"objq transport: broker URL {given!r} names no storage; expected "
            "objq+<storage URL> (objq+file:///var/lib/objq, objq+s3://bucket/prefix, "
            "objq+gs://bucket/prefix, objq+memory://name) or objq:// with "
            'broker_transport_options={"url": "<storage URL>"}'
        )
    if option is not None and not isinstance(option, str):
        raise ConfigurationError(
            f"objq transport: transport option url must be a storage URL string, found {option!r}"
        )
    if in_url is not None and option:
        raise ConfigurationError(
            f"objq transport: got a storage URL both in the broker URL ({in_url!r}) and in "
            f"broker_transport_options['url'] ({option!r}); give it in one place"
        )
    url = in_url or option or os.environ.get(URL_ENV)
    if not url:
        raise ConfigurationError(
            "objq transport: no storage URL; expected a broker URL objq+<storage URL> "
            "(objq+file:///var/lib/objq, objq+s3://bucket/prefix, ...), or objq:// with "
            f'broker_transport_options={{"url": ...}}, or ${URL_ENV}'
        )
    return url
