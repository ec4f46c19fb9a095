"""Storage requests per 1,000 jobs, by kind, in direct mode and with the elected broker.

One producer enqueues ``--jobs`` jobs one at a time (as an application's ``send()`` or
``delay()`` does), while ``--workers`` workers each claim up to ``--prefetch`` at a time and ack
each job as they go (``wait=False``, as the Dramatiq and Celery integrations do). Every role
has a ``Queue`` of its own (its own commit loop or broker client, as separate processes would),
on one namespace of a SeaweedFS S3 server started on 127.0.0.1. In ``elected`` mode the roles
elect one of themselves to commit for all (``broker="auto"``); in ``direct`` mode each commits
by compare-and-set itself (``broker="off"``).

Every role's store is wrapped by one counter, so each storage call is counted once as the
request it makes on S3: ``read``/``get`` a GET, ``write``/``put`` a PUT, ``delete`` a DELETE,
a listing one LIST per 1,000 keys. Requests are also split by what they name (the state
object, bodies objects, runs, the archive, the sweep marker). Dollars are at S3 Standard list
prices (us-east-1): GET $0.0004 per 1,000, PUT and LIST $0.005 per 1,000, DELETE free.

    python benchmarks/requests_per_job.py                        # 1,000 jobs, 2 workers
    python benchmarks/requests_per_job.py --jobs 200 --payload-bytes 1000
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from provenance import objq_revision

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests' helpers
from objq_broker import Queue
from objq_broker.storage import Blob, ObjectStore, open_store
from objq_broker.storage.base import Listing
from tests.support import servers

#: Dollars per 1,000 requests of each kind (S3 Standard, us-east-1 list prices).
PRICE_PER_1000_USD = {"GET": 0.0004, "PUT": 0.005, "LIST": 0.005, "DELETE": 0.0}
VERBS = ("GET", "PUT", "LIST", "DELETE")
#: Keys a LIST request returns at most (S3 and GCS pages).
LIST_PAGE_KEYS = 1000
MODES = {"direct": "off", "elected": "auto"}


def key_kind(key: str) -> str:
    """What a key names, for the breakdown."""
    if key == "state.json":
        return "state"
    return key.split("/", 1)[0] if "/" in key else key


class CountingStore:
    """An :class:`ObjectStore` that counts each call as the request it makes (thread-safe)."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.counts: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()

    def _count(self, verb: str, key: str, n: int = 1) -> None:
        with self._lock:
            self.counts[(verb, key_kind(key))] += n

    @property
    def url(self) -> str:
        return self.inner.url

    def read(self, key: str) -> Blob | None:
        self._count("GET", key)
        return self.inner.read(key)

    def write(
        self, key: str, data: bytes, *, if_version: str | None = None, if_absent: bool = False
    ) -> str:
        self._count("PUT", key)
        return self.inner.write(key, data, if_version=if_version, if_absent=if_absent)

    def put(self, key: str, data: bytes) -> str:
        self._count("PUT", key)
        return self.inner.put(key, data)

    def get(self, key: str) -> bytes:
        self._count("GET", key)
        return self.inner.get(key)

    def delete(self, key: str) -> None:
        self._count("DELETE", key)
        self.inner.delete(key)

    def list(self, prefix: str = "") -> list[str]:
        keys = self.inner.list(prefix)
        self._count("LIST", prefix or "(all)", max(1, math.ceil(len(keys) / LIST_PAGE_KEYS)))
        return keys

    def list_meta(self, prefix: str = "") -> Listing:
        found = self.inner.list_meta(prefix)
        self._count("LIST", prefix or "(all)", max(1, math.ceil(len(found) / LIST_PAGE_KEYS)))
        return found

    def close(self) -> None:
        self.inner.close()


def run_mode(mode: str, url: str, args: argparse.Namespace) -> dict[str, Any]:
    """Enqueue, claim and ack ``args.jobs`` jobs in ``mode``; the counts and the time."""
    store = CountingStore(open_store(url))
    broker = MODES[mode]
    producer = Queue(store=store, broker=broker)
    workers = [Queue(store=store, broker=broker) for _ in range(args.workers)]
    producer.declare("q")
    body = b"x" * args.payload_bytes
    acked = [0]
    lock = threading.Lock()
    done = threading.Event()

    def work(queue: Queue) -> None:
        while not done.is_set():
            for delivery in queue.claim("q", args.prefetch, timeout=0.5):
                queue.ack(delivery, wait=False)
                with lock:
                    acked[0] += 1
                    if acked[0] >= args.jobs:
                        done.set()

    started = time.monotonic()
    threads = [threading.Thread(target=work, args=(w,)) for w in workers]
    for thread in threads:
        thread.start()
    for _ in range(args.jobs):
        producer.enqueue("q", body)
    if not done.wait(args.timeout):
        raise RuntimeError(f"{mode}: only {acked[0]} of {args.jobs} jobs acked in {args.timeout} s")
    for thread in threads:
        thread.join()
    for queue in [*workers, producer]:
        queue.close()
    seconds = time.monotonic() - started
    with Queue(store=open_store(url), broker="off", gc_interval_seconds=None) as check:
        stats = check.stats("q")
        assert stats.ready == stats.in_flight == stats.dead == 0, stats
    store.inner.close()
    return {"mode": mode, "seconds": seconds, "counts": store.counts}


def table(results: list[dict[str, Any]], jobs: int) -> str:
    per = 1000 / jobs
    lines = [
        "| mode | jobs | seconds | GET | PUT | LIST | DELETE | requests per 1,000 jobs "
        "(GET / PUT / LIST / DELETE) | S3 $ per million jobs |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for result in results:
        counts: Counter[tuple[str, str]] = result["counts"]
        verbs = {verb: sum(n for (v, _), n in counts.items() if v == verb) for verb in VERBS}
        dollars = sum(verbs[v] * per * 1000 * PRICE_PER_1000_USD[v] / 1000 for v in VERBS)
        scaled = " / ".join(f"{verbs[v] * per:,.0f}" for v in VERBS)
        lines.append(
            f"| {result['mode']} | {jobs:,} | {result['seconds']:.1f} | "
            + " | ".join(f"{verbs[v]:,}" for v in VERBS)
            + f" | {scaled} | {dollars:.2f} |"
        )
    return "\n".join(lines)


def breakdown(results: list[dict[str, Any]], jobs: int) -> str:
    """Requests per 1,000 jobs by kind and by what they name."""
    per = 1000 / jobs
    names = sorted({name for r in results for (_, name) in r["counts"]})
    lines = [
        "| mode | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for result in results:
        counts: Counter[tuple[str, str]] = result["counts"]
        cells = []
        for name in names:
            parts = [f"{v} {counts[(v, name)] * per:,.0f}" for v in VERBS if counts[(v, name)]]
            cells.append(", ".join(parts) or "-")
        lines.append(f"| {result['mode']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--prefetch", type=int, default=10, help="jobs per claim (10)")
    parser.add_argument("--payload-bytes", type=int, default=100)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    servers.apply_dummy_aws_env()
    seaweedfs = servers.start_seaweedfs()
    try:
        results = []
        for mode in args.modes:
            bucket = servers.new_bucket_name()
            servers.create_s3_bucket(seaweedfs.endpoint, bucket)
            url = f"s3://{bucket}/ns?endpoint_url={seaweedfs.endpoint}"
            results.append(run_mode(mode, url, args))
    finally:
        seaweedfs.stop()
    root = Path(__file__).resolve().parent.parent
    print(
        f"# requests per job on SeaweedFS; {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; "
        f"{objq_revision(root)}; Python {platform.python_version()}; "
        f"{args.workers} workers, claims of {args.prefetch}, {args.payload_bytes}-byte "
        f"payloads; load average {os.getloadavg()[0]:.2f}"
    )
    print(table(results, args.jobs))
    print()
    print(breakdown(results, args.jobs))


if __name__ == "__main__":
    main()
