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

from objq_broker.consume.leases import heartbeat_every
from objq_broker.engine.options import ENGINE_OPTIONS, URL_ENV
from objq_broker.errors import ConfigurationError, redacted
from objq_broker.kombu.routing import DEFAULT_TABLE_TTL_SECONDS
from objq_broker.model.checks import MAX_SECONDS, Attempts, ClaimCount, PositiveSeconds, Seconds
from objq_broker.model.records import DEFAULT_LEASE_SECONDS
from objq_broker.model.settings import option_names, read_settings

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


class TransportOptions(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The ``transport_options`` this transport reads (the engine's are accepted too, and
    kombu's own :data:`KOMBU_OPTIONS` are left to kombu). Text is read as the environment's:
    ``"60"`` and ``"1m"`` are both a minute."""

    #: The storage URL, with ``broker_url = "objq://"``. Checked by :func:`_storage_url`.
    url: Any = None
    #: Seconds a delivered message stays leased without a heartbeat: how long a dead
    #: consumer's messages take to come back. Not a limit on task length (live consumers
    #: heartbeat). A queue's own lease by default, as for every client.
    visibility_timeout: PositiveSeconds = DEFAULT_LEASE_SECONDS
    #: How often a connection extends its leases (None: visibility_timeout / 3).
    heartbeat_interval: PositiveSeconds | None = None
    #: The longest an idle consumer waits between polls.
    polling_interval: PositiveSeconds = DEFAULT_POLLING_INTERVAL_SECONDS
    #: How old the cached state may be when a claim is served from it (the engine's setting,
    #: with a default of this transport's own).
    max_staleness_seconds: Seconds = DEFAULT_MAX_STALENESS_SECONDS
    #: Keyword options for the storage adapter (a dict; checked where it is read).
    store_options: Any = msgspec.field(default_factory=dict)
    #: Deliveries before a message is dead-lettered.
    max_deliveries: Attempts = DEFAULT_MAX_DELIVERIES
    #: Most messages one claim takes.
    batch_size: ClaimCount = DEFAULT_BATCH_SIZE
    #: Seconds a process trusts its cached copy of an exchange's bindings.
    bindings_ttl: PositiveSeconds = DEFAULT_TABLE_TTL_SECONDS


#: Options this transport reads.
OWN_OPTIONS = option_names(TransportOptions)
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
#: Engine options accepted as they are (see ``objq_broker.engine.options``); a test's clock
#: and seed have no place in a configuration file.
ACCEPTED_OPTIONS = OWN_OPTIONS | KOMBU_OPTIONS | (ENGINE_OPTIONS - {"clock", "seed"})
#: Broker URLs that name no storage (it then comes from ``transport_options["url"]``).
_BARE = ("", "objq://", "objq:///", "objq:")


@dataclass(frozen=True)
class TransportSettings:
    """What one kombu connection to objq uses, resolved from the broker URL and
    :class:`TransportOptions` (which declares the defaults)."""

    url: str
    visibility_timeout: float
    polling_interval: float
    heartbeat_interval: float
    max_deliveries: int
    batch_size: int
    bindings_ttl: float
    #: What the connection's ``Queue`` is opened with: storage and engine options.
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
        own = {k: v for k, v in options.items() if k in OWN_OPTIONS and v is not None}
        read = read_settings(TransportOptions, own, where="objq transport", lax=True)
        url = _storage_url(hostname, read.url)
        heartbeat = heartbeat_every(
            read.visibility_timeout,
            read.heartbeat_interval,
            "objq transport",
            ("visibility_timeout", "heartbeat_interval"),
        )
        if not isinstance(read.store_options, Mapping):
            raise ConfigurationError(
                f"objq transport: store_options must be a dict of storage adapter options, "
                f"found {read.store_options!r}"
            )
        engine = {k: v for k, v in options.items() if k in ENGINE_OPTIONS}
        engine["max_staleness_seconds"] = read.max_staleness_seconds
        return cls(
            url=url,
            visibility_timeout=read.visibility_timeout,
            polling_interval=read.polling_interval,
            heartbeat_interval=heartbeat,
            max_deliveries=read.max_deliveries,
            batch_size=read.batch_size,
            bindings_ttl=read.bindings_ttl,
            queue_options={**dict(read.store_options), **engine},
        )


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
