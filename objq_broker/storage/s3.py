"""S3 (and S3-compatible: MinIO, R2, moto) as an object store, through one reused boto3 client.

Compare-and-set uses S3's conditional writes: *create* sends ``If-None-Match: *``, *update*
sends ``If-Match: <ETag>``. S3 answers a lost condition with 412 ``PreconditionFailed`` or, when
two conditional writes to one key overlap, 409 ``ConditionalRequestConflict``; both become one
:class:`~objq_broker.errors.PreconditionFailed`. Versions are ETags exactly as S3 returns them
(quoted MD5 digests for single-part uploads), taken from the response that carried the data.

Timeouts and retries default to failing fast: a queue whose storage is unreachable should say
so within seconds, and the engine above retries with its own backoff. One call gives up after at
most ``max_attempts`` x (``connect_timeout`` + ``read_timeout``) plus botocore's short backoff:
about 10 s by default against an endpoint that accepts and never answers, at once against one
that refuses. A commit (30 s deadline by default) thus gets tries of its own, and a shorter
deadline is overrun by at most the one call in flight when it passes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from objq_broker.errors import (
    AccessDenied,
    ConfigurationError,
    ObjectNotFound,
    StorageError,
    StorageUnavailable,
    redacted,
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
    Refusal,
    bucket_url,
    refuse_options_with_client,
    refused,
    status_refusal,
)

try:
    import boto3
    import botocore.exceptions
    from botocore.config import Config
except ImportError as exc:  # the adapter module is the boundary of the optional extra
    # ImportError, not only ModuleNotFoundError: a partial or broken install fails that way.
    raise ModuleNotFoundError(
        f"the S3 store needs boto3 ({exc}); install it with: pip install 'objq-broker[s3]'",
        name=exc.name,
    ) from exc

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

#: Seconds to wait for a TCP connection before the attempt fails (botocore's default is 60).
DEFAULT_CONNECT_TIMEOUT_SECONDS = 2.0
#: Seconds to wait for each socket read of a response (botocore's default is 60). S3 answers a
#: queue's small requests well within a second; a longer silence is an outage, better retried.
DEFAULT_READ_TIMEOUT_SECONDS = 5.0
#: Attempts per call, the first included ("standard" retry mode): a blackholed endpoint fails a
#: call in ~10 s (2 x 5 s), no longer than a commit deadline worth setting.
DEFAULT_MAX_ATTEMPTS = 2

#: S3 error codes that mean "the condition did not hold" (409 is S3's answer to overlapping
#: conditional writes on one key).
_PRECONDITION_CODES = frozenset({"PreconditionFailed", "ConditionalRequestConflict"})
#: S3 error codes that refuse the credentials rather than the request.
_ACCESS_CODES = frozenset(
    {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken"}
)
#: S3 error codes that are transient whatever their HTTP status.
_TRANSIENT_CODES = frozenset(
    {"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "Throttling"}
)


class S3Store:
    """Objects under ``s3://bucket/prefix``.

    >>> store = S3Store("jobs-bucket", "q", endpoint_url="http://127.0.0.1:9000")  # doctest: +SKIP
    >>> version = store.write("state.json", b"{}", if_absent=True)  # doctest: +SKIP
    >>> store.write("state.json", b"{}", if_version=version)  # doctest: +SKIP

    Pass ``client`` to reuse a configured boto3 S3 client; the store then does not close it,
    and ``endpoint_url``, ``region``, ``profile`` and the timeouts must not also be given.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        profile: str | None = None,
        client: S3Client | None = None,
        connect_timeout: float | None = None,
        read_timeout: float | None = None,
        max_attempts: int | None = None,
    ) -> None:
        if not isinstance(bucket, str) or not bucket:
            raise ConfigurationError(f"s3 store: expected a bucket name, found {bucket!r}")
        self._bucket = bucket
        self._prefix = clean_prefix(prefix, f"s3 bucket {bucket!r}")
        self._endpoint_url = endpoint_url
        self._region = region
        if client is not None:
            given = {
                "endpoint_url": endpoint_url,
                "region": region,
                "profile": profile,
                "connect_timeout": connect_timeout,
                "read_timeout": read_timeout,
                "max_attempts": max_attempts,
            }
            refuse_options_with_client(f"s3 bucket {bucket!r}", given)
            self._client = client
            self._owns_client = False
            return
        if connect_timeout is None:
            connect_timeout = DEFAULT_CONNECT_TIMEOUT_SECONDS
        if read_timeout is None:
            read_timeout = DEFAULT_READ_TIMEOUT_SECONDS
        if max_attempts is None:
            max_attempts = DEFAULT_MAX_ATTEMPTS
        config = Config(
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            # total_max_attempts counts the first attempt; botocore's "max_attempts" key would
            # count retries only, one attempt more than asked for.
            retries={"mode": "standard", "total_max_attempts": max_attempts},
        )
        try:
            # A private session: boto3's default session is shared and not thread-safe to build
            # clients from. The client it makes is thread-safe and reused for every call.
            session = boto3.session.Session(profile_name=profile, region_name=region)
            self._client = session.client("s3", endpoint_url=endpoint_url, config=config)
        except botocore.exceptions.ProfileNotFound as exc:
            raise ConfigurationError(f"s3 bucket {bucket!r}: {exc}") from exc
        except ValueError:  # botocore refuses a malformed endpoint_url this way
            # Neither the URL nor botocore's message is repeated: either may carry a password.
            raise ConfigurationError(
                f"s3 bucket {bucket!r}: invalid endpoint_url; expected http(s)://host[:port]"
            ) from None
        self._owns_client = True

    @property
    def url(self) -> str:
        query = {"endpoint_url": self._endpoint_url, "region": self._region}
        return bucket_url("s3", self._bucket, self._prefix, query)

    def _key(self, key: str) -> tuple[str, str]:
        """Check ``key`` and return (full S3 key, where-string for messages)."""
        full = join_key(self._prefix, check_key(key, f"s3 bucket {self._bucket!r}, key {key!r}"))
        return full, f"s3 bucket {self._bucket!r}, key {full!r}"

    def read(self, key: str) -> Blob | None:
        full, where = self._key(key)
        try:
            with self._translated(where, "read"):
                response = self._client.get_object(Bucket=self._bucket, Key=full)
                data = response["Body"].read()
        except ObjectNotFound:
            return None
        return Blob(data, response["ETag"])

    def write(
        self, key: str, data: bytes, *, if_version: str | None = None, if_absent: bool = False
    ) -> str:
        full, where = self._key(key)
        check_write_mode(if_version, if_absent, where)
        body = bytes(data)
        with self._translated(where, "write", if_absent=if_absent, if_version=if_version):
            if if_absent:
                response = self._client.put_object(
                    Bucket=self._bucket, Key=full, Body=body, IfNoneMatch="*"
                )
            elif if_version is not None:
                response = self._client.put_object(
                    Bucket=self._bucket, Key=full, Body=body, IfMatch=if_version
                )
            else:
                response = self._client.put_object(Bucket=self._bucket, Key=full, Body=body)
        return response["ETag"]

    def put(self, key: str, data: bytes) -> str:
        return self.write(key, data)

    def get(self, key: str) -> bytes:
        full, where = self._key(key)
        with self._translated(where, "get"):
            response = self._client.get_object(Bucket=self._bucket, Key=full)
            return response["Body"].read()

    def delete(self, key: str) -> None:
        full, where = self._key(key)
        # S3 answers 204 for a missing key too, so a repeated delete is not an error.
        with self._translated(where, "delete"):
            self._client.delete_object(Bucket=self._bucket, Key=full)

    def list(self, prefix: str = "") -> list[str]:
        return [meta.key for meta in self.list_meta(prefix)]

    def list_meta(self, prefix: str = "") -> Listing:
        check_prefix(prefix, f"s3 bucket {self._bucket!r}, prefix {prefix!r}")
        # With a store prefix 'p', list('') must not match a sibling 'p2/...': anchor on 'p/'.
        base = f"{self._prefix}/" if self._prefix else ""
        full_prefix = base + prefix
        found: Listing = []
        with self._translated(f"s3 bucket {self._bucket!r}, prefix {full_prefix!r}", "list"):
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self._bucket, Prefix=full_prefix
            )
            for page in pages:
                found.extend(
                    ObjectMeta(
                        item["Key"][len(base) :],
                        int(item["Size"]),
                        item["LastModified"].timestamp(),
                    )
                    for item in page.get("Contents", ())
                )
        return sorted(found, key=lambda meta: meta.key)

    def close(self) -> None:
        """Close the connection pool, unless the client was injected (its owner closes it)."""
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
        """Run one S3 call, turning botocore's errors into objq's (see :func:`_storage_error`)."""
        try:
            yield
        except (
            botocore.exceptions.ClientError,
            botocore.exceptions.ConnectionError,
            botocore.exceptions.HTTPClientError,
            botocore.exceptions.NoCredentialsError,
        ) as exc:
            raise _storage_error(exc, where, action, if_absent, if_version) from exc
        except (
            botocore.exceptions.ParamValidationError,
            botocore.exceptions.EndpointResolutionError,
        ) as exc:
            # No retry can fix these: the bucket, key or endpoint is not one S3 accepts.
            raise ConfigurationError(
                f"{where}: {action} refused by the S3 SDK: {redacted(str(exc))}"
            ) from exc
        except botocore.exceptions.BotoCoreError as exc:
            raise StorageError(f"{where}: {action} failed: {redacted(str(exc))}") from exc


def _storage_error(
    exc: Exception, where: str, action: str, if_absent: bool, if_version: str | None
) -> StorageError:
    """The one place a botocore error becomes an objq storage error naming ``where``."""
    if isinstance(exc, botocore.exceptions.NoCredentialsError):
        return AccessDenied(
            f"{where}: {action} failed: no AWS credentials found (set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, a profile, or an instance role)"
        )
    if not isinstance(exc, botocore.exceptions.ClientError):
        # Endpoint refused or unreachable, connect/read timeout, connection dropped mid-body.
        return StorageUnavailable(f"{where}: {action} failed, S3 unreachable: {redacted(str(exc))}")
    error: Any = exc.response.get("Error", {})
    code = str(error.get("Code", ""))
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    said = redacted(f"S3 said {status} {code}: {error.get('Message', '')}".rstrip(": "))
    return refused(
        _refusal(code, status), where, action, said, if_absent=if_absent, if_version=if_version
    )


def _refusal(code: str, status: int) -> Refusal:
    """What S3's error code means, or else its HTTP status."""
    if code in _PRECONDITION_CODES:
        return "condition"
    if code == "NoSuchBucket":
        return "no bucket"
    if code == "NoSuchKey":
        return "no object"
    if code in _ACCESS_CODES:
        return "credentials"
    if code in _TRANSIENT_CODES:
        return "transient"
    return status_refusal(status)
