"""The enqueue -> claim -> ack cycle at several concurrencies, through ``Queue`` (N threads)
and ``AsyncQueue`` (N tasks on one event loop), without the anchor: for comparing two trees
of objq on the same machine (``queue_throughput.py`` sets it beside jqueue).

    python benchmarks/cycle_concurrency.py                          # memory, 1/10/50
    python benchmarks/cycle_concurrency.py --storage file-nofsync
    PYTHONPATH=<older checkout> python benchmarks/cycle_concurrency.py   # another tree
    python benchmarks/cycle_concurrency.py --way tasks --option archive_tail_bytes=65536

Each case runs 300 unrecorded cycles first, then ``--cycles``; printed: cycles/s and the
state and archive writes per 1,000 cycles.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from objq_broker import AsyncQueue, Queue

PAYLOAD = b"x" * 1024


@contextmanager
def location(storage: str) -> Iterator[tuple[str, dict[str, object]]]:
    if storage == "memory":
        yield f"memory://cycles-{uuid.uuid4().hex}", {}
        return
    folder = tempfile.mkdtemp(prefix="objq-cycles-")
    try:
        yield Path(folder).as_uri(), {"fsync": storage == "file"}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def threads(url: str, options: dict[str, object], concurrency: int, cycles: int) -> str:
    queue = Queue(url, **options)  # type: ignore[arg-type]
    queue.declare("q")

    def work(count: int) -> None:
        for _ in range(count):
            queue.enqueue("q", PAYLOAD)
            deliveries = queue.claim("q")
            while not deliveries:  # another thread took the job this one enqueued
                deliveries = queue.claim("q")
            queue.ack(deliveries[0])

    def timed(count: int) -> tuple[float, int, int]:
        before = queue.metrics()
        state, archive = before.state_writes, before.archive_writes
        pool = [
            threading.Thread(target=work, args=(count // concurrency,)) for _ in range(concurrency)
        ]
        started = time.perf_counter()
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()
        after = queue.metrics()
        took = time.perf_counter() - started
        return took, after.state_writes - state, after.archive_writes - archive

    try:
        timed(300)
        return report(cycles, *timed(cycles))
    finally:
        queue.close()


def tasks(url: str, options: dict[str, object], concurrency: int, cycles: int) -> str:
    async def run() -> str:
        async with AsyncQueue(url, **options) as queue:  # type: ignore[arg-type]
            await queue.declare("q")

            async def work(count: int) -> None:
                for _ in range(count):
                    await queue.enqueue("q", PAYLOAD)
                    deliveries = await queue.claim("q")
                    while not deliveries:
                        deliveries = await queue.claim("q")
                    await queue.ack(deliveries[0])

            async def timed(count: int) -> tuple[float, int, int]:
                before = queue.metrics()
                state, archive = before.state_writes, before.archive_writes
                started = time.perf_counter()
                await asyncio.gather(*(work(count // concurrency) for _ in range(concurrency)))
                took = time.perf_counter() - started
                after = queue.metrics()
                return took, after.state_writes - state, after.archive_writes - archive

            await timed(300)
            return report(cycles, *await timed(cycles))

    return asyncio.run(run())


def report(cycles: int, took: float, state: int, archive: int) -> str:
    per_1k = 1000 / cycles
    writes = f"{state * per_1k:,.0f} + {archive * per_1k:,.0f}"
    return f"{cycles / took:>8,.0f} cycles/s, state + archive writes per 1k: {writes}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storage", choices=("memory", "file", "file-nofsync"), default="memory")
    parser.add_argument("--cycles", type=int, default=6000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 10, 50])
    parser.add_argument("--way", choices=("threads", "tasks", "both"), default="both")
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="NAME=JSON",
        help="a Queue keyword, such as archive_tail_bytes=65536 (repeatable)",
    )
    args = parser.parse_args()
    extra = {name: json.loads(value) for name, value in (o.split("=", 1) for o in args.option)}
    ways = [
        (name, run)
        for name, run in (("Queue, threads", threads), ("AsyncQueue, tasks", tasks))
        if args.way in ("both", run.__name__)
    ]
    for concurrency in args.concurrency:
        for name, run in ways:
            with location(args.storage) as (url, options):
                line = run(url, {**options, **extra}, concurrency, args.cycles)
            print(f"{args.storage} c={concurrency:<3} {name:18} {line}")


if __name__ == "__main__":
    main()
