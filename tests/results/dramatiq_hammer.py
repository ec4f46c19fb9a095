"""Threads that hammer one of Dramatiq's rate limiters on an objq store, in this process or in
a child one (``python -m tests.results.dramatiq_hammer URL KIND THREADS``).

A child prints ``ready``, reads ``START STOP`` (``time.time()`` values) from stdin, hammers
from START until STOP, and prints the JSON list of the slots it got, each as a ``[from, to]``
interval within the time it held the slot. The test merges every process's lists and checks
the limiter's promise on them.
"""

from __future__ import annotations

import json
import sys
import threading
import time

from dramatiq.rate_limits import (
    BucketRateLimiter,
    ConcurrentRateLimiter,
    RateLimiter,
    WindowRateLimiter,
)

from objq_broker.results.dramatiq import ObjqRateLimiterBackend

#: Slots of the window, bucket and sum limiters: each wider than any run, so every slot taken
#: in a run counts against one limit.
LIMIT = 5
#: Slots of the concurrent limiter, and how long each is held (seconds).
CONCURRENT_LIMIT = 2
HOLD_SECONDS = 0.02
#: The keys the "sum" kind spreads its increments over, all summed against LIMIT.
SUM_KEYS = ["summed@0", "summed@1", "summed@2"]

Interval = tuple[float, float]


def limiter(backend: ObjqRateLimiterBackend, kind: str) -> RateLimiter:
    if kind == "window":
        return WindowRateLimiter(backend, "window", limit=LIMIT, window=3600)
    if kind == "bucket":
        return BucketRateLimiter(backend, "bucket", limit=LIMIT, bucket=3_600_000)
    if kind == "concurrent":
        return ConcurrentRateLimiter(backend, "concurrent", limit=CONCURRENT_LIMIT, ttl=60_000)
    raise ValueError(f"unknown limiter kind {kind!r}")


def _attempt(backend: ObjqRateLimiterBackend, kind: str, turn: int) -> Interval | None:
    """One try at a slot. When got: an interval within the time it was held (taken after the
    limiter's ``acquire`` let it in and before it released it), else None."""
    if kind == "sum":
        key = SUM_KEYS[turn % len(SUM_KEYS)]
        if not backend.incr_and_sum(key, lambda: SUM_KEYS, 1, LIMIT, 60_000):
            return None
        now = time.time()
        return (now, now)
    with limiter(backend, kind).acquire(raise_on_failure=False) as acquired:
        if not acquired:
            return None
        held_from = time.time()
        if kind == "concurrent":
            time.sleep(HOLD_SECONDS)  # hold the slot a while: others must wait for it
        return (held_from, time.time())


def hammer(url: str, kind: str, threads: int, start: float, stop: float) -> list[Interval]:
    """Try for slots from ``threads`` threads between ``start`` and ``stop``; the intervals
    of the slots got (see ``_attempt``)."""
    backend = ObjqRateLimiterBackend(url=url, poll_seconds=0.05)
    got: list[Interval] = []
    lock = threading.Lock()

    def run(thread: int) -> None:
        time.sleep(max(0.0, start - time.time()))
        turn = thread
        while time.time() < stop:
            interval = _attempt(backend, kind, turn)
            if interval is not None:
                with lock:
                    got.append(interval)
            turn += 1

    workers = [threading.Thread(target=run, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return got


def main(argv: list[str]) -> None:
    url, kind, threads = argv[0], argv[1], int(argv[2])
    print("ready", flush=True)
    start, stop = (float(field) for field in sys.stdin.readline().split())
    print(json.dumps(hammer(url, kind, threads, start, stop)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
