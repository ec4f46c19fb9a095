"""Google Cloud Storage as an object store, through one reused google-cloud-storage client.

Versions are object *generation* numbers (as decimal strings): GCS never reuses one for a key,
so there is no ABA. *create* sends ``ifGenerationMatch=0``, *update* sends
``ifGenerationMatch=<generation>``; a lost condition (HTTP 412) becomes
:class:`~objq_broker.errors.PreconditionFailed`. A read takes the generation from the
``X-Goog-Generation`` header of the very response that carried the bytes (the SDK's
``download_as_bytes`` stores it on the blob), never from a second metadata call.

Every write is a *multipart* upload, whatever its size. The SDK switches to a resumable upload
above 8 MiB, and fake-gcs-server (the emulator the tests run against) ignores
``ifGenerationMatch`` on resumable and simple-media uploads while enforcing it on multipart
ones; real GCS enforces all three. One upload path keeps emulator and production equal.

With ``endpoint_url`` (or the SDK's ``STORAGE_EMULATOR_HOST``), the store talks to an emulator:
anonymous credentials and the project id ``objq-local`` unless one is given. For an
authenticated custom endpoint, build the client yourself and pass ``client=``.
"""

from __future__ import annotations

import http.client
import io
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from objq_broker.errors import (
    AccessDenied,
    ConfigurationError,
    ObjectNotFound,
    PreconditionFailed,
    StorageError,
    StorageUnavailable,
)
from objq_broker.storage.base import (
    Blob,
    Listing,
    ObjectMeta,
    check_key,
    check_prefix,
    check_write_mode,
    clean_prefix,
    join_key,
)
from objq_broker.storage.cloud import (
    bucket_url,
    refuse_options_with_client,
    refused,
    status_refusal,
)

try:
    import requests
    from google.api_core import exceptions as api_exceptions
    from google.api_core.client_options import ClientOptions
    from google.auth import exceptions as auth_exceptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage
    from google.cloud.storage.exceptions import DataCorruption, InvalidResponse
    from google.cloud.storage.retry import DEFAULT_RETRY
except ImportError as exc:  # the adapter module is the boundary of the optional extra
    # ImportError, not only ModuleNotFoundError: without google-cloud-storage, but with another
    # google-cloud library installed, google.cloud is a namespace package and
    # `from google.cloud import storage` fails with a plain ImportError.
    raise ModuleNotFoundError(
        f"the GCS store needs google-cloud-storage>=3 ({exc}); "
        "install it with: pip install 'objq-broker[gcs]'",
        name=exc.name,
    ) from exc

#: Seconds to wait for each HTTP response (the SDK's default is 60).
DEFAULT_TIMEOUT_SECONDS = 30.0
#: Seconds to wait for a TCP connection; never more than the response timeout.
DEFAULT_CONNECT_TIMEOUT_SECONDS = 5.0
#: Seconds one call may spend retrying transient errors (the SDK's default is 120); a dead
#: endpoint fails in about this long, and the engine above retries with its own backoff.
DEFAULT_RETRY_DEADLINE_SECONDS = 5.0
#: Seconds of the first pause between retries of one call (doubling after each retry).
RETRY_FIRST_DELAY_SECONDS = 0.2
#: Seconds of the longest pause between retries of one call.
RETRY_MAX_DELAY_SECONDS = 1.0
#: Project id used with an emulator when none is given (emulators accept any).
EMULATOR_PROJECT = "objq-local"
#: Content type of every object written; objq's objects are opaque bytes to GCS.
_CONTENT_TYPE = "application/octet-stream"

#: Transient network failures, whichever layer (requests, http.client, google-auth) raised them.
_NETWORK_ERRORS: tuple[type[Exception], ...] = (
    requests.RequestException,
    ConnectionError,
    http.client.HTTPException,
    auth_exceptions.TransportError,
    DataCorruption,
)
#: Everything the SDK raises for a failed call; :meth:`GCSStore._storage_error` sorts it out.
_SDK_ERRORS: tuple[type[Exception], ...] = (
    api_exceptions.GoogleAPICallError,
    api_exceptions.RetryError,
    InvalidResponse,
    auth_exceptions.GoogleAuthError,
    *_NETWORK_ERRORS,
)
#: What the bucket-existence probe may raise when it cannot tell.
_PROBE_ERRORS: tuple[type[Exception], ...] = (api_exceptions.GoogleAPICallError, *_NETWORK_ERRORS)


class GCSStore:
    """Objects under ``gs://bucket/prefix``.

    >>> store = GCSStore("jobs-bucket", "q", endpoint_url="http://127.0.0.1:4443")  # doctest: +SKIP
    >>> version = store.write("state.json", b"{}", if_absent=True)  # doctest: +SKIP
    >>> store.write("state.json", b"{}", if_version=version)  # doctest: +SKIP

    Pass ``client`` to reuse a configured ``google.cloud.storage.Client``; the store then does
    not close it, and ``project`` and ``endpoint_url`` must not also be given. ``timeout`` is
    per HTTP request, so it combines with either.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        client: Any = None,
        project: str | None = None,
        endpoint_url: str | None = None,
        timeout: float | None = None,
    ) -> None:
        if not isinstance(bucket, str) or not bucket:
            raise ConfigurationError(f"gs store: expected a bucket name, found {bucket!r}")
        self._bucket_name = bucket
        self._prefix = clean_prefix(prefix, f"gs bucket {bucket!r}")
        self._endpoint_url = endpoint_url
        self._project = project
        read_timeout = DEFAULT_TIMEOUT_SECONDS if timeout is None else timeout
        if read_timeout <= 0:
            raise ConfigurationError(
                f"gs bucket {bucket!r}: timeout must be a positive number of seconds, "
                f"found {timeout!r}"
            )
        # requests' (connect, read) pair: a dead host fails on the short connect timeout.
        self._timeout = (min(DEFAULT_CONNECT_TIMEOUT_SECONDS, read_timeout), read_timeout)
        # The SDK's own predicate (429, 5xx, connection errors) with a short overall deadline.
        self._retry = DEFAULT_RETRY.with_delay(
            initial=RETRY_FIRST_DELAY_SECONDS, maximum=RETRY_MAX_DELAY_SECONDS, multiplier=2.0
        ).with_timeout(DEFAULT_RETRY_DEADLINE_SECONDS)
        if client is not None:
            given = {"endpoint_url": endpoint_url, "project": project}
            refuse_options_with_client(f"gs bucket {bucket!r}", given)
            self._client = client
            self._owns_client = False
        else:
            self._client = self._make_client(endpoint_url, project)
            self._owns_client = True
            # Since 3.11 the SDK fetches bucket metadata (storage.buckets.get) from a background
            # thread on the first object call per bucket, for tracing attributes. That is an
            # unrequested call sharing our session, denied and logged as an error for
            # object-only principals (googleapis/google-cloud-python#17650). A client the store
            # owns does without it; an injected client is left as its owner configured it.
            if getattr(self._client, "_bucket_metadata_cache", None) is not None:
                self._client._bucket_metadata_cache = None
        self._bucket = self._client.bucket(bucket)
        # Set once any call proves the bucket exists: from then on a 404 means a missing object.
        # (fake-gcs-server answers a bare "Not Found" for both, so the text cannot tell them.)
        self._bucket_seen = False

    def _make_client(self, endpoint_url: str | None, project: str | None) -> Any:
        # The environment is read here, when the store is built, never at import.
        emulated = bool(endpoint_url or os.environ.get("STORAGE_EMULATOR_HOST"))
        try:
            if emulated:
                options = ClientOptions(api_endpoint=endpoint_url) if endpoint_url else None
                return storage.Client(
                    project=project or EMULATOR_PROJECT,
                    credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
                    client_options=options,
                )
            return storage.Client(project=project)
        except auth_exceptions.DefaultCredentialsError as exc:
            raise AccessDenied(
                f"gs bucket {self._bucket_name!r}: no Google credentials found ({exc}); set "
                "GOOGLE_APPLICATION_CREDENTIALS, or pass endpoint_url for an emulator"
            ) from exc

    @property
    def url(self) -> str:
        query = {"endpoint_url": self._endpoint_url, "project": self._project}
        return bucket_url("gs", self._bucket_name, self._prefix, query)

    def _key(self, key: str) -> tuple[str, str]:
        """Check ``key`` and return (full object name, where-string for messages)."""
        where = f"gs bucket {self._bucket_name!r}, key {key!r}"
        full = join_key(self._prefix, check_key(key, where))
        return full, f"gs bucket {self._bucket_name!r}, key {full!r}"

    def read(self, key: str) -> Blob | None:
        full, where = self._key(key)
        blob = self._bucket.blob(full)
        try:
            with self._translated(where, "read"):
                data: bytes = blob.download_as_bytes(timeout=self._timeout, retry=self._retry)
        except ObjectNotFound:
            return None
        # download_as_bytes copied X-Goog-Generation from the same response into the blob.
        if blob.generation is None:
            raise StorageError(f"{where}: read returned no generation header; cannot version it")
        return Blob(data, str(blob.generation))

    def write(
        self, key: str, data: bytes, *, if_version: str | None = None, if_absent: bool = False
    ) -> str:
        full, where = self._key(key)
        check_write_mode(if_version, if_absent, where)
        generation_match: int | None = None
        if if_absent:
            generation_match = 0
        elif if_version is not None:
            generation_match = _parse_generation(if_version, where)
        body = bytes(data)
        blob = self._bucket.blob(full)
        with self._translated(where, "write", if_absent=if_absent, if_version=if_version):
            # Private SDK method, on purpose: the public upload_from_* switch to a resumable
            # upload above 8 MiB, where fake-gcs-server ignores ifGenerationMatch (see the
            # module docstring). Multipart has no size limit below GCS's 5 TiB object limit.
            response = blob._do_multipart_upload(
                client=self._client,
                stream=io.BytesIO(body),
                content_type=_CONTENT_TYPE,
                size=len(body),
                predefined_acl=None,
                if_generation_match=generation_match,
                if_generation_not_match=None,
                if_metageneration_match=None,
                if_metageneration_not_match=None,
                timeout=self._timeout,
                checksum="auto",
                retry=self._retry,
            )
            resource: dict[str, Any] = response.json()
        return str(resource["generation"])

    def put(self, key: str, data: bytes) -> str:
        return self.write(key, data)

    def get(self, key: str) -> bytes:
        full, where = self._key(key)
        with self._translated(where, "get"):
            data: bytes = self._bucket.blob(full).download_as_bytes(
                timeout=self._timeout, retry=self._retry
            )
        return data

    def delete(self, key: str) -> None:
        full, where = self._key(key)
        try:
            with self._translated(where, "delete"):
                self._bucket.blob(full).delete(timeout=self._timeout, retry=self._retry)
        except ObjectNotFound:
            pass  # already gone (perhaps by our own retried attempt): not an error

    def list(self, prefix: str = "") -> list[str]:
        return [meta.key for meta in self._listing(prefix, "items(name),nextPageToken")]

    def list_meta(self, prefix: str = "") -> Listing:
        return self._listing(prefix, "items(name,size,updated),nextPageToken")

    def _listing(self, prefix: str, fields: str) -> Listing:
        """The objects under ``prefix``, asking GCS only for ``fields`` (size and time are 0
        when not asked for)."""
        check_prefix(prefix, f"gs bucket {self._bucket_name!r}, prefix {prefix!r}")
        # With a store prefix 'p', list('') must not match a sibling 'p2/...': anchor on 'p/'.
        base = f"{self._prefix}/" if self._prefix else ""
        full_prefix = base + prefix
        where = f"gs bucket {self._bucket_name!r}, prefix {full_prefix!r}"
        with self._translated(where, "list"):
            # The iterator fetches pages lazily, so it is consumed inside the translation.
            found = [
                ObjectMeta(
                    item.name[len(base) :],
                    int(item.size or 0),
                    item.updated.timestamp() if item.updated is not None else 0.0,
                )
                for item in self._client.list_blobs(
                    self._bucket,
                    prefix=full_prefix,
                    fields=fields,
                    timeout=self._timeout,
                    retry=self._retry,
                )
            ]
        return sorted(found, key=lambda meta: meta.key)

    def close(self) -> None:
        """Close the HTTP session, unless the client was injected (its owner closes it)."""
        if self._owns_client:
            self._client.close()

    @contextmanager
    def _translated(
        self,
        where: str,
        action: str,
        *,
        if_absent: bool = False,
        if_version: str | None = None,
    ) -> Iterator[None]:
        """Run one GCS call, turning the SDK's errors into objq's (see :meth:`_storage_error`)."""
        try:
            yield
            self._bucket_seen = True
        except _SDK_ERRORS as exc:
            raise self._storage_error(exc, where, action, if_absent, if_version) from exc

    def _storage_error(
        self, exc: Exception, where: str, action: str, if_absent: bool, if_version: str | None
    ) -> StorageError:
        """The one place an SDK error becomes an objq storage error naming ``where``."""
        # A retry budget that ran out wraps the last real error; judge that one.
        while isinstance(exc, api_exceptions.RetryError) and isinstance(exc.cause, Exception):
            exc = exc.cause
        if isinstance(exc, InvalidResponse):
            # Media uploads and downloads raise the raw HTTP response; give it its status class.
            exc = api_exceptions.from_http_response(exc.response)  # type: ignore[no-untyped-call]
        if isinstance(exc, _NETWORK_ERRORS):
            return StorageUnavailable(f"{where}: {action} failed in transit: {exc}")
        if isinstance(exc, auth_exceptions.GoogleAuthError):  # e.g. a token refresh refused
            return AccessDenied(f"{where}: {action} failed: credentials refused ({exc})")
        if not isinstance(exc, api_exceptions.GoogleAPICallError):
            return StorageError(f"{where}: {action} failed: {exc}")
        return self._status_error(exc, where, action, if_absent, if_version)

    def _status_error(
        self,
        exc: api_exceptions.GoogleAPICallError,
        where: str,
        action: str,
        if_absent: bool,
        if_version: str | None,
    ) -> StorageError:
        """The storage error an HTTP status of GCS stands for."""
        status = int(exc.code or 0)
        refusal = status_refusal(status)
        # GCS answers 404 for a missing bucket and a missing object alike.
        if refusal == "no object" and (action == "list" or not self._bucket_exists()):
            refusal = "no bucket"
        said = f"GCS said {status}: {exc.message}"
        return refused(refusal, where, action, said, if_absent=if_absent, if_version=if_version)

    def _bucket_exists(self) -> bool:
        """After a 404, tell a missing bucket from a missing object (asked until known)."""
        if self._bucket_seen:
            return True
        try:
            exists: bool = self._bucket.exists(timeout=self._timeout, retry=None)
        except _PROBE_ERRORS:
            # Cannot tell (e.g. no storage.buckets.get permission): report the object missing,
            # and stop asking, since the answer will not change.
            self._bucket_seen = True
            return True
        self._bucket_seen = exists
        return exists


def _parse_generation(version: str, where: str) -> int:
    """A GCS version is a positive generation number; anything else can never match."""
    try:
        generation = int(version)
    except ValueError:
        generation = 0
    if generation <= 0:
        # Generation 0 would silently mean "create only" to GCS: refuse it as a lost condition.
        raise PreconditionFailed(
            f"{where}: conditional write lost: expected version {version!r}, which is not a "
            "GCS generation number, so no object can have it"
        )
    return generation
