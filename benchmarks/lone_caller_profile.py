"""Where one thread's enqueue -> claim -> ack cycle spends its time (``memory://``,
``broker="off"``): 2,000 cycles of a 1 KiB payload under cProfile; prints the ten largest own
times, and the main parts of a commit with what they call, as shares of the whole.

    python benchmarks/lone_caller_profile.py
"""

from __future__ import annotations

import cProfile
import pstats
import uuid
from typing import Any

from objq_broker import Queue

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


def main() -> None:
    queue = Queue(f"memory://lone-{uuid.uuid4().hex}", broker="off")
    queue.declare("q")
    cycles(queue, 300)  # warm
    profile = cProfile.Profile()
    profile.enable()
    cycles(queue, CYCLES)
    profile.disable()
    queue.close()
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
