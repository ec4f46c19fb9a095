"""A noisy neighbour: one tenant's backlog against ten quiet tenants, with groups and without.

Tenant A enqueues 20,000 short jobs; as 8 worker threads start on them, ten other tenants
enqueue 20 jobs each. Measured, in one run for each way: the quiet tenants' dwell (enqueue to
start) as median and p99, and A's throughput while its backlog drains. With groups, each job
names its tenant (``group=``) and claims take the group with the fewest jobs in flight first
(``docs/groups.md``); without, the queue is plain priority-then-FIFO.

    python benchmarks/noisy_neighbour.py                     # memory://, both ways
    python benchmarks/noisy_neighbour.py --url file:///tmp/nn --jobs 5000
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import uuid
from dataclasses import dataclass, field

from objq_broker import Queue

QUEUE = "work"
QUIET_TENANTS = 10
QUIET_JOBS = 20
WORKERS = 8
#: What a short job does: a little more than nothing.
WORK_SECONDS = 0.001


@dataclass
class Outcome:
    """What one way's run measured."""

    quiet_dwell: list[float] = field(default_factory=list)
    big_started: int = 0
    big_seconds: float = 0.0

    def line(self, name: str) -> str:
        dwell = sorted(self.quiet_dwell)
        p99 = dwell[min(len(dwell) - 1, int(len(dwell) * 0.99))]
        rate = self.big_started / self.big_seconds if self.big_seconds else 0.0
        return (
            f"{name:>14}: quiet dwell median {statistics.median(dwell) * 1000:8.1f} ms, "
            f"p99 {p99 * 1000:8.1f} ms; A's throughput {rate:8,.0f} jobs/s"
        )


def run(url: str, jobs: int, grouped: bool) -> Outcome:
    outcome = Outcome()
    with Queue(url, broker="off") as queue:
        queue.declare(QUEUE)
        for start in range(0, jobs, 1000):
            count = min(1000, jobs - start)
            queue.enqueue_many(QUEUE, [b"A"] * count, group="A" if grouped else None)
        workers = Workers(queue, outcome, jobs + QUIET_TENANTS * QUIET_JOBS)
        threads = [threading.Thread(target=workers.work) for _ in range(WORKERS)]
        for thread in threads:
            thread.start()
        time.sleep(0.2)  # A's backlog is draining
        for tenant in range(QUIET_TENANTS):
            for _ in range(QUIET_JOBS):
                queue.enqueue(QUEUE, b"quiet", group=f"T{tenant}" if grouped else None)
        for thread in threads:
            thread.join()
    return outcome


class Workers:
    """Worker threads' shared tally: they stop once ``left`` jobs are done."""

    def __init__(self, queue: Queue, outcome: Outcome, left: int) -> None:
        self.queue, self.outcome, self.left = queue, outcome, left
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.started_at = time.monotonic()

    def work(self) -> None:
        while not self.done.is_set():
            for delivery in self.queue.claim(QUEUE, 1, timeout=0.2):
                began = time.time()
                time.sleep(WORK_SECONDS)
                self.queue.ack(delivery)
                self.count(delivery.job.payload, began - delivery.job.enqueued_at)

    def count(self, payload: bytes, dwell: float) -> None:
        with self.lock:
            if payload == b"A":
                self.outcome.big_started += 1
                self.outcome.big_seconds = time.monotonic() - self.started_at
            else:
                self.outcome.quiet_dwell.append(dwell)
            self.left -= 1
            if self.left == 0:
                self.done.set()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=None, help="a store URL (default: a fresh memory://)")
    parser.add_argument("--jobs", type=int, default=20_000, help="tenant A's backlog")
    args = parser.parse_args()
    for grouped in (True, False):
        url = args.url or f"memory://noisy-{uuid.uuid4().hex}"
        if args.url:
            url = f"{args.url.rstrip('/')}/{uuid.uuid4().hex}"
        print(run(url, args.jobs, grouped).line("groups" if grouped else "no groups"), flush=True)


if __name__ == "__main__":
    main()
