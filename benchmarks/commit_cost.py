"""How a commit's cost grows with the backlog.

Fills a ``file://`` queue to 1,000, 10,000 and 20,000 Dramatiq-sized messages (237 bytes, so
they stay inside the state; ``--payload-bytes`` for others), 1,000 per ``enqueue_many``, and
times small commits on it in a process of its own, as a worker: a claim of 10 and the ack of
those 10, 20 times, reported as milliseconds per commit alongside the state object's size (what
every commit writes) and the worker's peak memory. ``--in-flight N``: the worker first claims N
(filled on top of each depth) and holds them while it is timed (their leases live in the state).

The segmented state (``docs/runs.md``) is on, with the library's bound unless
``--spill-at N`` says otherwise; ``--no-spill`` measures the state as one object.

    python benchmarks/commit_cost.py
    python benchmarks/commit_cost.py --depths 1000 10000 100000 1000000 --payload-bytes 1024 \
        --in-flight 1000
"""

from __future__ import annotations

import argparse
import base64
import json
import multiprocessing as mp
import os
import resource
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from objq_broker import Queue

DEPTHS = (1_000, 10_000, 20_000)
ROUNDS = 20
#: Jobs per ``enqueue_many`` while filling (as a bulk producer would send them).
FILL_BATCH = 1000


def message() -> bytes:
    return json.dumps(
        {
            "queue_name": "default",
            "actor_name": "noop",
            "args": [1],
            "kwargs": {},
            "options": {"redis_message_id": str(uuid.uuid4())},
            "message_id": str(uuid.uuid4()),
            "message_timestamp": int(time.time() * 1000),
        }
    ).encode()


def payload(size: int) -> bytes:
    """``size`` bytes of ASCII text (base64 of random bytes), as a JSON producer sends."""
    return base64.b64encode(os.urandom(size))[:size]


def rounds(url: str, options: dict[str, Any], in_flight: int, out: Any) -> None:
    """In a process of its own, as a worker: open the queue, claim ``in_flight`` jobs and hold
    them, time ``ROUNDS`` claims of 10 and their acks, give the held ones back; report ms per
    commit, the state's size while they were held, and the process's peak RSS in MB."""
    with Queue(url, broker="off", **options) as queue:
        held = queue.claim("default", in_flight, lease=3600) if in_flight else []
        started = time.perf_counter()
        for _ in range(ROUNDS):
            for delivery in queue.claim("default", 10):  # one commit
                queue.ack(delivery, wait=False)
            queue.flush()  # the acks' commit
        per_commit = (time.perf_counter() - started) / (2 * ROUNDS)
        size = (Path(url.removeprefix("file://")) / "state.json").stat().st_size
        if held:
            queue.release(held)
    out.put((per_commit, size, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", type=int, nargs="+", default=list(DEPTHS))
    parser.add_argument(
        "--spill-at", type=int, default=None, help="the bound (default: the library's)"
    )
    parser.add_argument("--no-spill", action="store_true", help="keep the state in one object")
    parser.add_argument(
        "--payload-bytes", type=int, default=None, help="default: a Dramatiq message"
    )
    parser.add_argument("--in-flight", type=int, default=0, help="jobs the worker holds")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="objq-commit-cost-"))
    body = message() if args.payload_bytes is None else payload(args.payload_bytes)
    options: dict[str, Any] = {}
    if args.no_spill or args.spill_at is not None:
        options["spill_at"] = None if args.no_spill else args.spill_at
    context = mp.get_context("spawn")
    spill = "never" if args.no_spill else args.spill_at or "the library's bound"
    print(
        f"payload {len(body)} bytes, store file://{folder}, spill at {spill}, "
        f"{args.in_flight} in flight while timed"
    )
    print(
        "| jobs queued | filled at (jobs/s) | state KB | ms per commit | worker peak RSS MB |\n"
        "|---:|---:|---:|---:|---:|"
    )
    with Queue(folder.as_uri(), broker="off", **options) as queue:
        queue.declare("default")
        queued = 0  # jobs waiting, the ones the worker holds while timed included
        for depth in args.depths:
            target = depth + args.in_flight  # the worker holds in_flight: depth stay queued
            filling = time.perf_counter()
            for start in range(queued, target, FILL_BATCH):
                queue.enqueue_many("default", [body] * min(FILL_BATCH, target - start))
            fill_rate = (target - queued) / (time.perf_counter() - filling)
            queued = target
            out = context.Queue()
            worker = context.Process(
                target=rounds, args=(folder.as_uri(), options, args.in_flight, out)
            )
            worker.start()
            per_commit, size, rss = out.get()
            worker.join()
            queued -= 10 * ROUNDS
            print(
                f"| {depth:,} | {fill_rate:,.0f} | {size / 1e3:,.1f} | {per_commit * 1000:.1f} "
                f"| {rss:,.0f} |"
            )


if __name__ == "__main__":
    main()
