"""Barrier release: how far apart two threads return from a Dramatiq barrier of two parties
kept by objq's rate-limiter backend, as Dramatiq's own ``test_barriers_can_block`` measures it
(and requires within 10 ms).

Each round makes a barrier in a fresh ``file://`` folder; two threads each sleep 0.1 s, then
wait on it, and note when ``wait`` returned. Reported: the median, 90th percentile and largest
gap between the two, and how many rounds passed 10 ms. ``--busy-threads N`` adds N threads of
the same process that only count (a busy interpreter: each hand-over of the interpreter lock
then takes up to its 5 ms switch interval).

    python benchmarks/barrier_release.py                       # 50 rounds
    python benchmarks/barrier_release.py --busy-threads 1      # with a busy thread beside
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dramatiq.rate_limits import Barrier

from objq_broker.dramatiq import ObjqRateLimiterBackend

#: What Dramatiq's own test allows.
ALLOWED_SECONDS = 0.01


def one_round(index: int) -> float:
    """The gap (seconds) between the two parties' returns from one barrier."""
    backend = ObjqRateLimiterBackend(url=Path(tempfile.mkdtemp()).as_uri())
    barrier = Barrier(backend, f"barrier-{index}", ttl=30000)
    assert barrier.create(parties=2)
    returned: list[float] = []

    def party() -> None:
        time.sleep(0.1)
        assert barrier.wait(timeout=2000)
        returned.append(time.monotonic())

    with ThreadPoolExecutor(max_workers=2) as pool:
        for future in [pool.submit(party), pool.submit(party)]:
            future.result()
    backend.close()
    return abs(returned[0] - returned[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--busy-threads", type=int, default=0)
    args = parser.parse_args()
    stop = threading.Event()

    def busy() -> None:
        count = 0
        while not stop.is_set():
            count += 1

    for _ in range(args.busy_threads):
        threading.Thread(target=busy, daemon=True).start()
    gaps = sorted(one_round(index) for index in range(args.rounds))
    stop.set()
    over = sum(gap > ALLOWED_SECONDS for gap in gaps)
    print(
        f"{args.rounds} rounds, {args.busy_threads} busy threads: gap median "
        f"{statistics.median(gaps) * 1000:.2f} ms, 90th percentile "
        f"{gaps[int(len(gaps) * 0.9)] * 1000:.2f} ms, largest {gaps[-1] * 1000:.2f} ms; "
        f"{over} over {ALLOWED_SECONDS * 1000:.0f} ms"
    )


if __name__ == "__main__":
    main()
