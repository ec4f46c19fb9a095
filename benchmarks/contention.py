"""Many processes on one namespace: do the workers keep pace while producers publish?

Starts 1, 2, 4, 8 (and 16) processes on one store for a fixed window: ``file://`` (a temporary
directory), or ``s3://`` on a SeaweedFS server this script starts (a real S3 server that
enforces conditional writes itself). Half of them
are producers that enqueue one job at a time (as web handlers do); the other half are workers
that claim one job, ack it, and claim again (as a framework worker does). With one process, it
is a producer. Each process counts its calls, failed calls and latencies; at the end the parent
reports jobs enqueued, jobs completed, failed calls, the p99 call latency, the slowest
process's share of its role's mean, and state writes per 1,000 operations.

    python benchmarks/contention.py                      # 1, 2, 4, 8 processes, 8 s each
    python benchmarks/contention.py --processes 4 8 16 --seconds 12 --modes direct broker elected
    python benchmarks/contention.py --stores file seaweedfs --modes direct elected

``direct``: every process runs its own commit loop against the one state object
(``broker="off"``). ``broker``: an ``objq broker`` process commits for all of them
(``Queue(url, broker=address)``). ``elected``: no extra process; the processes elect one of
themselves (``broker="auto"``, the default). State writes are counted from the state's commit
counter, so every mode counts the same way.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import multiprocessing as mp
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provenance import objq_revision

from objq_broker import Queue
from objq_broker.engine.snapshot import Snapshot
from objq_broker.storage import open_store

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests' server helpers
from tests.support.servers import (
    SeaweedFS,
    apply_dummy_aws_env,
    create_s3_bucket,
    new_bucket_name,
    start_seaweedfs,
)

QUEUE = "contention"
PAYLOAD = b'{"task": "noop", "args": [1]}'
#: How long a worker's claim waits for a job before it claims again.
CLAIM_WAIT_SECONDS = 0.5


@dataclass
class Tally:
    role: str
    calls: int = 0
    done: int = 0
    failed: int = 0
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def run_process(
    where: tuple[str, str | None], role: str, start_at: float, seconds: float, out: Any
) -> None:
    """One producer or worker on store ``where[0]``, through broker ``where[1]`` if given."""
    url, broker = where
    tally = Tally(role)
    with Queue(url, broker=broker) as q:
        while time.time() < start_at:
            time.sleep(0.001)
        end = start_at + seconds
        while time.time() < end:
            started = time.perf_counter()
            try:
                if role == "producer":
                    q.enqueue(QUEUE, PAYLOAD)
                    tally.done += 1
                else:
                    found = q.claim(QUEUE, timeout=min(CLAIM_WAIT_SECONDS, end - time.time()))
                    for delivery in found:
                        # As the Dramatiq and Celery integrations do: the ack is durable with
                        # the next commit (a lost ack is a redelivery, as at-least-once allows).
                        q.ack(delivery, wait=False)
                        tally.done += 1
            except Exception as exc:  # counted: a failed call is what this measures
                tally.failed += 1
                tally.errors.append(f"{type(exc).__name__}: {exc}"[:200])
            tally.calls += 1
            tally.latencies.append(time.perf_counter() - started)
    out.put(tally)


def remaining_jobs(url: str) -> int:
    with Queue(url, broker="off") as q:
        stats = q.stats(QUEUE)
        return stats.ready + stats.delayed + stats.in_flight


def start_broker(url: str) -> tuple[subprocess.Popen[bytes], str]:
    command = [sys.executable, "-m", "objq_broker.cli", "broker", "--url", url, "--json"]
    broker = subprocess.Popen(
        [*command, "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    assert broker.stdout is not None
    return broker, json.loads(broker.stdout.readline())["address"]


def commits(url: str) -> int:
    return Snapshot.read(open_store(url)).version


def run_case(processes: int, seconds: float, mode: str, store: str) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="objq-contention-"))
    url = folder.as_uri() if store == "file" else store
    broker, address = start_broker(url) if mode == "broker" else (None, "off")
    if mode == "elected":
        address = "auto"
    try:
        with Queue(url, broker=address) as q:
            q.declare(QUEUE)
        before = commits(url)
        roles = ["producer" if i % 2 == 0 else "worker" for i in range(processes)]
        context = mp.get_context("spawn")
        out = context.Queue()
        start_at = time.time() + 3.0  # every child imported and opened its queue by then
        children = [
            context.Process(target=run_process, args=((url, address), role, start_at, seconds, out))
            for role in roles
        ]
        for child in children:
            child.start()
        tallies: list[Tally] = [out.get(timeout=seconds + 120) for _ in children]
        for child in children:
            child.join()
        writes = commits(url) - before
        return summarise(processes, seconds, tallies, remaining_jobs(url), writes)
    finally:
        if broker is not None:
            broker.terminate()
            broker.wait(30)
        shutil.rmtree(folder, ignore_errors=True)


def summarise(
    processes: int, seconds: float, tallies: list[Tally], left: int, writes: int
) -> dict[str, Any]:
    producers = [t for t in tallies if t.role == "producer"]
    workers = [t for t in tallies if t.role == "worker"]
    enqueued = sum(t.done for t in producers)
    completed = sum(t.done for t in workers)
    latencies = sorted(x for t in tallies for x in t.latencies)
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] if latencies else 0.0
    operations = enqueued + 2 * completed  # a completed job is a claim and an ack
    return {
        "processes": processes,
        "enqueued": enqueued,
        "completed": completed,
        "left": left,
        "failed": sum(t.failed for t in tallies),
        "p99_ms": p99 * 1000,
        "ops_per_s": operations / seconds,
        "writes_per_1000": 1000 * writes / operations if operations else 0.0,
        "slowest_share": min(_share(producers), _share(workers)),
        "errors": sorted({e for t in tallies for e in t.errors})[:3],
    }


def _share(group: list[Tally]) -> float:
    """The slowest member's completed count over its role's mean (1.0 for one member)."""
    if len(group) < 2:
        return 1.0
    mean = statistics.mean(t.done for t in group)
    return min(t.done for t in group) / mean if mean else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument(
        "--modes", nargs="+", choices=["direct", "broker", "elected"], default=["direct"]
    )
    parser.add_argument("--stores", nargs="+", choices=["file", "seaweedfs"], default=["file"])
    args = parser.parse_args()
    root = Path(__file__).resolve().parent.parent
    print(
        f"# contention, {args.seconds:g} s per case; "
        f"{objq_revision(root) or 'objq (not a checkout)'}; Python {platform.python_version()}; "
        f"{os.cpu_count()} CPUs"
    )
    print(
        "| store | mode | processes | enqueued | completed | left at end | failed calls "
        "| p99 (ms) | ops/s | slowest / role mean | state writes per 1,000 ops |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    with contextlib.ExitStack() as stack:
        stores = CaseStores(stack)
        for store, mode, count in itertools.product(args.stores, args.modes, args.processes):
            row = run_case(count, args.seconds, mode, stores.new(store))
            print_row(store, mode, row)


class CaseStores:
    """Where each case runs: ``file`` (the case makes its own folder), or a fresh bucket on a
    SeaweedFS server started on first use and stopped when ``stack`` closes."""

    def __init__(self, stack: contextlib.ExitStack) -> None:
        self.stack = stack
        self.seaweedfs: SeaweedFS | None = None

    def new(self, store: str) -> str:
        if store == "file":
            return "file"
        if self.seaweedfs is None:
            apply_dummy_aws_env()
            self.seaweedfs = start_seaweedfs()
            self.stack.callback(self.seaweedfs.stop)
        bucket = new_bucket_name()
        create_s3_bucket(self.seaweedfs.endpoint, bucket)
        return f"s3://{bucket}/contention?endpoint_url={self.seaweedfs.endpoint}"


def print_row(store: str, mode: str, row: dict[str, Any]) -> None:
    print(
        f"| {store} | {mode} | {row['processes']} | {row['enqueued']:,} | {row['completed']:,} | "
        f"{row['left']:,} | {row['failed']} | {row['p99_ms']:.0f} | {row['ops_per_s']:,.0f} | "
        f"{row['slowest_share']:.2f} | {row['writes_per_1000']:.0f} |",
        flush=True,
    )
    for error in row["errors"]:
        print(f"  error: {error}", file=sys.stderr)


if __name__ == "__main__":
    main()
