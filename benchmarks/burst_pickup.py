"""Burst pickup: how long after its send a consumer of the same process has the last job of a
burst, through the elected broker.

One process leads the broker (``broker="auto"``, ``file://`` with fsync). A consumer thread
claims in a loop (``claim(n, timeout=...)``, as a Dramatiq consumer does, acks not waited for)
while the main thread sends bursts of jobs back to back, each send waited for. The operations
of both threads travel to the broker in the same sessions, so a claim may go out in one session
with the enqueue sent a moment after it. For the last job of each burst, the lag is the time
from its send's return to the claim that has it (negative: the claim returned first, from the
same commit). Reported: median, 90th percentile and largest lag over the bursts.

    python benchmarks/burst_pickup.py                      # 40 bursts of 20 jobs
    PYTHONPATH=<older checkout> python benchmarks/burst_pickup.py   # another tree
"""

from __future__ import annotations

import argparse
import functools
import platform
import statistics
import tempfile
import threading
import time
from pathlib import Path

from provenance import objq_revision

import objq_broker
from objq_broker import Queue

QUEUE = "burst"
#: How long the consumer's claims wait for jobs before they are made again.
CLAIM_WAIT_SECONDS = 0.1


def run(bursts: int, size: int, pause: float) -> list[float]:
    """The lags (seconds) of the last job of each burst."""
    claimed: dict[bytes, float] = {}
    arrived = threading.Condition()
    with (
        tempfile.TemporaryDirectory(prefix="objq-bench-burst-") as folder,
        Queue(Path(folder).as_uri(), broker="auto") as queue,
    ):
        queue.declare(QUEUE)
        stop = threading.Event()

        def consume() -> None:
            while not stop.is_set():
                found = queue.claim(QUEUE, size, timeout=CLAIM_WAIT_SECONDS)
                now = time.perf_counter()
                for delivery in found:
                    queue.ack(delivery, wait=False)
                with arrived:
                    claimed.update((d.payload, now) for d in found)
                    arrived.notify_all()

        consumer = threading.Thread(target=consume, daemon=True)
        consumer.start()
        lags = []
        for burst in range(bursts):
            time.sleep(pause)  # the consumer is waiting again
            last = b""
            for number in range(size):
                last = f"{burst}.{number}".encode()
                queue.enqueue(QUEUE, last)
            sent = time.perf_counter()
            with arrived:
                arrived.wait_for(functools.partial(claimed.__contains__, last), 30)
            lags.append(claimed[last] - sent)
        stop.set()
        consumer.join(5)
    return lags


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bursts", type=int, default=40)
    parser.add_argument("--size", type=int, default=20, help="jobs per burst")
    parser.add_argument("--pause", type=float, default=0.05, help="seconds between bursts")
    args = parser.parse_args()
    lags = sorted(lag * 1e3 for lag in run(args.bursts, args.size, args.pause))
    source = Path(objq_broker.__file__).resolve().parent.parent
    where = objq_revision(source) or f"objq from {source}"
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(
        f"`python benchmarks/burst_pickup.py --bursts {args.bursts} --size {args.size}`: "
        f"{where}, Python {platform.python_version()}, {when}"
    )
    p90 = lags[min(len(lags) - 1, int(len(lags) * 0.9))]
    print(
        f"lag of a burst's last job, send returned -> claimed (ms): "
        f"median {statistics.median(lags):.2f}, p90 {p90:.2f}, max {lags[-1]:.2f}"
    )


if __name__ == "__main__":
    main()
