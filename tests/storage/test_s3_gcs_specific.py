"""What only the S3 and GCS adapters promise, beyond the shared contract suite.

Every test runs against the real peers (moto's S3 server, fake-gcs-server) except the one
S3 409 translation test: moto never answers 409 ConditionalRequestConflict, so botocore's
Stubber plays that answer to a real boto3 client.
"""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import boto3
import pytest
import requests
from botocore.stub import Stubber
from google.api_core import exceptions as api_exceptions
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage
from google.cloud.storage import blob as blob_module
from google.cloud.storage._bucket_metadata_cache import BucketMetadataCache

from objq_broker.errors import (
    AccessDenied,
    BucketNotFound,
    ConfigurationError,
    PreconditionFailed,
    StorageUnavailable,
)
from objq_broker.storage import Blob, open_store
from objq_broker.storage.gcs import GCSStore
from objq_broker.storage.s3 import S3Store
from tests.support.servers import (
    DUMMY_AWS_ENV,
    create_gcs_bucket,
    create_s3_bucket,
    free_port,
    new_bucket_name,
)

#: The SDK's switch-over size from multipart to resumable uploads (8 MiB), plus one byte.
OVER_RESUMABLE_THRESHOLD = blob_module._MAX_MULTIPART_SIZE + 1
#: A dead endpoint must fail well within this (the defaults aim at ~5 s); a hang fails the test.
FAIL_FAST_SECONDS = 15.0


# --- helpers -----------------------------------------------------------------------------------


class RecordingSession(requests.Session):
    """A plain requests session (fine for an emulator) recording (method, url) of each answer."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[str, str]] = []
        self.hooks["response"].append(self._record)

    def _record(self, response: requests.Response, *args: Any, **kwargs: Any) -> None:
        self.sent.append((str(response.request.method), str(response.request.url)))

    def object_requests(self) -> list[tuple[str, str]]:
        """Requests on objects (the SDK may also GET the bucket from a background thread)."""
        return [(m, u) for m, u in self.sent if "/o/" in u or u.split("?")[0].endswith("/o")]


def emulator_client(endpoint: str, session: requests.Session | None = None) -> Any:
    """A google-cloud-storage client for fake-gcs-server, optionally over ``session``."""
    return storage.Client(
        project="objq-local",
        credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
        client_options=ClientOptions(api_endpoint=endpoint),
        _http=session,
    )


@pytest.fixture
def gcs_bucket(gcs_endpoint: str) -> str:
    name = new_bucket_name()
    create_gcs_bucket(gcs_endpoint, name)
    return name


@pytest.fixture
def s3_bucket(moto_endpoint: str) -> str:
    name = new_bucket_name()
    create_s3_bucket(moto_endpoint, name)
    return name


@pytest.fixture
def recording_gcs(
    gcs_endpoint: str, gcs_bucket: str
) -> Iterator[tuple[GCSStore, RecordingSession]]:
    """A GCSStore whose injected client sends through a RecordingSession."""
    session = RecordingSession()
    yield GCSStore(gcs_bucket, "q", client=emulator_client(gcs_endpoint, session)), session
    session.close()


@pytest.fixture
def dummy_aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Credentials for boto3 to sign with, for tests that never reach a server."""
    for name, value in DUMMY_AWS_ENV.items():
        monkeypatch.setenv(name, value)


# --- GCS: every upload path enforces ifGenerationMatch ---------------------------------------


@pytest.mark.parametrize(
    "size",
    [1024, OVER_RESUMABLE_THRESHOLD],
    ids=["1KiB", "over-8MiB-where-the-SDK-would-go-resumable"],
)
def test_gcs_adapter_writes_enforce_conditions_at_every_size(
    recording_gcs: tuple[GCSStore, RecordingSession], size: int
) -> None:
    store, session = recording_gcs
    data = b"x" * size
    # Given an object at a known generation, and a newer one on top of it
    stale = store.write("state.json", data, if_absent=True)
    current = store.write("state.json", data[:-1] + b"y", if_version=stale)
    # When writers use the stale generation, or try to create over it
    with pytest.raises(PreconditionFailed, match="gs bucket"):
        store.write("state.json", b"stale", if_version=stale)
    with pytest.raises(PreconditionFailed):
        store.write("state.json", b"create", if_absent=True)
    # Then nothing was overwritten, and every upload went the enforced (multipart) way
    blob = store.read("state.json")
    assert blob is not None and blob.version == current and blob.data == data[:-1] + b"y"
    uploads = [url for method, url in session.object_requests() if "/upload/" in url]
    assert len(uploads) == 4
    assert all("uploadType=multipart" in url for url in uploads), uploads


def test_gcs_adapter_does_not_follow_the_sdk_resumable_threshold(
    monkeypatch: pytest.MonkeyPatch, recording_gcs: tuple[GCSStore, RecordingSession]
) -> None:
    # Given an SDK that would send every upload resumable (as a future version might)
    monkeypatch.setattr(blob_module, "_MAX_MULTIPART_SIZE", 0)
    store, session = recording_gcs
    stale = store.write("k", b"1", if_absent=True)
    store.write("k", b"2", if_version=stale)
    # Then a stale write still fails, because the adapter stays on multipart uploads
    with pytest.raises(PreconditionFailed):
        store.write("k", b"3", if_version=stale)
    assert store.get("k") == b"2"
    assert all("uploadType=multipart" in u for m, u in session.object_requests() if "/upload/" in u)


def _sdk_multipart(blob: Any, data: bytes, generation: int) -> None:
    blob.upload_from_string(data, if_generation_match=generation)


def _sdk_resumable(blob: Any, data: bytes, generation: int) -> None:
    # An unknown size makes the SDK start a resumable session whatever chunk_size says.
    blob.chunk_size = 256 * 1024
    blob.upload_from_file(io.BytesIO(data), size=None, if_generation_match=generation)


@pytest.mark.parametrize(
    "upload",
    [
        pytest.param(_sdk_multipart, id="multipart"),
        pytest.param(
            _sdk_resumable,
            id="resumable",
            marks=pytest.mark.xfail(
                strict=True,
                raises=AssertionError,
                reason="fake-gcs-server ignores ifGenerationMatch on resumable uploads "
                "(real GCS enforces it); the adapter therefore never uploads resumable",
            ),
        ),
    ],
)
def test_gcs_emulator_enforces_stale_generation_on_sdk_upload_path(
    gcs_endpoint: str, gcs_bucket: str, upload: Any
) -> None:
    """Pins which SDK upload paths the emulator enforces; the xfail turns red if that changes."""
    client = emulator_client(gcs_endpoint)
    try:
        bucket = client.bucket(gcs_bucket)
        first = bucket.blob("k")
        first.upload_from_string(b"1", if_generation_match=0)
        bucket.blob("k").upload_from_string(b"2")
        try:
            upload(bucket.blob("k"), b"stale", first.generation)
        except api_exceptions.PreconditionFailed:
            pass
        else:
            raise AssertionError("a stale ifGenerationMatch upload was accepted")
        assert bucket.blob("k").download_as_bytes() == b"2"
    finally:
        client.close()


# --- GCS: versions, errors, configuration ----------------------------------------------------


def test_gcs_read_is_one_request_and_returns_the_written_generation(
    recording_gcs: tuple[GCSStore, RecordingSession],
) -> None:
    store, session = recording_gcs
    version = store.write("state.json", b"{}", if_absent=True)
    session.sent.clear()
    blob = store.read("state.json")
    assert blob is not None and blob.version == version and version.isdigit()
    # The generation came from the download's own headers: no object metadata call.
    [(method, url)] = session.object_requests()
    assert method == "GET" and "alt=media" in url


@pytest.mark.parametrize("version", ["0", "-3", "not-a-generation", '"d41d8cd98f"'])
def test_gcs_non_generation_versions_never_match(
    recording_gcs: tuple[GCSStore, RecordingSession], version: str
) -> None:
    store, session = recording_gcs
    store.write("k", b"1")
    session.sent.clear()
    # "0" would mean create-only to GCS; none of these can be the current generation.
    with pytest.raises(PreconditionFailed, match="not a GCS generation"):
        store.write("k", b"2", if_version=version)
    assert session.object_requests() == []


def test_gcs_owned_client_makes_no_background_bucket_calls(
    gcs_endpoint: str, gcs_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The SDK's tracing cache would GET the bucket from a background thread (a call an
    # object-only principal is denied); a store that built its own client switches it off.
    fetched: list[str] = []  # recorded in the caller's thread, where the fetch is queued

    def queue_fetch(cache: BucketMetadataCache, name: str) -> None:
        fetched.append(name)

    monkeypatch.setattr(BucketMetadataCache, "get_or_queue_fetch", queue_fetch)
    store = GCSStore(gcs_bucket, "q", endpoint_url=gcs_endpoint)
    try:
        store.write("k", b"v", if_absent=True)
        assert store.read("k") is not None and store.list() == ["k"]
        store.delete("k")
    finally:
        store.close()
    assert fetched == []


def test_gcs_missing_bucket_is_named(gcs_endpoint: str) -> None:
    store = GCSStore("objq-no-such-bucket", "q", endpoint_url=gcs_endpoint)
    try:
        for attempt in (
            lambda: store.read("state.json"),
            lambda: store.write("state.json", b"x", if_absent=True),
            lambda: store.delete("state.json"),
        ):
            with pytest.raises(BucketNotFound, match=r"gs bucket 'objq-no-such-bucket', key 'q/"):
                attempt()
        with pytest.raises(BucketNotFound, match="objq-no-such-bucket"):
            store.list()
    finally:
        store.close()


def test_gcs_unreachable_endpoint_fails_fast() -> None:
    store = GCSStore("jobs-bucket", endpoint_url=f"http://127.0.0.1:{free_port()}")
    started = time.monotonic()
    with pytest.raises(StorageUnavailable, match=r"gs bucket 'jobs-bucket', key 'state.json'"):
        store.read("state.json")
    assert time.monotonic() - started < FAIL_FAST_SECONDS
    store.close()


def test_gcs_injected_client_and_endpoint_is_over_determined(gcs_endpoint: str) -> None:
    client = emulator_client(gcs_endpoint)
    try:
        with pytest.raises(ConfigurationError, match="endpoint_url"):
            GCSStore("jobs-bucket", client=client, endpoint_url=gcs_endpoint)
        with pytest.raises(ConfigurationError, match="project"):
            GCSStore("jobs-bucket", client=client, project="other")
    finally:
        client.close()


def test_gcs_url_has_no_secrets_and_round_trips(gcs_endpoint: str, gcs_bucket: str) -> None:
    host_port = gcs_endpoint.removeprefix("http://")
    store = GCSStore(gcs_bucket, "q", endpoint_url=f"http://user:hunter2@{host_port}")
    assert "hunter2" not in store.url and "user" not in store.url
    assert store.url == f"gs://{gcs_bucket}/q?endpoint_url={gcs_endpoint}"
    reopened = open_store(store.url)
    reopened.put("k", b"v")
    assert store.get("k") == b"v"
    store.close()
    reopened.close()


def test_gcs_storage_emulator_host_env_is_honoured(
    gcs_endpoint: str, gcs_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given only the SDK's own emulator variable (read when the store is built)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_endpoint)
    store = GCSStore(gcs_bucket, "q")
    try:
        version = store.write("k", b"v", if_absent=True)
        assert store.read("k") == Blob(b"v", version)
        # The URL does not pin the endpoint: the variable stays in charge.
        assert store.url == f"gs://{gcs_bucket}/q"
    finally:
        store.close()


# --- S3 ----------------------------------------------------------------------------------------


def test_s3_409_conditional_request_conflict_is_a_lost_condition(dummy_aws_env: None) -> None:
    client = boto3.client("s3", region_name="us-east-1")
    store = S3Store("jobs-bucket", "q", client=client)
    with Stubber(client) as stubber:
        # S3's answer when another conditional write to the key is in flight.
        stubber.add_client_error(
            "put_object",
            service_error_code="ConditionalRequestConflict",
            service_message="A conflicting conditional operation is currently in progress",
            http_status_code=409,
        )
        with pytest.raises(PreconditionFailed) as info:
            store.write("state.json", b"x", if_version='"abc"')
        stubber.assert_no_pending_responses()
    message = str(info.value)
    assert "s3 bucket 'jobs-bucket', key 'q/state.json'" in message
    assert "409 ConditionalRequestConflict" in message
    client.close()


def test_s3_missing_bucket_is_named(moto_endpoint: str) -> None:
    store = S3Store("objq-no-such-bucket", "q", endpoint_url=moto_endpoint)
    try:
        for attempt in (
            lambda: store.read("state.json"),
            lambda: store.write("state.json", b"x", if_absent=True),
            lambda: store.delete("state.json"),
        ):
            with pytest.raises(BucketNotFound) as info:
                attempt()
            assert "s3 bucket 'objq-no-such-bucket', key 'q/state.json'" in str(info.value)
        with pytest.raises(BucketNotFound, match="objq-no-such-bucket"):
            store.list()
    finally:
        store.close()


def test_s3_unreachable_endpoint_fails_fast(dummy_aws_env: None) -> None:
    store = S3Store("jobs-bucket", endpoint_url=f"http://127.0.0.1:{free_port()}")
    started = time.monotonic()
    with pytest.raises(StorageUnavailable, match=r"s3 bucket 'jobs-bucket', key 'state.json'"):
        store.read("state.json")
    assert time.monotonic() - started < FAIL_FAST_SECONDS
    store.close()


def test_s3_missing_credentials_are_access_denied(
    moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # moto accepts any signature, so only the local "no credentials at all" path is testable.
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    store = S3Store("jobs-bucket", endpoint_url=moto_endpoint)
    with pytest.raises(AccessDenied, match="no AWS credentials"):
        store.read("state.json")
    store.close()


def test_s3_injected_client_and_endpoint_is_over_determined(dummy_aws_env: None) -> None:
    client = boto3.client("s3", region_name="us-east-1")
    try:
        with pytest.raises(ConfigurationError, match="endpoint_url"):
            S3Store("jobs-bucket", client=client, endpoint_url="http://127.0.0.1:9000")
        with pytest.raises(ConfigurationError, match="connect_timeout, region"):
            S3Store("jobs-bucket", client=client, region="eu-west-1", connect_timeout=1.0)
    finally:
        client.close()


def test_s3_url_has_no_secrets_and_round_trips(moto_endpoint: str, s3_bucket: str) -> None:
    host_port = moto_endpoint.removeprefix("http://")
    store = S3Store(
        s3_bucket, "q", endpoint_url=f"http://AKIA:hunter2@{host_port}", region="us-east-1"
    )
    assert store.url == f"s3://{s3_bucket}/q?endpoint_url={moto_endpoint}&region=us-east-1"
    for secret in ("hunter2", "AKIA", DUMMY_AWS_ENV["AWS_SECRET_ACCESS_KEY"]):
        assert secret not in store.url
    reopened = open_store(store.url)
    reopened.put("k", b"v")
    assert store.get("k") == b"v"
    store.close()
    reopened.close()


def test_s3_read_is_one_request(moto_endpoint: str, s3_bucket: str) -> None:
    client = boto3.client("s3", endpoint_url=moto_endpoint)
    sent: list[str] = []
    client.meta.events.register("before-send.s3", lambda request, **_: sent.append(request.url))
    store = S3Store(s3_bucket, "q", client=client)
    version = store.write("state.json", b"{}", if_absent=True)
    sent.clear()
    blob = store.read("state.json")
    # The ETag came from the GET's own response: no HEAD, no second call.
    assert blob is not None and blob.version == version
    assert len(sent) == 1, sent
    client.close()


def test_s3_list_paginates_and_stays_inside_the_prefix(moto_endpoint: str, s3_bucket: str) -> None:
    # Given more keys than one ListObjectsV2 page (1,000) and a sibling prefix 'q2'
    store = S3Store(s3_bucket, "q", endpoint_url=moto_endpoint)
    sibling = S3Store(s3_bucket, "q2", endpoint_url=moto_endpoint)
    client = boto3.client("s3", endpoint_url=moto_endpoint)
    keys = [f"jobs/{n:05d}" for n in range(1005)]
    try:
        with ThreadPoolExecutor(8) as pool:  # boto3 clients are thread-safe
            list(pool.map(lambda k: client.put_object(Bucket=s3_bucket, Key=f"q/{k}"), keys))
        sibling.put("jobs/sibling", b"")
        # Then list walks every page, relative to the store prefix, sorted, and no sibling
        assert store.list() == keys
        assert store.list("jobs/0100") == [f"jobs/0100{n}" for n in range(5)]
        assert sibling.list() == ["jobs/sibling"]
    finally:
        client.close()
        store.close()
        sibling.close()


def test_gcs_list_stays_inside_the_prefix(gcs_endpoint: str, gcs_bucket: str) -> None:
    store = GCSStore(gcs_bucket, "q", endpoint_url=gcs_endpoint)
    sibling = GCSStore(gcs_bucket, "q2", endpoint_url=gcs_endpoint)
    try:
        store.put("b", b"")
        store.put("a/1", b"")
        sibling.put("c", b"")
        assert store.list() == ["a/1", "b"]
        assert sibling.list() == ["c"]
    finally:
        store.close()
        sibling.close()
