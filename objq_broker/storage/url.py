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

Every scheme takes ``check_conditions`` (default true): before a namespace's state is first
created, the store is probed for conditional writes it ignores, and refused if it does
(:mod:`objq_broker.storage.probe`). ``check_conditions=false`` skips that probe. **Dangerous**:
on a store that ignores conditions jobs are lost without an error; only for a store already
checked with ``objq check-store``.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypedDict
from urllib.parse import parse_qsl, urlsplit

from objq_broker.errors import ConfigurationError, missing_extra, redacted
from objq_broker.storage.base import ObjectStore
from objq_broker.storage.memory import MemoryStore
from objq_broker.storage.probe import skip_condition_check

_REGION = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
_PROFILE = re.compile(r"^[\w.@:+-]{1,256}$")
#: S3 and GCS bucket names (the looser legacy S3 rules, which allow upper case and '_').
_BUCKET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{1,254}$")
#: Longest timeout accepted (about a century, as for every span of time objq takes).
MAX_SECONDS = 100 * 365 * 24 * 3600.0
#: Most attempts a storage call may make (botocore's standard mode caps them likewise).
_MAX_ATTEMPTS = 20

#: Per cloud scheme: the distribution its adapter imports, and the extra that installs it.
_SDKS: dict[str, tuple[str, str]] = {
    "s3": ("boto3", "s3"),
    "gs": ("google-cloud-storage", "gcs"),
}

_memory_stores: dict[str, MemoryStore] = {}
_memory_lock = threading.Lock()


def _parse_bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    lowered = str(value).lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true/false")


def _seconds(value: object) -> float:
    """A timeout: a finite number of seconds above zero (zero would fail every call at once;
    NaN, every call as "unreachable")."""
    try:
        seconds = float(value) if isinstance(value, str | int | float) else math.nan
    except ValueError:
        seconds = math.nan
    if isinstance(value, bool) or not 0 < seconds <= MAX_SECONDS:
        raise ValueError("expected a finite number of seconds > 0 (at most a century)")
    return seconds


def _attempts(value: object) -> int:
    try:
        count = int(value) if isinstance(value, str) else value
    except ValueError:
        count = None
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= _MAX_ATTEMPTS:
        raise ValueError(f"expected a whole number of attempts from 1 to {_MAX_ATTEMPTS}")
    return count


def _matching(value: object, pattern: re.Pattern[str], meaning: str) -> str:
    if not isinstance(value, str) or not pattern.match(value):
        raise ValueError(f"expected {meaning}")
    return value


def _endpoint(value: object) -> str:
    """An endpoint: http(s)://host[:port][/path], with no query or fragment."""
    expected = "expected http(s)://host[:port]"
    if not isinstance(value, str):
        raise ValueError(expected)
    parts = urlsplit(value)
    try:
        parts.port  # noqa: B018 (a malformed port raises here)
    except ValueError:
        raise ValueError(f"{expected} with a port from 0 to 65535") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(expected)
    if parts.query or parts.fragment:
        raise ValueError(f"{expected}, with no query or fragment")
    return value


#: Options each scheme accepts (query string or keyword), and how a value is parsed and
#: checked: each parser takes the query's text or a keyword's value and returns the option,
#: or raises ``ValueError`` saying what was expected.
_OPTIONS: dict[str, dict[str, Callable[[Any], Any]]] = {
    "memory": {"check_conditions": _parse_bool},
    "file": {"fsync": _parse_bool, "check_conditions": _parse_bool},
    "s3": {
        "check_conditions": _parse_bool,
        "endpoint_url": _endpoint,
        "region": lambda v: _matching(v, _REGION, "a region name such as eu-west-1"),
        "profile": lambda v: _matching(v, _PROFILE, "a profile name"),
        "client": lambda v: v,  # only meaningful as a keyword; listed so the error names it
        "connect_timeout": _seconds,
        "read_timeout": _seconds,
        "max_attempts": _attempts,
    },
    "gs": {
        "check_conditions": _parse_bool,
        "client": lambda v: v,
        "project": lambda v: _matching(v, _PROFILE, "a project id"),
        "endpoint_url": _endpoint,
        "timeout": _seconds,
    },
}


class StoreOptions(TypedDict, total=False):
    """The options of :data:`_OPTIONS` as keywords, for type checkers (a test holds the two
    together); a scheme refuses those it does not list."""

    check_conditions: bool
    fsync: bool
    endpoint_url: str | None
    region: str | None
    profile: str | None
    client: Any
    connect_timeout: float
    read_timeout: float
    max_attempts: int
    project: str | None
    timeout: float


def _accepted() -> str:
    return ", ".join(f"{scheme}://" for scheme in _OPTIONS)


def _collect_options(
    scheme: str, query: str, keywords: Mapping[str, Any], url: str
) -> dict[str, Any]:
    allowed = _OPTIONS[scheme]
    options: dict[str, Any] = {}
    shown = redacted(url)
    for name, raw in parse_qsl(query, keep_blank_values=True, strict_parsing=False):
        if name not in allowed or name == "client":
            in_query = sorted(set(allowed) - {"client"})
            raise ConfigurationError(
                f"storage URL {shown!r}: unknown option {name!r} for {scheme}://; "
                f"accepted: {', '.join(in_query) or 'none'}"
                + (" (and client= as a keyword)" if "client" in allowed else "")
            )
        options[name] = _parsed(allowed, name, raw, f"storage URL {shown!r}")
    for name, value in keywords.items():
        if name not in allowed:
            raise ConfigurationError(
                f"open_store({shown!r}): unknown option {name!r} for {scheme}://; "
                f"accepted: {', '.join(sorted(allowed)) or 'none'}"
            )
        if name in options:
            raise ConfigurationError(
                f"open_store({shown!r}): option {name!r} given both in the URL and as a keyword"
            )
        options[name] = None if value is None else _parsed(allowed, name, value, "open_store")
    return options


def _parsed(allowed: Mapping[str, Callable[[Any], Any]], name: str, value: Any, where: str) -> Any:
    """Option ``name`` parsed and checked, or :class:`ConfigurationError` saying what it must
    be. A value is shown only where it cannot be a secret (an endpoint may carry a password)."""
    try:
        return allowed[name](value)
    except ValueError as exc:
        found = "" if name == "endpoint_url" else f", found {value!r}"
        raise ConfigurationError(f"{where}: option {name!r}: {exc}{found}") from None


def _missing_sdk(scheme: str, exc: ModuleNotFoundError) -> ConfigurationError:
    """The error for a URL whose adapter's SDK is not installed: a setup to fix, not a bug."""
    package, extra = _SDKS[scheme]
    found = exc.__cause__ or exc  # the SDK's own import error, under the adapter's advice
    return missing_extra(f"{scheme}://", package, extra, found)


def _bucket_and_prefix(netloc: str, path: str, url: str) -> tuple[str, str]:
    if not netloc:
        raise ConfigurationError(
            f"storage URL {redacted(url)!r}: expected a bucket name after '://'"
        )
    if "@" in netloc or ":" in netloc:
        # s3://KEY:SECRET@bucket: never a bucket name, and never to be shown back.
        raise ConfigurationError(
            f"storage URL {redacted(url)!r}: expected a bucket name after '://', found one "
            "with ':' or '@'; credentials do not go in a storage URL: use the SDK's "
            "environment variables, a profile or an instance role"
        )
    if not _BUCKET.match(netloc):
        raise ConfigurationError(
            f"storage URL {url!r}: expected a bucket name (2-255 letters, digits, '.', '-' "
            f"or '_'), found {netloc!r}"
        )
    return netloc, path.strip("/")


def _directory(netloc: str, path: str, url: str) -> Path:
    """The directory a ``file://`` URL names. ``file:///abs/dir`` has an empty netloc, and
    ``file://rel/dir`` puts 'rel' in it; one with credentials or a port names no directory."""
    if "@" in netloc or ":" in netloc:
        raise ConfigurationError(
            f"storage URL {redacted(url)!r}: expected file:///absolute/dir or "
            "file://relative/dir, found a host part with ':' or '@'"
        )
    raw = netloc + path
    if not raw:
        raise ConfigurationError(
            f"storage URL {redacted(url)!r}: expected a directory after file://"
        )
    directory = Path(raw)
    if directory.is_absolute() and directory == Path(directory.anchor):
        raise ConfigurationError(
            f"storage URL {redacted(url)!r}: expected a directory of its own, found the file "
            "system's "
            "root: objq keeps its objects and its .objq-tmp and .objq-locks folders there"
        )
    return directory


def file_directory(url: str) -> Path:
    """The directory a ``file://`` URL names, checked as :func:`open_store` checks it (no
    credentials, no host part, not the root), without creating it."""
    parts = urlsplit(url)
    if parts.scheme.lower() != "file":
        raise ConfigurationError(
            f"storage URL {redacted(url)!r}: expected a file:// URL, found {parts.scheme!r}"
        )
    return _directory(parts.netloc, parts.path, url)


def open_store(url: str, **options: Any) -> ObjectStore:
    """Open the object store a URL names (see the module docstring for the forms)."""
    store, check_conditions = _open(url, options)
    if check_conditions is False:
        skip_condition_check(store)
    return store


def _open(url: str, options: dict[str, Any]) -> tuple[ObjectStore, bool | None]:
    """The store, and the ``check_conditions`` option given (None: not given)."""
    if not isinstance(url, str) or "://" not in url:
        raise ConfigurationError(
            f"storage URL: expected SCHEME://..., found {url!r}; accepted schemes: {_accepted()}"
        )
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in _OPTIONS:
        raise ConfigurationError(
            f"storage URL {redacted(url)!r}: unknown scheme {parts.scheme!r}; "
            f"accepted: {_accepted()}"
        )
    opts = _collect_options(scheme, parts.query, options, url)
    check: bool | None = opts.pop("check_conditions", None)
    if scheme == "memory":
        if "@" in parts.netloc:  # memory://user:pw@name: a secret where a name is expected
            raise ConfigurationError(
                f"storage URL {redacted(url)!r}: expected memory://NAME, found a name with "
                "'@'; credentials do not go in a storage URL"
            )
        name = (parts.netloc + parts.path).strip("/") or "default"
        with _memory_lock:
            return _memory_stores.setdefault(name, MemoryStore(name)), check
    if scheme == "file":
        directory = _directory(parts.netloc, parts.path, url)
        from objq_broker.storage.file import FileStore

        return FileStore(directory, **opts), check
    bucket, prefix = _bucket_and_prefix(parts.netloc, parts.path, url)
    # The adapter modules raise ModuleNotFoundError when their SDK is missing (importing one
    # directly should fail as any import does); a URL that needs it is a configuration error.
    if scheme == "s3":
        try:
            from objq_broker.storage.s3 import S3Store
        except ModuleNotFoundError as exc:
            raise _missing_sdk(scheme, exc) from exc
        return S3Store(bucket, prefix, **opts), check
    try:
        from objq_broker.storage.gcs import GCSStore
    except ModuleNotFoundError as exc:
        raise _missing_sdk(scheme, exc) from exc
    return GCSStore(bucket, prefix, **opts), check
