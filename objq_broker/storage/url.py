"""``open_store(url)``: the one place a storage URL becomes an :class:`ObjectStore`.

Accepted forms::

    memory://NAME                      in-process, shared by name within one process
    file:///abs/dir                    a local directory (created if missing, but only in an
                                       existing parent directory: see FileStore)
    file://relative/dir                a directory relative to the working directory
    s3://bucket/prefix?region=R&endpoint_url=http://127.0.0.1:9000
    gs://bucket/prefix                 (endpoint_url=... or STORAGE_EMULATOR_HOST for emulators)

Options come from the query string or from keyword arguments (a keyword wins only if the
query does not name the same option: over-determined configuration is refused).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from objq_broker.errors import ConfigurationError, missing_extra
from objq_broker.storage.base import ObjectStore
from objq_broker.storage.memory import MemoryStore

#: Options each scheme accepts (query string or keyword), and how a query value is parsed.
_OPTIONS: dict[str, dict[str, Callable[[str], Any]]] = {
    "memory": {},
    "file": {"fsync": lambda v: _parse_bool("fsync", v)},
    "s3": {
        "endpoint_url": str,
        "region": str,
        "profile": str,
        "client": str,  # only meaningful as a keyword; listed so the error names it
        "connect_timeout": float,
        "read_timeout": float,
        "max_attempts": int,
    },
    "gs": {"client": str, "project": str, "endpoint_url": str, "timeout": float},
}

#: Per cloud scheme: the distribution its adapter imports, and the extra that installs it.
_SDKS: dict[str, tuple[str, str]] = {
    "s3": ("boto3", "s3"),
    "gs": ("google-cloud-storage", "gcs"),
}

_memory_stores: dict[str, MemoryStore] = {}
_memory_lock = threading.Lock()


def _parse_bool(name: str, value: str) -> bool:
    lowered = value.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ConfigurationError(f"option {name!r}: expected true/false, found {value!r}")


def _accepted() -> str:
    return ", ".join(f"{scheme}://" for scheme in _OPTIONS)


def _collect_options(
    scheme: str, query: str, keywords: Mapping[str, Any], url: str
) -> dict[str, Any]:
    allowed = _OPTIONS[scheme]
    options: dict[str, Any] = {}
    for name, raw in parse_qsl(query, keep_blank_values=True, strict_parsing=False):
        if name not in allowed or name == "client":
            in_query = sorted(set(allowed) - {"client"})
            raise ConfigurationError(
                f"storage URL {url!r}: unknown option {name!r} for {scheme}://; "
                f"accepted: {', '.join(in_query) or 'none'}"
                + (" (and client= as a keyword)" if "client" in allowed else "")
            )
        try:
            options[name] = allowed[name](raw)
        except ValueError as exc:
            raise ConfigurationError(
                f"storage URL {url!r}: option {name!r} has an invalid value {raw!r} ({exc})"
            ) from exc
    for name, value in keywords.items():
        if name not in allowed:
            raise ConfigurationError(
                f"open_store({url!r}): unknown option {name!r} for {scheme}://; "
                f"accepted: {', '.join(sorted(allowed)) or 'none'}"
            )
        if name in options:
            raise ConfigurationError(
                f"open_store({url!r}): option {name!r} given both in the URL and as a keyword"
            )
        options[name] = value
    return options


def _missing_sdk(scheme: str, exc: ModuleNotFoundError) -> ConfigurationError:
    """The error for a URL whose adapter's SDK is not installed: a setup to fix, not a bug."""
    package, extra = _SDKS[scheme]
    found = exc.__cause__ or exc  # the SDK's own import error, under the adapter's advice
    return missing_extra(f"{scheme}://", package, extra, found)


def _bucket_and_prefix(netloc: str, path: str, url: str) -> tuple[str, str]:
    if not netloc:
        raise ConfigurationError(f"storage URL {url!r}: expected a bucket name after '://'")
    return netloc, path.strip("/")


def open_store(url: str, **options: Any) -> ObjectStore:
    """Open the object store a URL names (see the module docstring for the forms)."""
    if not isinstance(url, str) or "://" not in url:
        raise ConfigurationError(
            f"storage URL: expected SCHEME://..., found {url!r}; accepted schemes: {_accepted()}"
        )
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in _OPTIONS:
        raise ConfigurationError(
            f"storage URL {url!r}: unknown scheme {parts.scheme!r}; accepted: {_accepted()}"
        )
    opts = _collect_options(scheme, parts.query, options, url)
    if scheme == "memory":
        name = (parts.netloc + parts.path).strip("/") or "default"
        with _memory_lock:
            return _memory_stores.setdefault(name, MemoryStore(name))
    if scheme == "file":
        # file:///abs/dir has an empty netloc; file://rel/dir puts 'rel' in the netloc.
        raw = parts.netloc + parts.path
        if not raw:
            raise ConfigurationError(f"storage URL {url!r}: expected a directory after file://")
        from objq_broker.storage.file import FileStore

        return FileStore(Path(raw), **opts)
    bucket, prefix = _bucket_and_prefix(parts.netloc, parts.path, url)
    # The adapter modules raise ModuleNotFoundError when their SDK is missing (importing one
    # directly should fail as any import does); a URL that needs it is a configuration error.
    if scheme == "s3":
        try:
            from objq_broker.storage.s3 import S3Store
        except ModuleNotFoundError as exc:
            raise _missing_sdk(scheme, exc) from exc
        return S3Store(bucket, prefix, **opts)
    try:
        from objq_broker.storage.gcs import GCSStore
    except ModuleNotFoundError as exc:
        raise _missing_sdk(scheme, exc) from exc
    return GCSStore(bucket, prefix, **opts)
