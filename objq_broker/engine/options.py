"""Splitting ``Queue(url, **options)`` keywords between the engine and the storage adapter."""

from __future__ import annotations

import os
from typing import Any

from objq_broker.errors import ConfigurationError
from objq_broker.storage import ObjectStore, open_store

#: Environment variable naming the store when no URL is given.
URL_ENV = "OBJQ_URL"
#: Keywords that configure the engine; every other keyword goes to ``open_store``.
ENGINE_OPTIONS = frozenset(
    {
        "key",
        "archive",
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
    }
)


def resolve_store(
    url: str | None, store: ObjectStore | None, options: dict[str, Any], owner: str
) -> tuple[ObjectStore, dict[str, Any]]:
    """Open the store (``url``, ``store=`` or ``$OBJQ_URL``) and return it with engine options."""
    engine_options = {k: v for k, v in options.items() if k in ENGINE_OPTIONS}
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
