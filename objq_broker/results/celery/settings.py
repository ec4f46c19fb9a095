"""Where a Celery app's results live: ``result_backend`` and
``result_backend_transport_options`` read and checked, and one
:class:`~objq_broker.results.store.ResultStore` per process and settings."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

import msgspec
from celery.exceptions import ImproperlyConfigured

from objq_broker.errors import ConfigurationError, InvalidKey, redacted
from objq_broker.model.settings import option_names, read_settings
from objq_broker.results.store import DEFAULT_PREFIX, ResultStore
from objq_broker.storage import open_store

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


class BackendSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Where the results of one Celery app live: its ``result_backend_transport_options``,
    with ``url`` the storage URL found in ``result_backend`` when that names one."""

    #: The storage URL, without the objq+ scheme.
    url: str = ""
    #: Where under the store the results go.
    prefix: str = DEFAULT_PREFIX
    #: Keyword options for the storage adapter.
    store_options: dict[str, Any] = {}
    #: Celery's own (the key prefix its other backends put before every key).
    global_keyprefix: Any = None


#: ``result_backend_transport_options`` this backend reads.
ACCEPTED_OPTIONS = option_names(BackendSettings)


def backend_settings(url: str | None, options: Mapping[str, Any]) -> BackendSettings:
    """The settings from the URL Celery found after ``objq+`` (None with the class-path form)
    and ``result_backend_transport_options``."""
    try:
        set_options = {name: value for name, value in options.items() if value is not None}
        read = read_settings(BackendSettings, set_options, where="result_backend_transport_options")
    except ConfigurationError as exc:
        raise BackendConfigurationError(str(exc)) from None
    given = _storage_url(url)
    in_options = options.get("url")
    if given and in_options:
        raise BackendConfigurationError(
            f"result backend: a storage URL in result_backend ({redacted(given)!r}) and another "
            f"in result_backend_transport_options['url'] ({redacted(str(in_options))!r}); "
            "expected one of them"
        )
    chosen = given or read.url
    if not chosen:
        raise BackendConfigurationError(
            f"result backend: expected a storage URL, as {_FORM}; found {chosen!r}"
        )
    return msgspec.structs.replace(read, url=chosen)


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
