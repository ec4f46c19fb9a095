"""A short run that shows objq working: ``python -m objq_broker [URL]``.

It enqueues a few thousand jobs on a local directory (``./objq-data`` unless a URL is given),
some delayed and some bound to fail, drains them with worker threads, and prints what happened.
"""

from __future__ import annotations

import argparse
import threading
import time

from objq_broker.queue import Queue

#: Where the demo keeps its queue when no URL is given: a folder in the working directory.
DEFAULT_DEMO_URL = "file://objq-data"
DEMO_QUEUE = "demo"


def _work(queue: Queue, done: threading.Event) -> None:
    while not done.is_set():
        for delivery in queue.claim(DEMO_QUEUE, 20, timeout=0.2):
            if delivery.payload.startswith(b"fail"):
                queue.nack(delivery, error="this job always fails", wait=False)
            else:
                queue.ack(delivery, wait=False)


def run(url: str, jobs: int, workers: int) -> str:
    """Enqueue and drain ``jobs`` demo jobs on ``url``; returns the summary printed."""
    with Queue(url) as queue:
        queue.declare(DEMO_QUEUE, max_attempts=2, backoff_base_seconds=0.1)
        queue.purge(DEMO_QUEUE)
        queue.purge_dead(DEMO_QUEUE)
        started = time.monotonic()
        failing = max(jobs // 100, 1)
        delayed = max(jobs // 10, 1)
        normal = jobs - failing - delayed
        for start in range(0, normal, 500):
            count = min(500, normal - start)
            queue.enqueue_many(DEMO_QUEUE, [f"job {start + i}".encode() for i in range(count)])
        queue.enqueue_many(DEMO_QUEUE, [f"later {i}".encode() for i in range(delayed)], delay=1.0)
        queue.enqueue_many(DEMO_QUEUE, [f"fail {i}".encode() for i in range(failing)])
        done = threading.Event()
        threads = [
            threading.Thread(target=_work, args=(queue, done), daemon=True) for _ in range(workers)
        ]
        for thread in threads:
            thread.start()
        while True:
            stats = queue.stats(DEMO_QUEUE)
            if stats.ready + stats.delayed + stats.in_flight == 0:
                break
            time.sleep(0.2)
        done.set()
        for thread in threads:
            thread.join()
        queue.flush()
        elapsed = time.monotonic() - started
        stats = queue.stats(DEMO_QUEUE)
        metrics = queue.metrics()
        return (
            f"objq demo on {queue.store.url}\n"
            f"  {jobs} jobs: {jobs - stats.dead} done, {stats.dead} dead-lettered "
            f"(ready {stats.ready}, delayed {stats.delayed}, in flight {stats.in_flight})\n"
            f"  {jobs / elapsed:,.0f} jobs/s with {workers} worker threads; "
            f"{metrics.state_writes} state writes for {metrics.ops} operations"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m objq_broker", description=__doc__)
    parser.add_argument("url", nargs="?", default=DEFAULT_DEMO_URL)
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args(argv)
    print(run(args.url, args.jobs, args.workers))


if __name__ == "__main__":
    main()
