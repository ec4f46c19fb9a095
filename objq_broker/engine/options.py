"""Splitting ``Queue(url, **options)`` keywords between the engine and the storage adapter."""

from __future__ import annotations

import os
from typing import Annotated, Any

import msgspec
from msgspec import UNSET, Meta, UnsetType

from objq_broker.errors import ConfigurationError
from objq_broker.model.checks import Identifier, PositiveSeconds, Seconds, checked
from objq_broker.storage import ObjectStore, open_store

#: Environment variable naming the store when no URL is given.
URL_ENV = "OBJQ_URL"
#: Keywords that configure the engine; every other keyword goes to ``open_store``.
ENGINE_OPTIONS = frozenset(
    {
        "key",
        "archive",
        "archive_tail_bytes",
        "max_batch_ops",
        "max_batch_bytes",
        "linger_seconds",
        "commit_deadline_seconds",
        "max_staleness_seconds",
        "idle_tick_seconds",
        "epoch",
        "exclusive",
        "clock",
        "seed",
        "spill_at",
        "gc_interval_seconds",
        "gc_older_than_seconds",
        "inline_state_bytes",
        "max_state_bytes",
    }
)


def engine_part(options: dict[str, Any]) -> dict[str, Any]:
    """The keywords of ``options`` that configure the engine."""
    return {k: v for k, v in options.items() if k in ENGINE_OPTIONS}


def resolve_store(
    url: str | None, store: ObjectStore | None, options: dict[str, Any], owner: str
) -> tuple[ObjectStore, dict[str, Any]]:
    """Open the store (``url``, ``store=`` or ``$OBJQ_URL``) and return it with engine options."""
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
    return open_store(url, **store_options), engine_options


Count = Annotated[int, Meta(ge=1)]
Size = Annotated[int, Meta(ge=0)]


class EngineLimits(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What each engine setting must be: a NaN linger would never batch, an infinite deadline
    would never give up, a fractional batch cap would never fill. Checked once, at the door
    (:func:`~objq_broker.model.checks.checked`), like every value a caller gives; a setting
    not given keeps its default."""

    key: Identifier | UnsetType = UNSET
    archive: bool | UnsetType = UNSET
    archive_tail_bytes: Size | UnsetType = UNSET  # 0: an archive object for every commit
    max_batch_ops: Count | UnsetType = UNSET
    max_batch_bytes: Count | UnsetType = UNSET
    linger_seconds: Seconds | UnsetType = UNSET
    commit_deadline_seconds: PositiveSeconds | UnsetType = UNSET
    max_staleness_seconds: Seconds | UnsetType = UNSET
    idle_tick_seconds: PositiveSeconds | UnsetType = UNSET
    epoch: Size | UnsetType | None = UNSET
    exclusive: bool | UnsetType = UNSET
    seed: int | UnsetType | None = UNSET
    spill_at: Size | UnsetType | None = UNSET  # None: never spill
    run_jobs: Count | UnsetType = UNSET
    gc_interval_seconds: PositiveSeconds | UnsetType | None = UNSET  # None: never collect
    gc_older_than_seconds: Seconds | UnsetType = UNSET
    inline_state_bytes: Size | UnsetType = UNSET  # 0: large payloads always out of line
    max_state_bytes: Count | UnsetType = UNSET
    #: A test's stand-in for ``time.time``; any callable.
    clock: Any = UNSET


class QueueLimits(EngineLimits, frozen=True, forbid_unknown_fields=True):
    """A ``Queue``'s own settings besides its engine's."""

    owner: Identifier | UnsetType | None = UNSET
    poll_seconds: PositiveSeconds | UnsetType = UNSET
    max_poll_seconds: PositiveSeconds | UnsetType = UNSET
    implicit_queues: bool | UnsetType = UNSET


def check_engine_settings(
    settings: dict[str, Any], limits: type[EngineLimits] = EngineLimits
) -> None:
    """:class:`ConfigurationError` naming the first setting out of its range."""
    checked(settings, limits, "Queue settings")
