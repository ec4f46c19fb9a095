"""The storage port: a compare-and-set contract over one flat key space.

Every backend (memory, a local directory, S3, GCS) implements :class:`ObjectStore`:

``read(key) -> Blob | None``
    The object's bytes and its version, both taken from the same response, or ``None`` when
    the object does not exist.
``write(key, data, *, if_version=None, if_absent=False) -> version``
    The compare-and-set primitive, in obstore's vocabulary of put modes: *create*
    (``if_absent=True``: only if no object exists), *update* (``if_version=V``: only if the
    current version is ``V``) or *overwrite* (neither). A failed condition raises
    :class:`~objq_broker.errors.PreconditionFailed`, whatever the backend answered. Of several
    writers racing from the same version, exactly one wins.
``put / get / delete / list``
    Plain operations for immutable objects (archive segments, staged payloads).
``list_meta(prefix) -> list[ObjectMeta]``
    The listing with each object's size and last modification time, as the listing itself
    reports them (no request per object): what garbage collection judges an object's age by.

Keys are ``/``-separated relative paths: no empty, ``.`` or ``..`` segments, no leading ``/``,
no NUL byte, no backslash. Every adapter refuses other keys with
:class:`~objq_broker.errors.InvalidKey`, so a key that works on one backend works on all.

Versions are opaque strings. Memory, file and GCS versions never repeat for one key. S3 ETags
are content hashes, so writing identical bytes twice yields the same ETag; the queue state
embeds a monotonic counter so its bytes (and so its ETag) never repeat.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable
from urllib.parse import urlsplit, urlunsplit

from objq_broker.errors import ConfigurationError, InvalidKey, ObjectNotFound

#: Characters no key may contain.
_FORBIDDEN_KEY_CHARS = ("\x00", "\\")
#: Prefix reserved for the file adapter's own bookkeeping folders.
RESERVED_KEY_PREFIX = ".objq"


@dataclass(frozen=True, slots=True)
class Blob:
    """An object's bytes and the version they were read at."""

    data: bytes
    version: str

    def __repr__(self) -> str:
        return f"Blob(version={self.version!r}, size={len(self.data)})"


@dataclass(frozen=True, slots=True)
class ObjectMeta:
    """One listed object: its key, its size in bytes, and when it was last written (Unix
    seconds, by the storage's clock)."""

    key: str
    size: int
    modified: float


#: What :meth:`ObjectStore.list_meta` returns (a name of its own: inside the store classes,
#: ``list`` is the method).
Listing = list[ObjectMeta]


@runtime_checkable
class ObjectStore(Protocol):
    """The compare-and-set object store every objq layer builds on (see the module docstring)."""

    @property
    def url(self) -> str:
        """The store's location as a URL, without credentials."""
        ...

    def read(self, key: str) -> Blob | None: ...

    def write(
        self, key: str, data: bytes, *, if_version: str | None = None, if_absent: bool = False
    ) -> str: ...

    def put(self, key: str, data: bytes) -> str: ...

    def get(self, key: str) -> bytes: ...

    def delete(self, key: str) -> None: ...

    def list(self, prefix: str = "") -> list[str]: ...

    def list_meta(self, prefix: str = "") -> Listing: ...

    def close(self) -> None: ...


def check_key(key: object, where: str) -> str:
    """Return ``key`` if valid; else raise :class:`InvalidKey` naming ``where``."""
    if not isinstance(key, str) or not key:
        raise InvalidKey(f"{where}: expected a non-empty string key, found {key!r}")
    for char in _FORBIDDEN_KEY_CHARS:
        if char in key:
            raise InvalidKey(f"{where}: key {key!r} contains the forbidden character {char!r}")
    if key.startswith("/"):
        raise InvalidKey(f"{where}: key {key!r} is absolute; expected a relative key like 'a/b'")
    for segment in key.split("/"):
        if segment in ("", ".", ".."):
            raise InvalidKey(
                f"{where}: key {key!r} has an empty, '.' or '..' segment; "
                "expected segments like 'queues/state.json'"
            )
    if key.startswith(RESERVED_KEY_PREFIX):
        raise InvalidKey(f"{where}: keys starting with {RESERVED_KEY_PREFIX!r} are reserved")
    return key


def check_prefix(prefix: object, where: str) -> str:
    """Return a valid list prefix ('' or a key prefix), else raise :class:`InvalidKey`."""
    if prefix == "":
        return ""
    if not isinstance(prefix, str):
        raise InvalidKey(f"{where}: expected a string prefix, found {prefix!r}")
    # A prefix may end in '/', or stop mid-segment ('archive/2026-'); check it as a key.
    check_key(prefix.rstrip("/") or "x", where)
    return prefix


def check_write_mode(if_version: str | None, if_absent: bool, where: str) -> None:
    """Refuse the over-determined write mode: a version to match *and* create-only."""
    if if_version is not None and if_absent:
        raise ConfigurationError(
            f"{where}: write got both if_version={if_version!r} and if_absent=True; "
            "expected at most one condition"
        )
    if if_version is not None and (not isinstance(if_version, str) or not if_version):
        raise ConfigurationError(
            f"{where}: if_version must be a non-empty version string, found {if_version!r}"
        )


def write_if_unchanged(store: ObjectStore, key: str, data: bytes, version: str | None) -> str:
    """Write ``data`` as ``key``'s next version if the object is still as read: created if the
    read found none (``version`` None), else updated from ``version``. Another writer having
    come first raises :class:`~objq_broker.errors.PreconditionFailed`."""
    if version is None:
        return store.write(key, data, if_absent=True)
    return store.write(key, data, if_version=version)


def join_key(prefix: str, key: str) -> str:
    """Join a store's key prefix (possibly '') and a key with one '/'."""
    return f"{prefix}/{key}" if prefix else key


def clean_prefix(prefix: str, where: str) -> str:
    """Return a bucket prefix without surrounding '/', refusing one that is not a valid key."""
    if not isinstance(prefix, str):
        raise ConfigurationError(f"{where}: expected a string prefix, found {prefix!r}")
    cleaned = prefix.strip("/")
    if cleaned:
        try:
            check_key(cleaned, f"{where}, prefix {cleaned!r}")
        except InvalidKey as exc:
            raise ConfigurationError(str(exc)) from exc
    return cleaned


def without_userinfo(endpoint_url: str) -> str:
    """Drop any ``user:password@`` from an endpoint URL, so a store's ``url`` shows no secret."""
    parts = urlsplit(endpoint_url)
    if parts.username is None and parts.password is None:
        return endpoint_url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port is not None else host
    return urlunsplit(parts._replace(netloc=netloc))


#: Keys found valid, so a key used again is not checked again (the first ones: the state's
#: key of each namespace is among them).
_CHECKED_KEYS: set[str] = set()
_CHECKED_KEYS_KEPT = 1024


class LocalStoreOps:
    """``put`` and ``get`` in terms of ``write`` and ``read``, for adapters where a plain
    overwrite and a fetch are no cheaper than the general calls (memory, file)."""

    def _where(self, key: str) -> str:
        raise NotImplementedError

    def _key(self, key: str) -> str:
        """``key``, checked (the error names where it was used)."""
        if type(key) is str and key in _CHECKED_KEYS:  # the state's key, at every commit
            return key
        check_key(key, self._where(key))
        if len(_CHECKED_KEYS) < _CHECKED_KEYS_KEPT:
            _CHECKED_KEYS.add(key)
        return key

    def _write_mode(self, key: str, if_version: str | None, if_absent: bool) -> None:
        """:func:`check_write_mode`, with the error's place made only when it raises: this
        runs at every commit."""
        if if_version is not None and (if_absent or type(if_version) is not str or not if_version):
            check_write_mode(if_version, if_absent, self._where(key))

    def _prefix(self, prefix: str) -> str:
        """``prefix``, checked as :meth:`_key` checks a key."""
        return check_prefix(prefix, self._where(prefix))

    def read(self, key: str) -> Blob | None:
        raise NotImplementedError

    def write(
        self, key: str, data: bytes, *, if_version: str | None = None, if_absent: bool = False
    ) -> str:
        raise NotImplementedError

    def put(self, key: str, data: bytes) -> str:
        return self.write(key, data)

    def get(self, key: str) -> bytes:
        blob = self.read(key)
        if blob is None:
            raise ObjectNotFound(f"{self._where(key)}: no such object")
        return blob.data
