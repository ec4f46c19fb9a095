"""The engine's and ``Queue``'s settings (:class:`EngineSettings`, :class:`QueueSettings`), and
the splitting of ``Queue(url, **options)`` between the engine and the storage adapter.

An engine setting may be given as a keyword (``Queue(url, linger_seconds=0.05)``) or in the
store's URL (``Queue("s3://bucket/jobs?linger_seconds=50ms")``), not both; the URL's other
query parameters are the storage adapter's. The names accepted (:data:`ENGINE_OPTIONS`) are
the struct's fields.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Annotated, Any, TypedDict
from urllib.parse import parse_qsl, urlsplit, urlunsplit

import msgspec
from msgspec import Meta

from objq_broker.engine.archive import DEFAULT_ARCHIVE_TAIL_BYTES
from objq_broker.engine.garbage import DEFAULT_GC_INTERVAL_SECONDS, DEFAULT_OLDER_THAN_SECONDS
from objq_broker.engine.guard import STATE_KEY
from objq_broker.errors import ConfigurationError, redacted
from objq_broker.model.checks import Identifier, PositiveSeconds, Seconds
from objq_broker.model.encoding import DEFAULT_MAX_STATE_BYTES
from objq_broker.model.runs import MAX_RUN_JOBS
from objq_broker.model.settings import TEXT, from_texts, option_names, read_settings, text_names
from objq_broker.storage import ObjectStore, open_store

#: Environment variable naming the store when no URL is given.
URL_ENV = "OBJQ_URL"

#: How soon ``claim(timeout=...)`` looks at the state again when a claim found nothing. The
#: wait doubles while claims keep finding nothing, up to ``DEFAULT_MAX_POLL_SECONDS`` (each
#: look is a storage read in direct mode), and starts again from here when one finds a job. A
#: commit of this process (a local enqueue) wakes claimers at once whatever the wait.
DEFAULT_POLL_SECONDS = 0.5
DEFAULT_MAX_POLL_SECONDS = 1.0

Count = Annotated[int, Meta(ge=1)]
Size = Annotated[int, Meta(ge=0)]


class EngineSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The engine's settings, and what each must be: a NaN linger would never batch, an
    infinite deadline would never give up, a fractional batch cap would never fill. Checked
    once, at the door, like every value a caller gives.

    The defaults are the engine constructor's (a test holds the two together).
    """

    #: The state object's key in the store. Not in a URL: every tool that opens a store's URL
    #: (the command line, the dashboard, Spark) reads the same state.
    key: Annotated[Identifier, Meta(extra={TEXT: False})] = STATE_KEY
    #: Archive finished jobs (False: drop their records).
    archive: bool = True
    #: Bytes of finished jobs' records the state keeps before they are written out as one
    #: archive object, once ten state writes have carried them (``engine.archive``; 0: an
    #: archive object with every commit that finishes jobs).
    archive_tail_bytes: Size = DEFAULT_ARCHIVE_TAIL_BYTES
    #: Most operations one commit applies.
    max_batch_ops: Count = 5000
    #: Most payload bytes one commit adds.
    max_batch_bytes: Count = 16 * 1024 * 1024
    #: How long a commit waits to fill its batch (fewer writes, a lower storage bill).
    linger_seconds: Seconds = 0.0
    #: How long a batch keeps retrying storage errors and conflicts before its ops fail.
    commit_deadline_seconds: PositiveSeconds = 30.0
    #: How old the cached state may be before a claim or a read fetches it again.
    max_staleness_seconds: Seconds = 0.2
    #: How often an idle consumer engine looks for stale leases to expire (at first).
    idle_tick_seconds: PositiveSeconds = 1.0
    #: The epoch an elected broker's engine writes under (None: not elected, never fenced).
    #: An elected broker's own, never a URL's.
    epoch: Annotated[Size | None, Meta(extra={TEXT: False})] = None
    #: The namespace's only writer (a broker): it reads only after a conflict.
    exclusive: Annotated[bool, Meta(extra={TEXT: False})] = False
    #: Seed of the engine's jitter (None: random).
    seed: int | None = None
    #: Ready or delayed jobs, dead letters or keys a queue keeps in the state's head before
    #: the rest move to runs (None: never spill).
    spill_at: Size | None = 1_000
    #: Most jobs in one run.
    run_jobs: Count = MAX_RUN_JOBS
    #: How often the background sweep of unreferenced objects runs (None: never).
    gc_interval_seconds: PositiveSeconds | None = DEFAULT_GC_INTERVAL_SECONDS
    #: How old an unreferenced object must be before the sweep deletes it.
    gc_older_than_seconds: Seconds = DEFAULT_OLDER_THAN_SECONDS
    #: While the state is smaller than this, large payloads stay in it (0: always out of line).
    inline_state_bytes: Size = 64 * 1024
    #: A larger state object is refused unread.
    max_state_bytes: Count = DEFAULT_MAX_STATE_BYTES
    #: A test's stand-in for ``time.time``; any callable.
    clock: Any = time.time


class QueueSettings(EngineSettings, frozen=True, forbid_unknown_fields=True):
    """A ``Queue``'s own settings besides its engine's (the defaults are its constructor's)."""

    #: Who holds the leases this queue takes (``objq workers`` shows it); None: host and pid.
    owner: Identifier | None = None
    #: How soon a claim that found nothing looks again, at first.
    poll_seconds: PositiveSeconds = DEFAULT_POLL_SECONDS
    #: The longest wait between two looks of a claim that keeps finding nothing.
    max_poll_seconds: PositiveSeconds = DEFAULT_MAX_POLL_SECONDS
    #: Claims from a queue nobody declared find nothing instead of raising.
    implicit_queues: bool = False


class EngineOptions(TypedDict, total=False):
    """:class:`EngineSettings` as keywords, for type checkers (a test holds the two together);
    what each must be, and its default, is the struct's."""

    key: str
    archive: bool
    archive_tail_bytes: int
    max_batch_ops: int
    max_batch_bytes: int
    linger_seconds: float
    commit_deadline_seconds: float
    max_staleness_seconds: float
    idle_tick_seconds: float
    epoch: int | None
    exclusive: bool
    seed: int | None
    spill_at: int | None
    run_jobs: int
    gc_interval_seconds: float | None
    gc_older_than_seconds: float
    inline_state_bytes: int
    max_state_bytes: int
    clock: Callable[[], float]


#: The names of :class:`EngineSettings` and :class:`QueueSettings` of earlier releases.
EngineLimits = EngineSettings
QueueLimits = QueueSettings

#: Keywords that configure the engine; every other keyword goes to ``open_store``.
ENGINE_OPTIONS = option_names(EngineSettings)
#: Keywords that configure a ``Queue`` itself, not its engine.
QUEUE_OPTIONS = option_names(QueueSettings) - ENGINE_OPTIONS
#: Engine settings a store URL's query may give (not the clock, the key or a broker's own).
URL_OPTIONS = text_names(EngineSettings)


def engine_part(options: dict[str, Any]) -> dict[str, Any]:
    """The keywords of ``options`` that configure the engine."""
    return {k: v for k, v in options.items() if k in ENGINE_OPTIONS}


def resolve_store(
    url: str | None, store: ObjectStore | None, options: dict[str, Any], owner: str
) -> tuple[ObjectStore, dict[str, Any]]:
    """Open the store (``url``, ``store=`` or ``$OBJQ_URL``) and return it with engine options
    (the keywords', and those in the URL's query)."""
    engine_options = engine_part(options)
    store_options = {k: v for k, v in options.items() if k not in ENGINE_OPTIONS}
    if store is not None:
        if url is not None or store_options:
            raise ConfigurationError(
                f"{owner}: got store= together with a URL or storage options "
                f"{sorted(store_options)}; expected one way to name the store"
            )
        return store, engine_options
    if url is None:
        url = os.environ.get(URL_ENV)
    if not url:
        raise ConfigurationError(
            f"{owner}: no store given; expected a URL (file:///var/lib/objq, s3://bucket/prefix, "
            f"gs://bucket/prefix, memory://name), store=, or ${URL_ENV}"
        )
    url, in_url = url_settings(url, owner)
    twice = sorted(set(in_url) & set(engine_options))
    if twice:
        raise ConfigurationError(
            f"{owner} {redacted(url)!r}: option(s) {', '.join(twice)} given both in the URL and "
            "as keywords; expected one of them"
        )
    return open_store(url, **store_options), engine_options | in_url


def url_settings(url: str, owner: str) -> tuple[str, dict[str, Any]]:
    """``url`` without the engine settings in its query (what the storage adapter opens), and
    those settings, read from text and checked."""
    parts = urlsplit(url) if "://" in url else None
    if parts is None or not parts.query:
        return url, {}
    kept: list[str] = []
    engine: dict[str, str] = {}
    for piece in parts.query.split("&"):
        pairs = parse_qsl(piece, keep_blank_values=True)
        if pairs and pairs[0][0] in URL_OPTIONS:
            engine[pairs[0][0]] = pairs[0][1]
        else:
            kept.append(piece)
    if not engine:
        return url, {}
    bare = urlunsplit(parts._replace(query="&".join(kept)))
    return bare, from_texts(EngineSettings, engine, where=f"{owner} {redacted(bare)!r}")


def check_engine_settings(
    settings: dict[str, Any], limits: type[EngineSettings] = EngineSettings
) -> None:
    """:class:`ConfigurationError` naming the first setting out of its range."""
    read_settings(limits, settings, where="Queue settings")
