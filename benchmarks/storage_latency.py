"""Median read, conditional-write and create latency per storage backend, as a markdown table.

Run from the repository root::

    python benchmarks/storage_latency.py
    python benchmarks/storage_latency.py --backends file --iterations 400
    python benchmarks/storage_latency.py --backends file-nofsync --iterations 2000

A read and a replacing write (``if_version``) go to one key, as the state's do; a create
(``if_absent``) makes a new key each time, as results, archive objects and runs are written.

It starts its own peers on 127.0.0.1 (moto's S3 server in this process, fake-gcs-server as a
child process) with the helpers the tests use, so the numbers measure the adapters plus
loopback HTTP, not a network. Memory and file stores need nothing; the file store runs in a
temporary directory with its default fsync on.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the package, and the tests' server helpers

from provenance import objq_revision  # noqa: E402

from objq_broker.storage import ObjectStore, open_store  # noqa: E402
from tests.support.servers import (  # noqa: E402
    apply_dummy_aws_env,
    create_gcs_bucket,
    create_s3_bucket,
    new_bucket_name,
    start_fake_gcs,
    start_moto,
)

#: (label, object size in bytes, timed iterations) for each measured case.
CASES = [("1 KiB", 1024, 50), ("1 MiB", 1024 * 1024, 15)]
#: Untimed iterations first, so connection setup and lazy imports do not count.
WARMUP_ITERATIONS = 3
#: The key every measurement reads and writes.
KEY = "bench/state.json"
#: Where the creates go, one new key each.
NEW_PREFIX = "bench/new/"
BACKENDS = ("memory", "file", "file-nofsync", "s3", "gs")


def _payload(size: int, n: int) -> bytes:
    # Distinct bytes per write, so S3 ETags (content MD5s) change like real state writes do.
    return n.to_bytes(8, "big") + b"x" * (size - 8)


def measure(store: ObjectStore, size: int, iterations: int) -> tuple[float, float, float]:
    """Return (median read, median if_version write, median create) in ms for objects of
    ``size`` bytes."""
    version = store.write(KEY, _payload(size, 0))
    reads: list[float] = []
    writes: list[float] = []
    creates: list[float] = []
    for n in range(1, WARMUP_ITERATIONS + iterations + 1):
        started = time.perf_counter()
        blob = store.read(KEY)
        read_done = time.perf_counter()
        assert blob is not None and blob.version == version and len(blob.data) == size
        version = store.write(KEY, _payload(size, n), if_version=version)
        write_done = time.perf_counter()
        store.write(f"{NEW_PREFIX}{n}", _payload(size, n), if_absent=True)
        create_done = time.perf_counter()
        if n > WARMUP_ITERATIONS:
            reads.append((read_done - started) * 1000)
            writes.append((write_done - read_done) * 1000)
            creates.append((create_done - write_done) * 1000)
    for n in range(1, WARMUP_ITERATIONS + iterations + 1):
        store.delete(f"{NEW_PREFIX}{n}")
    return statistics.median(reads), statistics.median(writes), statistics.median(creates)


@contextmanager
def backends(names: tuple[str, ...]) -> Iterator[list[tuple[str, Callable[[], ObjectStore]]]]:
    """Start the peers ``names`` need; yield (name, open a store) per backend; stop the peers."""
    with ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        found: list[tuple[str, Callable[[], ObjectStore]]] = []
        if "memory" in names:
            found.append(("memory", lambda: open_store("memory://bench")))
        if "file" in names:
            found.append(("file", lambda: open_store(folder.as_uri())))
        if "file-nofsync" in names:
            nofsync = folder / "nofsync"
            nofsync.mkdir()
            found.append(
                ("file, fsync=false", lambda: open_store(f"{nofsync.as_uri()}?fsync=false"))
            )
        if "s3" in names:
            apply_dummy_aws_env()
            moto = start_moto()
            stack.callback(moto.stop)
            s3_bucket = new_bucket_name()
            create_s3_bucket(moto.endpoint, s3_bucket)
            found.append(
                (
                    "s3 (moto)",
                    lambda: open_store(f"s3://{s3_bucket}/b?endpoint_url={moto.endpoint}"),
                )
            )
        if "gs" in names:
            gcs = start_fake_gcs(Path(stack.enter_context(tempfile.TemporaryDirectory())))
            stack.callback(gcs.stop)
            gs_bucket = new_bucket_name()
            create_gcs_bucket(gcs.endpoint, gs_bucket)
            found.append(
                (
                    "gs (fake-gcs-server)",
                    lambda: open_store(f"gs://{gs_bucket}/b?endpoint_url={gcs.endpoint}"),
                )
            )
        yield found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    parser.add_argument(
        "--iterations",
        type=int,
        help="timed iterations per case (default: 50 for 1 KiB, 15 for 1 MiB)",
    )
    args = parser.parse_args()
    rows = []
    with backends(tuple(args.backends)) as stores:
        for name, opener in stores:
            store = opener()
            try:
                for label, size, iterations in CASES:
                    count = args.iterations or iterations
                    read_ms, write_ms, create_ms = measure(store, size, count)
                    rows.append((name, label, count, read_ms, write_ms, create_ms))
            finally:
                store.close()
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    print(
        f"{os.cpu_count()} CPUs, {platform.machine()}, Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}, load average {load}; "
        f"objq {objq_revision(ROOT)}\n"
    )
    print(
        "| backend | object | iterations | median read (ms) | median CAS write (ms) "
        "| median create (ms) |"
    )
    print("|---|---|---:|---:|---:|---:|")
    for name, label, iterations, read_ms, write_ms, create_ms in rows:
        print(
            f"| {name} | {label} | {iterations} | {read_ms:.3f} | {write_ms:.3f} "
            f"| {create_ms:.3f} |"
        )


if __name__ == "__main__":
    main()
