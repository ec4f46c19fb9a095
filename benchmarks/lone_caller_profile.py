"""Where one thread's enqueue -> claim -> ack cycle spends its time (``memory://``,
``broker="off"``): 2,000 cycles of a 1 KiB payload under cProfile; prints the ten largest own
times, and the main parts of a commit with what they call, as shares of the whole.

``--async`` profiles one coroutine's cycle on ``AsyncQueue`` instead, and ``--jqueue`` the
anchor's (jqueue's ``BrokerQueue`` on its ``InMemoryStorage``, Python 3.12, as in
``queue_throughput.py``): the function calls per cycle of each, side by side, show how much
Python each runs for the same three durable writes.

    python benchmarks/lone_caller_profile.py [--async | --jqueue]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import uuid
from typing import Any

from objq_broker import AsyncQueue, Queue

CYCLES = 2000
#: The parts of a commit shown with what they call: (function, module).
PARTS = {
    ("call", "commit.py"),
    ("_commit", "loop.py"),
    ("write", "writing.py"),
    ("apply_batch", "applying.py"),
    ("expire", "leases.py"),
    ("read_runs", "loading.py"),
    ("_after_write", "writing.py"),
    ("plan_archive", "archive.py"),
    ("encode", "state.py"),
    ("check_encoded", "encoding.py"),
    ("write", "loading.py"),
    ("_settled", "loop.py"),
    ("_tell_listeners", "commit.py"),
    ("enqueue", "builders.py"),
    ("claim_op", "core.py"),
    ("ack", "builders.py"),
}


def cycles(queue: Queue, count: int) -> None:
    for _ in range(count):
        queue.enqueue("q", b"x" * 1024)
        [delivery] = queue.claim("q")
        queue.ack(delivery)


async def async_cycles(queue: Any, count: int, *, jqueue: bool = False) -> None:
    for _ in range(count):
        await queue.enqueue("q", b"x" * 1024)
        if jqueue:
            [job] = await queue.dequeue("q")
            await queue.ack(job.id)
        else:
            [delivery] = await queue.claim("q")
            await queue.ack(delivery)


def profile_queue() -> cProfile.Profile:
    queue = Queue(f"memory://lone-{uuid.uuid4().hex}", broker="off")
    queue.declare("q")
    cycles(queue, 300)  # warm
    profile = cProfile.Profile()
    profile.enable()
    cycles(queue, CYCLES)
    profile.disable()
    queue.close()
    return profile


async def profile_async(jqueue: bool) -> cProfile.Profile:
    profile = cProfile.Profile()
    if jqueue:
        # (Only where jqueue is installed: Python 3.12 and later.)
        from jqueue import BrokerQueue, InMemoryStorage  # type: ignore[import-not-found,unused-ignore]

        async with BrokerQueue(InMemoryStorage()) as anchor:
            await async_cycles(anchor, 300, jqueue=True)
            profile.enable()
            await async_cycles(anchor, CYCLES, jqueue=True)
            profile.disable()
        return profile
    queue = AsyncQueue(f"memory://lone-{uuid.uuid4().hex}", broker="off")
    await queue.declare("q")
    await async_cycles(queue, 300)
    profile.enable()
    await async_cycles(queue, CYCLES)
    profile.disable()
    await queue.close()
    return profile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    subject = parser.add_mutually_exclusive_group()
    subject.add_argument("--async", dest="coroutine", action="store_true", help="AsyncQueue")
    subject.add_argument("--jqueue", action="store_true", help="the anchor, jqueue")
    args = parser.parse_args()
    if args.coroutine or args.jqueue:
        profile = asyncio.run(profile_async(args.jqueue))
    else:
        profile = profile_queue()
    stats: Any = pstats.Stats(profile)
    total = stats.total_tt
    rows = [
        (own, cumulative, path.split("/")[-1], name)
        for (path, _, name), (_, _, own, cumulative, _) in stats.stats.items()
    ]
    print(f"{total:.2f} s for {CYCLES:,} cycles under the profiler")
    print(f"{stats.total_calls / CYCLES:,.0f} function calls per cycle, built-ins included")
    for own, _, module, name in sorted(rows, reverse=True)[:10]:
        print(f"{own / total:6.1%} own           {name} ({module})")
    for _, cumulative, module, name in sorted(rows, key=lambda row: -row[1]):
        if (name, module) in PARTS:
            print(f"{cumulative / total:6.1%} with callees  {name} ({module})")


if __name__ == "__main__":
    main()
