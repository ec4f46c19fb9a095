"""A worker process of the group-order test (run as a script): claims one job at a time,
logs when each attempt starts and how it ends, and fails some attempts on purpose."""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from objq_broker import LeaseLost, Queue

QUEUE = "ordered"


def work(queue: Queue, log: int, stop: Path, fail_rate: float, rng: random.Random) -> None:
    while True:
        deliveries = queue.claim(QUEUE, 1, timeout=0.5)
        if not deliveries:
            if stop.exists():
                return
            continue
        [delivery] = deliveries
        job = delivery.job
        index = delivery.payload.decode()
        # Logged before anything is settled: an attempt its worker dies in has a start only.
        os.write(log, f"start {job.group} {index} {job.id} {time.time()}\n".encode())
        time.sleep(rng.uniform(0.0, 0.004))
        failed = rng.random() < fail_rate
        ended = "fail" if failed else "done"
        os.write(log, f"{ended} {job.group} {index} {job.id} {time.time()}\n".encode())
        try:
            if failed:
                queue.nack(delivery, error="failed on purpose")
            else:
                queue.ack(delivery)
        except LeaseLost:  # it expired meanwhile (a broker moving, say): it runs again
            os.write(log, f"lost {job.group} {index} {job.id} {time.time()}\n".encode())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--stop", type=Path, required=True)
    parser.add_argument("--fail-rate", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    log = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        with Queue(args.url) as queue:
            work(queue, log, args.stop, args.fail_rate, random.Random(args.seed))
    finally:
        os.close(log)


if __name__ == "__main__":
    main()
