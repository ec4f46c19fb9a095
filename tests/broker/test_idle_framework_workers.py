"""Idle Dramatiq and Celery worker processes cost next to no storage requests with the elected
broker, and still wake for a job.

Real ``dramatiq`` and ``celery worker`` processes run the example apps on a SeaweedFS S3
server, each through its own listener of a counting proxy, so the store's bill is counted as S3
would count it. ``benchmarks/idle_requests.py`` is the long version (10 + 10 workers, a minute
per mode, prices). The first tests check the proxy itself: a counter that broke signatures,
conditions or bodies would measure nothing.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING

import boto3
import botocore.exceptions
import pytest

from tests.support.counting_proxy import CountingProxy, Request
from tests.support.idle_fleet import IdleFleet
from tests.support.processes import Children
from tests.support.servers import SEAWEEDFS_PORTS, create_s3_bucket, free_ports, new_bucket_name
from tests.support.waiting import wait_for

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


DRAMATIQ_WORKERS = 4
CELERY_WORKERS = 4
#: Seconds 8 worker processes get to start on a loaded 2-core machine.
STARTUP_TIMEOUT_SECONDS = 300.0
#: Least time between "every worker is ready" and the window (start-up requests end).
SETTLE_SECONDS = 10.0
SETTLE_LIMIT_SECONDS = 120.0
IDLE_SECONDS = 20.0
WAKE_TIMEOUT_SECONDS = 120.0
#: Storage requests an idle elected namespace may make per minute, all processes together. By
#: design it needs two: the broker re-reads the state once every 30 s (EXCLUSIVE_RECHECK_SECONDS,
#: to notice a successor or a direct writer); followers wait on its commit notices over libzmq
#: and never look at storage. Three times that leaves room for one stray request in a short
#: window, while anything that polls per process (8 workers: at least 8 a minute) fails.
MAX_ELECTED_REQUESTS_PER_MINUTE = 6
#: S3 credentials of the SeaweedFS that checks signatures (no session token: weed refuses one).
ACCESS_KEY, SECRET_KEY = "objq-proxy-check", "objq-proxy-check-secret"
CHECK_BUCKET = "proxy-check"


# --- the counting proxy ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def signing_seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A SeaweedFS S3 endpoint that knows one identity, so it checks every signature."""
    workdir = tmp_path_factory.mktemp("seaweedfs-identity")
    config = workdir / "s3.json"
    identity = {
        "name": "checker",
        "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
    }
    config.write_text(json.dumps({"identities": [identity]}))
    (workdir / "data").mkdir()
    ports = dict(zip(SEAWEEDFS_PORTS, free_ports(len(SEAWEEDFS_PORTS)), strict=True))
    binary = shutil.which("weed") or str(Path(sys.executable).parent / "weed")
    command = [
        binary, "server", f"-dir={workdir / 'data'}", f"-s3.config={config}",
        "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-s3", "-master.telemetry=false",
        "-master.volumeSizeLimitMB=16", "-volume.max=0", "-volume.preStopSeconds=0",
        *(f"-{name}={port}" for name, port in ports.items()),
    ]  # fmt: skip
    environ = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    endpoint = f"http://127.0.0.1:{ports['s3.port']}"
    log = workdir / "weed.log"
    with Children() as children:
        weed = children.start(command, env=environ, log=log)

        def bucket_created() -> bool:
            if weed.poll() is not None:
                raise RuntimeError(f"weed exited: {log.read_text(errors='replace')[-2000:]}")
            try:
                s3_client(endpoint).create_bucket(Bucket=CHECK_BUCKET)
            except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError):
                return False  # not serving yet
            return True

        wait_for(bucket_created, STARTUP_TIMEOUT_SECONDS, "SeaweedFS (with an identity) to start")
        yield endpoint
        # weed takes ~15 s to exit on SIGTERM, and its data is thrown away: kill it.
        children.kill(weed)


def s3_client(endpoint: str, secret: str = SECRET_KEY) -> S3Client:
    """A client with explicit credentials (none of the environment's, no session token)."""
    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=secret,
        aws_session_token=None,
    )


def error_code(call: Callable[[], object]) -> str:
    with pytest.raises(botocore.exceptions.ClientError) as caught:
        call()
    return str(caught.value.response["Error"]["Code"])


def test_proxy_keeps_signatures_and_conditional_writes(signing_seaweedfs: str) -> None:
    with CountingProxy(signing_seaweedfs) as proxy:
        # Given a client that signs for the proxy's address, and a server that checks
        s3 = s3_client(proxy.url)
        key, large = "objq/state.json", os.urandom(3 * 1024 * 1024)
        # When it creates, races and updates an object through the proxy
        first = s3.put_object(Bucket=CHECK_BUCKET, Key=key, Body=b"v1", IfNoneMatch="*")["ETag"]
        lost_create = error_code(
            lambda: s3.put_object(Bucket=CHECK_BUCKET, Key=key, Body=b"x", IfNoneMatch="*")
        )
        lost_update = error_code(
            lambda: s3.put_object(Bucket=CHECK_BUCKET, Key=key, Body=b"x", IfMatch='"0000"')
        )
        s3.put_object(Bucket=CHECK_BUCKET, Key=key, Body=large, IfMatch=first)
        body = s3.get_object(Bucket=CHECK_BUCKET, Key=key)["Body"].read()
        listed = s3.list_objects_v2(Bucket=CHECK_BUCKET, Prefix="objq/")["Contents"]
        forged = error_code(
            lambda: s3_client(proxy.url, "wrong").get_object(Bucket=CHECK_BUCKET, Key=key)
        )
        # Then signatures verify, conditions hold, bodies arrive whole, and all is counted
        assert (lost_create, lost_update) == ("PreconditionFailed", "PreconditionFailed")
        assert body == large
        assert [item["Key"] for item in listed] == [key]
        assert forged == "SignatureDoesNotMatch"  # the server does check what it is sent
        assert proxy.snapshot() == Counter(
            {
                Request("default", "PUT", key, 200): 2,
                Request("default", "PUT", key, 412): 2,
                Request("default", "GET", key, 200): 1,
                Request("default", "LIST", "list objq/", 200): 1,
                Request("default", "GET", key, 403): 1,
            }
        )


class _Echo(BaseHTTPRequestHandler):
    """Answers a chunked request with its decoded body, chunked again, in 1,000-byte pieces."""

    protocol_version = "HTTP/1.1"

    def do_PUT(self) -> None:
        assert self.headers["Transfer-Encoding"] == "chunked"
        body = b""
        while size := int(self.rfile.readline().split(b";")[0], 16):
            body += self.rfile.read(size)
            self.rfile.readline()
        assert self.rfile.readline() == b"\r\n"  # no trailers
        self.send_response(201)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for at in range(0, len(body), 1000):
            piece = body[at : at + 1000]
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_proxy_streams_chunked_bodies_both_ways() -> None:
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    try:
        with CountingProxy(f"http://127.0.0.1:{upstream.server_address[1]}") as proxy:
            connection = http.client.HTTPConnection(proxy.url.removeprefix("http://"), timeout=30)
            pieces = [os.urandom(70_000), b"", os.urandom(10)]
            for _ in range(2):  # twice: the connection stays usable after a chunked answer
                connection.request("PUT", "/b/k", body=iter(pieces), encode_chunked=True)
                answer = connection.getresponse()
                assert (answer.status, answer.getheader("Transfer-Encoding")) == (201, "chunked")
                assert answer.read() == b"".join(pieces)
            connection.close()
            assert proxy.snapshot() == Counter({Request("default", "PUT", "k", 201): 2})
    finally:
        upstream.shutdown()
        upstream.server_close()


# --- idle workers ------------------------------------------------------------------------------


def idle_window(endpoint: str, mode: str, workdir: Path) -> tuple[Counter[Request], float]:
    """Requests of 4 Dramatiq and 4 Celery workers over IDLE_SECONDS once settled, and the
    seconds the slower of two jobs sent afterwards took to run."""
    bucket = new_bucket_name()
    create_s3_bucket(endpoint, bucket)
    with (
        CountingProxy(endpoint) as proxy,
        IdleFleet(proxy, bucket=bucket, mode=mode, workdir=workdir) as fleet,
    ):
        fleet.start(dramatiq=DRAMATIQ_WORKERS, celery=CELERY_WORKERS)
        fleet.wait_ready(STARTUP_TIMEOUT_SECONDS)
        fleet.settle(SETTLE_SECONDS, SETTLE_LIMIT_SECONDS)  # an unsettled rate is measured too
        before = fleet.requests()
        fleet.idle(IDLE_SECONDS)
        window = fleet.requests() - before
        wake = fleet.wake(WAKE_TIMEOUT_SECONDS)
        killed = fleet.stop()
    assert not killed, f"workers ignored SIGTERM: {killed}"
    return window, max(wake.dramatiq_seconds, wake.celery_seconds)


def describe(window: Counter[Request]) -> str:
    return "; ".join(
        f"{n} {r.verb} {r.kind} -> {r.status} from {r.listener}" for r, n in window.most_common()
    )


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_idle_elected_workers_make_few_requests_and_still_wake(
    seaweedfs_endpoint: str, tmp_path: Path
) -> None:
    # Given 8 idle worker processes electing a broker; When IDLE_SECONDS pass
    window, woke = idle_window(seaweedfs_endpoint, "elected", tmp_path)
    # Then the whole namespace made at most a few requests a minute
    allowed = int(MAX_ELECTED_REQUESTS_PER_MINUTE * IDLE_SECONDS / 60)
    total = window.total()
    print(f"\nelected: {total} requests in {IDLE_SECONDS:g} s idle ({describe(window)}); "
          f"woke in {woke:.2f} s")  # fmt: skip
    assert total <= allowed, f"{total} requests in {IDLE_SECONDS:g} s: {describe(window)}"
    # ... and a job sent afterwards still ran (idle_window waited for it)
