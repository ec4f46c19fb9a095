"""``objq demo`` (or ``python -m objq_broker``): objq working, start to end, in a few seconds.

On a local directory (``./objq-data`` unless ``--url`` names another store; ``$OBJQ_URL`` is
deliberately ignored, as the demo empties its queue first) it declares the queue ``demo``,
enqueues a few thousand jobs, some delayed, some failing once and some always failing, drains
them with worker threads behind a live progress bar, and ends with the status table and the
throughput.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import click

from objq_broker.cli.commands import command, objq, remember
from objq_broker.cli.context import Context
from objq_broker.cli.output import counted
from objq_broker.cli.values import MAX_DEMO_JOBS, MAX_THREADS, whole
from objq_broker.queue import Delivery, Queue

#: Where the demo keeps its queue when no URL is given: a folder in the working directory.
DEFAULT_DEMO_URL = "file://objq-data"
DEMO_URL_HELP = (
    "store URL (default: ./objq-data; $OBJQ_URL is not used, so the demo never empties a real "
    "queue by accident)"
)
DEMO_QUEUE = "demo"
DEFAULT_JOBS = 3000
DEFAULT_WORKERS = 4
#: Attempts a demo job gets; the jobs bound to fail use them all, then are dead-lettered.
DEMO_MAX_ATTEMPTS = 3
#: Seconds the delayed tenth of the jobs waits before it may run.
DEMO_DELAY_SECONDS = 1.0
#: Jobs one worker claims at a time.
CLAIM_BATCH = 20


@dataclass
class Counts:
    done: int = 0
    dead: int = 0
    retries: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, outcome: str) -> None:
        with self.lock:
            setattr(self, outcome, getattr(self, outcome) + 1)


def _handle(queue: Queue, delivery: Delivery, counts: Counts) -> None:
    payload, attempt = delivery.payload, delivery.job.attempts
    if payload.startswith(b"fail") or (payload.startswith(b"flaky") and attempt == 1):
        error = "always fails" if payload.startswith(b"fail") else "fails on its first attempt"
        queue.nack(delivery, error=error, wait=False)
        counts.add("dead" if attempt >= DEMO_MAX_ATTEMPTS else "retries")
    else:
        queue.ack(delivery, wait=False)
        counts.add("done")


def _work(queue: Queue, counts: Counts, stop: threading.Event) -> None:
    while not stop.is_set():
        for delivery in queue.claim(DEMO_QUEUE, CLAIM_BATCH, timeout=0.2):
            _handle(queue, delivery, counts)


def _payloads(jobs: int) -> dict[str, list[bytes]]:
    failing = max(jobs // 100, 1)
    flaky = max(jobs // 100, 1)
    delayed = max(jobs // 10, 1)
    normal = max(jobs - failing - flaky - delayed, 0)
    return {
        "normal": [f"job {i}".encode() for i in range(normal)],
        "delayed": [f"later {i}".encode() for i in range(delayed)],
        "failing": [f"fail {i}".encode() for i in range(failing)],
        "flaky": [f"flaky {i}".encode() for i in range(flaky)],
    }


def _note(counts: Counts) -> str:
    return f"{counts.retries:,} retried, {counts.dead:,} dead"


def run(url: str, jobs: int, workers: int, *, progress: bool = True) -> dict[str, Any]:
    """Enqueue and drain the demo jobs on ``url``; returns what happened."""
    from objq_broker.cli.output import progress as bar

    kinds = _payloads(jobs)
    total = sum(len(p) for p in kinds.values())
    with Queue(url) as queue:
        settings = {
            "max_attempts": DEMO_MAX_ATTEMPTS,
            "backoff_base_seconds": 0.1,
            "backoff_cap_seconds": 1.0,
        }
        if not queue.declare(DEMO_QUEUE, **settings):
            queue.configure(DEMO_QUEUE, **settings)
        queue.purge(DEMO_QUEUE)  # a rerun starts from an empty queue
        queue.purge_dead(DEMO_QUEUE)
        started = time.monotonic()
        for start in range(0, len(kinds["normal"]), 500):
            queue.enqueue_many(DEMO_QUEUE, kinds["normal"][start : start + 500])
        queue.enqueue_many(DEMO_QUEUE, kinds["delayed"], delay=DEMO_DELAY_SECONDS)
        queue.enqueue_many(DEMO_QUEUE, kinds["failing"] + kinds["flaky"])
        if progress:
            print(
                f"objq demo on {queue.store.url}: enqueued {total:,} jobs "
                f"({len(kinds['delayed'])} delayed {DEMO_DELAY_SECONDS:g} s, "
                f"{len(kinds['flaky'])} failing once, {len(kinds['failing'])} always failing) "
                f"in {time.monotonic() - started:.2f} s",
                flush=True,
            )
        counts, stop = Counts(), threading.Event()
        threads = [
            threading.Thread(target=_work, args=(queue, counts, stop), daemon=True)
            for _ in range(workers)
        ]
        for thread in threads:
            thread.start()
        with bar(total, counted(workers, "worker"), enabled=progress) as advance:
            while counts.done + counts.dead < total:
                advance(counts.done + counts.dead, _note(counts))
                time.sleep(0.05)
            advance(total, _note(counts))
        stop.set()
        for thread in threads:
            thread.join()
        queue.flush()
        elapsed = time.monotonic() - started
        metrics = queue.metrics()
        return {
            "url": queue.store.url,
            "jobs": total,
            "done": counts.done,
            "dead": counts.dead,
            "retried": counts.retries,
            "workers": workers,
            "seconds": round(elapsed, 3),
            "jobs_per_second": round(total / elapsed, 1),
            "state_writes": metrics.state_writes,
            "operations": metrics.ops,
        }


def throughput_line(result: dict[str, Any]) -> str:
    return (
        f"{result['jobs']:,} jobs in {result['seconds']:.1f} s: "
        f"{result['jobs_per_second']:,.0f} jobs/s with "
        f"{counted(result['workers'], 'worker thread')}, "
        f"{result['state_writes']:,} state writes for {result['operations']:,} operations"
    )


@command(objq, "demo", "a few thousand jobs, start to end")
@click.option("--jobs", type=whole(1, MAX_DEMO_JOBS), default=DEFAULT_JOBS)
@click.option("--workers", type=whole(1, MAX_THREADS), default=DEFAULT_WORKERS)
# Its own --url: it empties its queue before it starts, so it never reads $OBJQ_URL.
@click.option("--url", metavar="URL", help=DEMO_URL_HELP, expose_value=False, callback=remember)
def cmd_demo(ctx: Context) -> int:
    from objq_broker.cli.inspect import status_dict, status_text
    from objq_broker.engine.snapshot import Snapshot
    from objq_broker.storage import open_store

    url = getattr(ctx.args, "url", None) or DEFAULT_DEMO_URL
    result = run(url, ctx.args.jobs, ctx.args.workers, progress=not ctx.json)
    store = open_store(url)
    try:
        status = status_dict(Snapshot.read(store))
    finally:
        store.close()
    if ctx.json:
        ctx.emit({**result, "status": status}, "")
    else:
        print(status_text(status))
        print(throughput_line(result))
    return 0
