"""One thread's enqueue -> claim -> ack cycle on ``memory://`` with ``broker="off"``: what a
call costs when nobody else is waiting (it commits in the caller's own thread).

    python benchmarks/lone_caller.py                 # 3,000 cycles of a 1 KiB payload
    PYTHONPATH=<older checkout> python benchmarks/lone_caller.py   # the same, on another tree

Prints cycles/s and the state and archive writes the run made.
"""

from __future__ import annotations

import argparse
import time
import uuid

from objq_broker import Queue

PAYLOAD = b"x" * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=3000)
    args = parser.parse_args()
    queue = Queue(f"memory://lone-{uuid.uuid4().hex}", broker="off")
    queue.declare("q")
    started = time.perf_counter()
    for _ in range(args.cycles):
        queue.enqueue("q", PAYLOAD)
        [delivery] = queue.claim("q")
        queue.ack(delivery)
    seconds = time.perf_counter() - started
    metrics = queue.metrics()
    print(
        f"{args.cycles / seconds:,.0f} cycles/s; state writes {metrics.state_writes}, "
        f"archive writes {metrics.archive_writes}"
    )
    queue.close()


if __name__ == "__main__":
    main()
