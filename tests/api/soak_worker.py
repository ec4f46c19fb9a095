"""A producer or consumer process for the multi-process soak tests (run as a script)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from objq_broker import Queue
from objq_broker.storage import open_store
from objq_broker.storage.faulty import FaultyStore

QUEUE = "soak"


def open_queue(url: str, faults: float, seed: int, spill_at: int | None) -> Queue:
    options: dict[str, Any] = {"commit_deadline_seconds": 120.0}
    if spill_at is not None:  # otherwise the library's bound
        options["spill_at"] = spill_at
    if faults:
        store = FaultyStore(open_store(url), seed=seed, error_rate=faults, landed_rate=faults)
        return Queue(store=store, **options)
    return Queue(url, **options)


def produce(queue: Queue, name: str, count: int, batch: int) -> None:
    sent = 0
    while sent < count:
        size = min(batch, count - sent)
        payloads = [f"{name}-{sent + i}".encode() for i in range(size)]
        if size == 1:
            queue.enqueue(QUEUE, payloads[0])
        else:
            queue.enqueue_many(QUEUE, payloads)
        sent += size


def consume(queue: Queue, log_path: Path, stop_path: Path, lease: float) -> None:
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    queue.declare(QUEUE)  # consumers may start before the first enqueue
    try:
        while True:
            deliveries = queue.claim(QUEUE, 20, lease=lease, timeout=0.5)
            if not deliveries:
                if stop_path.exists():
                    return
                continue
            for delivery in deliveries:
                # Record before acking: at-least-once means a crash here redelivers, never loses.
                os.write(fd, delivery.payload + b"\n")
                queue.ack(delivery, wait=False)
    finally:
        os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["produce", "consume"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--log", type=Path)
    parser.add_argument("--stop", type=Path)
    parser.add_argument("--lease", type=float, default=3.0)
    parser.add_argument("--faults", type=float, default=0.0)
    parser.add_argument("--spill-at", type=int, default=None)
    args = parser.parse_args()
    queue = open_queue(args.url, args.faults, seed=hash(args.name) & 0xFFFF, spill_at=args.spill_at)
    started = time.monotonic()
    try:
        if args.role == "produce":
            produce(queue, args.name, args.count, args.batch)
        else:
            assert args.log is not None and args.stop is not None
            consume(queue, args.log, args.stop, args.lease)
    finally:
        queue.close()
    print(f"{args.name}: done in {time.monotonic() - started:.1f} s", flush=True)


if __name__ == "__main__":
    main()
