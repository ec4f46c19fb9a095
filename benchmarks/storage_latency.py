"""Median read and conditional-write latency per storage backend, as a markdown table.

Run from the repository root::

    python benchmarks/storage_latency.py

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


def _payload(size: int, n: int) -> bytes:
    # Distinct bytes per write, so S3 ETags (content MD5s) change like real state writes do.
    return n.to_bytes(8, "big") + b"x" * (size - 8)


def measure(store: ObjectStore, size: int, iterations: int) -> tuple[float, float]:
    """Return (median read ms, median if_version write ms) for objects of ``size`` bytes."""
    version = store.write(KEY, _payload(size, 0))
    reads: list[float] = []
    writes: list[float] = []
    for n in range(1, WARMUP_ITERATIONS + iterations + 1):
        started = time.perf_counter()
        blob = store.read(KEY)
        read_done = time.perf_counter()
        assert blob is not None and blob.version == version and len(blob.data) == size
        version = store.write(KEY, _payload(size, n), if_version=version)
        write_done = time.perf_counter()
        if n > WARMUP_ITERATIONS:
            reads.append((read_done - started) * 1000)
            writes.append((write_done - read_done) * 1000)
    return statistics.median(reads), statistics.median(writes)


@contextmanager
def backends() -> Iterator[list[tuple[str, Callable[[], ObjectStore]]]]:
    """Start the peers; yield (name, open a store) per backend; stop the peers."""
    with ExitStack() as stack:
        apply_dummy_aws_env()
        moto = start_moto()
        stack.callback(moto.stop)
        gcs = start_fake_gcs(Path(stack.enter_context(tempfile.TemporaryDirectory())))
        stack.callback(gcs.stop)
        s3_bucket, gs_bucket = new_bucket_name(), new_bucket_name()
        create_s3_bucket(moto.endpoint, s3_bucket)
        create_gcs_bucket(gcs.endpoint, gs_bucket)
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        yield [
            ("memory", lambda: open_store("memory://bench")),
            ("file", lambda: open_store(folder.as_uri())),
            ("s3 (moto)", lambda: open_store(f"s3://{s3_bucket}/b?endpoint_url={moto.endpoint}")),
            (
                "gs (fake-gcs-server)",
                lambda: open_store(f"gs://{gs_bucket}/b?endpoint_url={gcs.endpoint}"),
            ),
        ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.parse_args()
    rows = []
    with backends() as stores:
        for name, opener in stores:
            store = opener()
            try:
                for label, size, iterations in CASES:
                    read_ms, write_ms = measure(store, size, iterations)
                    rows.append((name, label, iterations, read_ms, write_ms))
            finally:
                store.close()
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    print(
        f"{os.cpu_count()} CPUs, {platform.machine()}, Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}, load average {load}\n"
    )
    print("| backend | object | iterations | median read (ms) | median CAS write (ms) |")
    print("|---|---|---:|---:|---:|")
    for name, label, iterations, read_ms, write_ms in rows:
        print(f"| {name} | {label} | {iterations} | {read_ms:.3f} | {write_ms:.3f} |")


if __name__ == "__main__":
    main()
