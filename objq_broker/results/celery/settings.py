"""Where a Celery app's results live: ``result_backend`` and
``result_backend_transport_options`` read and checked, and one
:class:`~objq_broker.results.store.ResultStore` per process and settings."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from celery.exceptions import ImproperlyConfigured

from objq_broker.errors import ConfigurationError, InvalidKey, redacted
from objq_broker.results.store import DEFAULT_PREFIX, ResultStore
from objq_broker.storage import open_store

#: ``result_backend_transport_options`` this backend reads (``global_keyprefix`` is Celery's).
ACCEPTED_OPTIONS = frozenset({"url", "prefix", "store_options", "global_keyprefix"})
#: ``result_backend`` values that name no storage (it then comes from the ``url`` option).
_BARE = ("objq://", "objq:///", "objq:")
_FORM = (
    "result_backend = 'objq+<storage URL>' (objq+file:///path, objq+s3://bucket/prefix, "
    "objq+gs://bucket/prefix, objq+memory://name), or the storage URL in "
    "result_backend_transport_options={'url': ...}"
)


class BackendConfigurationError(ConfigurationError, ImproperlyConfigured):  # type: ignore[misc]
    """A result backend setting is invalid: both objq's :class:`ConfigurationError` and
    Celery's ``ImproperlyConfigured``, so either may be caught."""


@dataclass(frozen=True)
class BackendSettings:
    """Where the results of one Celery app live."""

    url: str  # the storage URL, without the objq+ scheme
    prefix: str = DEFAULT_PREFIX
    store_options: dict[str, Any] = field(default_factory=dict)


def backend_settings(url: str | None, options: Mapping[str, Any]) -> BackendSettings:
    """The settings from the URL Celery found after ``objq+`` (None with the class-path form)
    and ``result_backend_transport_options``."""
    unknown = sorted(set(options) - ACCEPTED_OPTIONS)
    if unknown:
        raise BackendConfigurationError(
            f"result_backend_transport_options: unknown option(s) {', '.join(unknown)}; "
            f"accepted: {', '.join(sorted(ACCEPTED_OPTIONS))}"
        )
    given = _storage_url(url)
    in_options = options.get("url")
    if given and in_options:
        raise BackendConfigurationError(
            f"result backend: a storage URL in result_backend ({redacted(given)!r}) and another "
            f"in result_backend_transport_options['url'] ({redacted(str(in_options))!r}); "
            "expected one of them"
        )
    chosen = given or in_options
    if not isinstance(chosen, str) or not chosen:
        raise BackendConfigurationError(
            f"result backend: expected a storage URL, as {_FORM}; found {chosen!r}"
        )
    prefix, store_options = options.get("prefix", DEFAULT_PREFIX), options.get("store_options", {})
    if not isinstance(prefix, str):
        raise BackendConfigurationError(
            f"result_backend_transport_options['prefix']: expected a string, found {prefix!r}"
        )
    if not isinstance(store_options, Mapping):
        raise BackendConfigurationError(
            "result_backend_transport_options['store_options']: expected a dict of storage "
            f"options, found {store_options!r}"
        )
    return BackendSettings(chosen, prefix, dict(store_options))


def _storage_url(url: str | None) -> str | None:
    if url is None or url in ("", *_BARE):
        return None
    if url.startswith("objq://"):
        raise BackendConfigurationError(
            f"result backend: expected {_FORM}; found {redacted(url)!r} (objq:// names no "
            "storage: write objq+file://..., objq+s3://...)"
        )
    return url.removeprefix("objq+")


_opened: dict[tuple[int, str, str, str], ResultStore] = {}
_opened_lock = threading.Lock()


def open_results(settings: BackendSettings) -> ResultStore:
    """One store per process and settings: Celery makes a backend for every thread that uses
    one, and they can share a store (and its HTTP connections) as they share its objects. The
    pid: a forked child (the prefork pool) opens its own, as it must for an SDK client."""
    key = (os.getpid(), settings.url, settings.prefix, repr(sorted(settings.store_options.items())))
    with _opened_lock:
        results = _opened.get(key)
        if results is None:
            where = f"result backend objq+{redacted(settings.url)}"
            try:
                results = ResultStore(
                    open_store(settings.url, **settings.store_options), settings.prefix
                )
                results.key("probe")  # refuses a prefix that cannot start a key
            except (ConfigurationError, InvalidKey) as exc:
                raise BackendConfigurationError(f"{where}: {exc}") from exc
            _opened[key] = results
        return results
