"""What a write budget costs in latency and saves in state writes, beside no budget.

``--threads`` threads enqueue ``--jobs`` jobs between them, evenly paced over ``--seconds``
seconds, each without waiting for its enqueue to land (``Queue.submit``, as a web handler
hands work off); then every enqueue is waited for. The run is made twice on a fresh ``file://``
namespace per run, in the same process: with no budget (the anchor), then with
``--budget`` state writes per second. For each: state writes and their rate over the run, all
conditional writes (the runs a deep queue spills into are written beside the state),
the latency of each enqueue (from submit to durable) at p50 and p99, and the jobs found in the
queue afterwards (nothing may be lost).

    python benchmarks/write_budget.py                       # 10,000 jobs, 8 threads, 1 write/s
    python benchmarks/write_budget.py --mode elected --budget 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from provenance import objq_revision

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from objq_broker import Queue, builders

MODES = {"direct": "off", "elected": "auto"}


def run(
    url: str, *, budget: float | None, jobs: int, threads: int, seconds: float, mode: str
) -> dict[str, Any]:
    with Queue(url, broker=MODES[mode]) as queue:
        queue.declare("work")
        queue.set_write_budget(budget)
        queue.flush()
        writes_before = queue.storage_meter.snapshot().requests["write"]
        state_before = queue.metrics().state_writes
        latencies: list[float] = []
        lock = threading.Lock()
        per_thread = jobs // threads

        def produce(index: int) -> None:
            pending: list[tuple[float, Future[Any]]] = []
            start = time.monotonic()
            for n in range(per_thread):
                due = start + seconds * n / per_thread
                if (pause := due - time.monotonic()) > 0:
                    time.sleep(pause)
                submitted = time.monotonic()
                future = queue.submit(builders.enqueue("work", [f"{index}-{n}".encode()]))
                future.add_done_callback(
                    lambda _, at=submitted: _record(lock, latencies, time.monotonic() - at)
                )
                pending.append((submitted, future))
            for _, future in pending:
                future.result()

        started = time.monotonic()
        workers = [threading.Thread(target=produce, args=(i,)) for i in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        took = time.monotonic() - started
        writes = queue.storage_meter.snapshot().requests["write"] - writes_before
        state_writes = queue.metrics().state_writes - state_before
        found = queue.stats("work").ready
    ordered = sorted(latencies)
    return {
        "budget": budget,
        "writes": writes,
        "state_writes": state_writes,
        "seconds": took,
        "writes_per_second": state_writes / took,
        "p50_ms": 1000 * statistics.median(ordered),
        "p99_ms": 1000 * ordered[int(0.99 * (len(ordered) - 1))],
        "found": found,
        "sent": per_thread * threads,
    }


def _record(lock: threading.Lock, latencies: list[float], value: float) -> None:
    with lock:
        latencies.append(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0, help="how long sending lasts")
    parser.add_argument("--budget", type=float, default=1.0, help="state writes per second")
    parser.add_argument("--mode", choices=sorted(MODES), default="direct")
    args = parser.parse_args()
    print(
        f"objq {objq_revision(Path(__file__).resolve().parent.parent)}; {args.jobs} jobs from "
        f"{args.threads} threads over "
        f"{args.seconds:g} s, {args.mode} mode, file://"
    )
    print(
        "| budget (writes/s) | state writes | state writes/s | all writes (runs too) | run (s) "
        "| p50 latency | p99 latency | jobs found / sent |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for budget in (None, args.budget):
        with tempfile.TemporaryDirectory() as folder:
            row = run(
                Path(folder).as_uri(),
                budget=budget,
                jobs=args.jobs,
                threads=args.threads,
                seconds=args.seconds,
                mode=args.mode,
            )
        print(
            f"| {'none' if budget is None else f'{budget:g}'} | {row['state_writes']} | "
            f"{row['writes_per_second']:.2f} | {row['writes']} | {row['seconds']:.1f} | "
            f"{row['p50_ms']:.0f} ms | {row['p99_ms']:.0f} ms | {row['found']} / {row['sent']} |"
        )


if __name__ == "__main__":
    main()
