"""What the cloud adapters (S3, GCS) share: their ``url``, the refusal of an injected client
given with options it makes moot, and the storage error a refused call stands for.

Each adapter reads its own SDK's codes and statuses into a :data:`Refusal`;
:func:`refused` is the one place a refusal becomes an objq storage error, so both services
word the same failure the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal
from urllib.parse import urlencode

from objq_broker.errors import (
    AccessDenied,
    BucketNotFound,
    ConfigurationError,
    ObjectNotFound,
    PreconditionFailed,
    StorageError,
    StorageUnavailable,
)
from objq_broker.storage.base import without_userinfo

#: What the service's answer to a call means, whatever words its SDK put it in.
Refusal = Literal["condition", "no bucket", "no object", "credentials", "transient", "other"]


def bucket_url(scheme: str, bucket: str, prefix: str, query: Mapping[str, str | None]) -> str:
    """``scheme://bucket/prefix?query``, leaving out unset options and any endpoint password."""
    shown = {name: value for name, value in query.items() if value is not None}
    if "endpoint_url" in shown:
        shown["endpoint_url"] = without_userinfo(shown["endpoint_url"])
    path = f"/{prefix}" if prefix else ""
    suffix = f"?{urlencode(shown, safe=':/')}" if shown else ""
    return f"{scheme}://{bucket}{path}{suffix}"


def refuse_options_with_client(where: str, given: Mapping[str, object]) -> None:
    """Refuse options that an injected client already settles (``given`` maps each option's
    name to its value, ``None`` when not given)."""
    clashing = sorted(name for name, value in given.items() if value is not None)
    if clashing:
        raise ConfigurationError(
            f"{where}: got an injected client and also {', '.join(clashing)}; configure the "
            "client, or pass these options without a client, not both"
        )


def status_refusal(status: int) -> Refusal:
    """What an HTTP status means when the service's own code says no more."""
    if status == 412:
        return "condition"
    if status == 404:
        return "no object"
    if status in (401, 403):
        return "credentials"
    if status in (408, 429) or status >= 500:
        return "transient"
    return "other"


def refused(
    refusal: Refusal,
    where: str,
    action: str,
    said: str,
    *,
    if_absent: bool = False,
    if_version: str | None = None,
) -> StorageError:
    """The storage error for a call to ``where`` that the service refused; ``said`` is the
    service's own answer, quoted for the reader."""
    if refusal == "condition":
        expected = "no object (create-only)" if if_absent else f"version {if_version}"
        return PreconditionFailed(
            f"{where}: conditional {action} lost: expected {expected}, found another ({said})"
        )
    if refusal == "no bucket":
        return BucketNotFound(f"{where}: {action} failed: the bucket does not exist ({said})")
    if refusal == "no object":
        if if_version is not None:
            # The contract calls an update of a missing object a lost compare-and-set.
            return PreconditionFailed(
                f"{where}: conditional {action} lost: expected version {if_version}, "
                f"found no object ({said})"
            )
        return ObjectNotFound(f"{where}: no such object ({said})")
    if refusal == "credentials":
        return AccessDenied(f"{where}: {action} refused ({said})")
    if refusal == "transient":
        return StorageUnavailable(f"{where}: {action} failed transiently ({said})")
    return StorageError(f"{where}: {action} failed ({said})")
