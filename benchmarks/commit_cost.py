"""How a commit's cost grows with the backlog: the state is rewritten whole on every commit.

Fills a ``file://`` queue to 1,000, 10,000 and 20,000 Dramatiq-sized messages (237 bytes, so
they stay inside the state), 1,000 per ``enqueue_many``, and times small commits on it in a
process of its own, as a worker: a claim of 10 and the ack of those 10, 20 times, reported as
milliseconds per commit alongside the state object's size and the worker's peak memory.

``--spill-at N`` runs the same with the segmented state's first part on (``docs/segments.md``,
off by default): ready jobs past N per queue leave the state for runs, written once, so the
state written by each commit stays small.

    python benchmarks/commit_cost.py
    python benchmarks/commit_cost.py --depths 1000 10000 100000 --spill-at 1000
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
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


def rounds(url: str, spill_at: int | None, out: Any) -> None:
    """In a process of its own, as a worker: open the queue, time ``ROUNDS`` claims of 10 and
    their acks; report ms per commit and the process's peak RSS in MB."""
    with Queue(url, broker="off", spill_at=spill_at) as queue:
        started = time.perf_counter()
        for _ in range(ROUNDS):
            for delivery in queue.claim("default", 10):  # one commit
                queue.ack(delivery, wait=False)
            queue.flush()  # the acks' commit
        per_commit = (time.perf_counter() - started) / (2 * ROUNDS)
    out.put((per_commit, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", type=int, nargs="+", default=list(DEPTHS))
    parser.add_argument("--spill-at", type=int, default=None)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="objq-commit-cost-"))
    body = message()
    context = mp.get_context("spawn")
    print(f"payload {len(body)} bytes, store file://{folder}, spill at {args.spill_at}")
    print(
        "| jobs queued | filled at (jobs/s) | state KB | ms per commit | worker peak RSS MB |\n"
        "|---:|---:|---:|---:|---:|"
    )
    with Queue(folder.as_uri(), broker="off", spill_at=args.spill_at) as queue:
        queue.declare("default")
        queued = 0
        for depth in args.depths:
            filling = time.perf_counter()
            for start in range(queued, depth, FILL_BATCH):
                queue.enqueue_many("default", [body] * min(FILL_BATCH, depth - start))
            fill_rate = (depth - queued) / (time.perf_counter() - filling)
            queued = depth
            size = (folder / "state.json").stat().st_size
            out = context.Queue()
            worker = context.Process(target=rounds, args=(folder.as_uri(), args.spill_at, out))
            worker.start()
            per_commit, rss = out.get()
            worker.join()
            queued -= 10 * ROUNDS
            print(
                f"| {depth:,} | {fill_rate:,.0f} | {size / 1e3:,.1f} | {per_commit * 1000:.1f} "
                f"| {rss:,.0f} |"
            )


if __name__ == "__main__":
    main()
