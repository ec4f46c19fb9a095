"""Dramatiq's result backend and rate-limiter backend on objq's storage: no Redis, no Memcached.

>>> import dramatiq
>>> from dramatiq.results import Results
>>> from objq_broker.dramatiq import ObjqBroker, ObjqResultBackend
>>> broker = ObjqBroker(url="memory://results-doc")
>>> broker.add_middleware(Results(backend=ObjqResultBackend(url="memory://results-doc")))

Both backends keep their objects in the same store as the queue (or any other), under their own
prefix, through :class:`~objq_broker.results.store.ResultStore`: never in the queue's
state object, and never through the queue's commit loop.

* :class:`ObjqResultBackend` writes each result as one object, ``results/<message key>``, that
  expires after the result's TTL. A blocking get waits through :meth:`ResultStore.wait`: a
  result stored by this process wakes it at once, others are found by reading again at pauses
  growing from a few milliseconds to ``poll_seconds``.
* :class:`ObjqRateLimiterBackend` keeps counters. Every change is one compare-and-set update of
  one object, so concurrent processes never lose one. The counters of one limiter share an
  object (see :func:`limiter_of`), which is what makes ``incr_and_sum`` atomic.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import quote

import dramatiq
import msgspec
from dramatiq.encoder import Encoder
from dramatiq.rate_limits import RateLimiterBackend
from dramatiq.results import Missing, ResultBackend, ResultMissing, ResultTimeout
from dramatiq.results.backend import DEFAULT_TIMEOUT

from objq_broker.errors import ConfigurationError, StateCorrupt
from objq_broker.model.checks import UNDECODABLE
from objq_broker.results.store import ResultStore
from objq_broker.storage import ObjectStore, open_store

#: Where results live in the store, unless told otherwise.
DEFAULT_RESULTS_PREFIX = "results/"
#: Where rate-limiter counters live in the store, unless told otherwise.
DEFAULT_RATE_LIMITS_PREFIX = "rate-limits/"
#: Longest pause between two reads while waiting for another process (seconds).
DEFAULT_POLL_SECONDS = 0.5
#: Extra life given to a counters object beyond its longest-lived counter, so rounding in the
#: clock arithmetic can never let the object expire before a counter in it.
_RECORD_SLACK_SECONDS = 1.0


def _open(
    url: str | None, store: ObjectStore | None, options: Mapping[str, Any], where: str
) -> tuple[ObjectStore, bool]:
    """The store to use, and whether it was opened here (and so is closed here)."""
    if store is not None and url is not None:
        raise ConfigurationError(
            f"{where}: expected a storage URL or an opened store, found both "
            f"(url={url!r} and store={store.url!r})"
        )
    if store is not None:
        if options:
            raise ConfigurationError(
                f"{where}: storage options go with url=, found {sorted(options)} with store="
            )
        return store, False
    if url is None:
        raise ConfigurationError(
            f"{where}: expected a storage URL (url='file:///dir', 's3://bucket/prefix', "
            "'gs://bucket/prefix', 'memory://name') or an opened store (store=...), found neither"
        )
    return open_store(url, **options), True


def _seconds(ttl: int, where: str) -> float:
    """A TTL in milliseconds (Dramatiq's unit) as seconds (the store's)."""
    if ttl <= 0:
        # Redis would drop the value at once and Memcached keep it for ever: say so instead.
        raise ConfigurationError(f"{where}: expected a TTL in milliseconds above 0, found {ttl}")
    return ttl / 1000


# --- results ---------------------------------------------------------------------------------


class ObjqResultBackend(ResultBackend):
    """Dramatiq's results as objects in object storage.

    Parameters:
      url: storage URL (``file:///var/lib/objq``, ``s3://bucket/prefix``, ``gs://...``,
        ``memory://name``), opened with :func:`~objq_broker.storage.open_store`.
      store: an already opened :class:`~objq_broker.storage.ObjectStore` instead of a URL.
      prefix: where results live in the store.
      namespace: as for any Dramatiq result backend.
      encoder: as for any Dramatiq result backend.
      use_namespace_prefix_keys: as for any Dramatiq result backend.
      poll_seconds: longest pause between two reads while waiting for a result stored by
        another process (each read is one GET).
      **storage_options: options for ``open_store`` (``endpoint_url``, ``region``, ...).

    Each result is one object, ``<prefix><message key>``, written once by the worker that ran
    the message and expiring after the result's TTL (milliseconds, as everywhere in Dramatiq).
    An actor's exception is stored as Dramatiq stores it, so getting it raises
    :class:`~dramatiq.results.ResultFailure`. Expired objects read as missing;
    ``backend.records.purge()`` deletes them.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        store: ObjectStore | None = None,
        prefix: str = DEFAULT_RESULTS_PREFIX,
        namespace: str = "dramatiq-results",
        encoder: Encoder | None = None,
        use_namespace_prefix_keys: bool = False,
        poll_seconds: float = DEFAULT_POLL_SECONDS,
        **storage_options: Any,
    ) -> None:
        # Dramatiq 1.x has no use_namespace_prefix_keys: pass it only when asked for.
        readable_keys = {"use_namespace_prefix_keys": True} if use_namespace_prefix_keys else {}
        super().__init__(namespace=namespace, encoder=encoder, **readable_keys)
        opened, self._owns_store = _open(url, store, storage_options, "ObjqResultBackend")
        self.records = ResultStore(opened, prefix)
        self.poll_seconds = poll_seconds

    def get_result(
        self, message: dramatiq.Message[Any], *, block: bool = False, timeout: int | None = None
    ) -> Any:
        """The result of ``message``, as Dramatiq's backends give it: ``ResultMissing`` when
        not blocking and there is none yet, ``ResultTimeout`` when ``timeout`` milliseconds
        (default 10 s) pass first, ``ResultFailure`` when the actor failed."""
        name = self._name(self.build_message_key(message))
        if not block:
            data = self.records.get(name)
            if data is None:
                raise ResultMissing(message)
        else:
            seconds = (DEFAULT_TIMEOUT if timeout is None else timeout) / 1000
            found = self.records.wait(
                [name], lambda got: name in got, timeout=seconds, interval=self.poll_seconds
            )
            if name not in found:
                raise ResultTimeout(message)
            data = found[name]
        return self.unwrap_result(self.encoder.decode(data))  # type: ignore[no-untyped-call]

    def _get(self, message_key: str) -> Any:
        data = self.records.get(self._name(message_key))
        return Missing if data is None else self.encoder.decode(data)

    def _store(self, message_key: str, result: Any, ttl: int | None) -> None:
        # None (an actor's result_ttl=None): kept until deleted or purged.
        seconds = None if ttl is None else _seconds(ttl, f"result {message_key!r}")
        self.records.set(self._name(message_key), self.encoder.encode(result), seconds)

    def close(self) -> None:
        """Close the store if this backend opened it (from a URL)."""
        if self._owns_store:
            self.records.store.close()

    @staticmethod
    def _name(message_key: str) -> str:
        # An MD5 hex digest, or "namespace:queue:actor:id": one key segment either way.
        return quote(message_key, safe=":")


# --- rate limits -----------------------------------------------------------------------------


def limiter_of(key: str) -> str:
    """The limiter a rate-limit key belongs to: the part before its last ``@``, or the whole
    key. Dramatiq's window and bucket limiters name their counters ``<key>@<time>`` and its
    barriers their events ``<key>@events``; all counters of one limiter live in one object."""
    limiter, at, _ = key.rpartition("@")
    return limiter if at else key


class _Counter(msgspec.Struct, frozen=True):
    value: int
    expires_at: float  # seconds since the epoch


_Counters = dict[str, _Counter]
_counters_encoder = msgspec.json.Encoder()
_counters_decoder = msgspec.json.Decoder(_Counters)


class _Outlives(Exception):
    """A counter in the object lives longer than the record was to: write it for ``seconds``."""

    def __init__(self, seconds: float) -> None:
        super().__init__(seconds)
        self.seconds = seconds


class ObjqRateLimiterBackend(RateLimiterBackend):
    """Dramatiq's rate-limiter backend (for ``ConcurrentRateLimiter``, ``WindowRateLimiter``,
    ``BucketRateLimiter``, ``Barrier`` and so group completion callbacks) in object storage.

    Parameters are those of :class:`ObjqResultBackend` (``url`` or ``store``, ``prefix``,
    ``poll_seconds``, ``**storage_options``).

    Layout and atomicity: the counters of one limiter (every key with the same
    :func:`limiter_of`: ``K``, ``K@<time>``, ``K@events``) live together in one object,
    ``<prefix><limiter>``, each with its own expiry. Every operation is one compare-and-set
    update of that object (:meth:`ResultStore.update`), retried when another process changed
    it first, so no change is ever lost. ``incr_and_sum`` reads the key and the keys it sums
    from that same object version and writes only if nothing changed since: atomic. Summing
    keys of another limiter (which no Dramatiq limiter does) is refused with
    :class:`~objq_broker.errors.ConfigurationError`, never done non-atomically.

    TTLs are milliseconds, as in Dramatiq. ``wait`` returns as soon as ``wait_notify`` was
    called for its key (within the TTL, before or during the wait, as with Redis); a notify by
    this process wakes it at once, others are found by reading again at growing pauses.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        store: ObjectStore | None = None,
        prefix: str = DEFAULT_RATE_LIMITS_PREFIX,
        poll_seconds: float = DEFAULT_POLL_SECONDS,
        **storage_options: Any,
    ) -> None:
        opened, self._owns_store = _open(url, store, storage_options, "ObjqRateLimiterBackend")
        self.records = ResultStore(opened, prefix)
        self.poll_seconds = poll_seconds

    # --- Dramatiq's interface ------------------------------------------------------------

    def add(self, key: str, value: int, ttl: int) -> bool:
        return self._update(key, ttl, lambda live: value if key not in live else None)

    def incr(self, key: str, amount: int, maximum: int, ttl: int) -> bool:
        def incremented(live: Mapping[str, int]) -> int | None:
            value = live.get(key, 0) + amount
            return value if value <= maximum else None

        return self._update(key, ttl, incremented)

    def decr(self, key: str, amount: int, minimum: int, ttl: int) -> bool:
        def decremented(live: Mapping[str, int]) -> int | None:
            value = live.get(key, 0) - amount
            return value if value >= minimum else None

        return self._update(key, ttl, decremented)

    def incr_and_sum(
        self,
        key: str,
        keys: Callable[[], Iterable[str]],
        amount: int,
        maximum: int,
        ttl: int,
    ) -> bool:
        limiter = limiter_of(key)

        def incremented_if_sum_allows(live: Mapping[str, int]) -> int | None:
            value = live.get(key, 0) + amount
            # keys() is asked on every try: a window limiter's keys move with the clock.
            summed = list(keys())
            others = sorted({limiter_of(k) for k in summed} - {limiter})
            if others:
                raise ConfigurationError(
                    f"incr_and_sum({key!r}): expected keys of limiter {limiter!r} (one object, "
                    f"changed atomically), found keys of {others}"
                )
            total = amount + sum(live.get(k, 0) for k in summed)
            return value if value <= maximum and total <= maximum else None

        return self._update(key, ttl, incremented_if_sum_allows)

    def wait(self, key: str, timeout: int | None) -> bool:
        """Whether ``wait_notify(key)`` happened (and has not expired) within ``timeout``
        milliseconds (None: no limit)."""
        name = self._name(key)

        def notified(found: Mapping[str, bytes]) -> bool:
            return name in found and key in self._live(name, found[name])

        seconds = None if timeout is None else timeout / 1000
        found = self.records.wait([name], notified, timeout=seconds, interval=self.poll_seconds)
        return notified(found)

    def wait_notify(self, key: str, ttl: int) -> None:
        self._update(key, ttl, lambda live: live.get(key, 0) + 1)

    def close(self) -> None:
        """Close the store if this backend opened it (from a URL)."""
        if self._owns_store:
            self.records.store.close()

    # --- one compare-and-set update --------------------------------------------------------

    def _update(self, key: str, ttl: int, step: Callable[[Mapping[str, int]], int | None]) -> bool:
        """Set ``key`` to ``step(live counters of its limiter)`` for ``ttl`` milliseconds, by
        compare-and-set; False (nothing written) when ``step`` returns None."""
        seconds = _seconds(ttl, f"rate limit {key!r}")
        name = self._name(key)
        record_seconds = seconds  # how long the object lives: at least as long as each counter

        def changed(old: bytes | None) -> bytes | None:
            now = self.records.clock()
            counters = self._live(name, old, now)
            value = step({k: counter.value for k, counter in counters.items()})
            if value is None:
                return None
            counters[key] = _Counter(value=value, expires_at=now + seconds)
            latest = max(counter.expires_at for counter in counters.values())
            if latest > now + record_seconds:
                raise _Outlives(latest - now + _RECORD_SLACK_SECONDS)
            return _counters_encoder.encode(counters)

        while True:
            try:
                return self.records.update(name, changed, record_seconds) is not None
            except _Outlives as longer:
                # Another counter of this limiter lives longer (a longer TTL): the object must
                # too, or that counter would vanish with it. Nothing was written: go again.
                record_seconds = longer.seconds

    def _live(self, name: str, data: bytes | None, now: float | None = None) -> _Counters:
        """The unexpired counters in an object's data."""
        if data is None:
            return {}
        try:
            counters = _counters_decoder.decode(data)
        except UNDECODABLE as exc:
            raise StateCorrupt(
                f"{self.records.store.url}/{self.records.key(name)}: expected rate-limit "
                f"counters ({{key: {{value, expires_at}}}}), found {len(data)} bytes that do not "
                f"decode as them ({exc})"
            ) from exc
        now = self.records.clock() if now is None else now
        return {k: counter for k, counter in counters.items() if counter.expires_at > now}

    @staticmethod
    def _name(key: str) -> str:
        # One key segment per limiter, whatever characters its key has ('/' included).
        return quote(limiter_of(key), safe="")
