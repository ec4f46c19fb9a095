"""Pickup latency: how soon an idle consumer in another process gets a job, objq against Redis.

A consumer process waits for jobs one at a time (``Queue.claim(timeout=...)``, as Dramatiq's
consumer does; with the elected broker the claim waits *at the broker*), and this process sends
one job every ``--gap`` seconds, so the consumer is idle and waiting each time a job comes. The
job carries its send time; the consumer notes when it has the job in hand (after the claim is
durable) and acks it. Reported: median and 99th percentile of send-to-claimed.

Rows, all in one run:

* ``objq elected file://``: this process leads (``broker="auto"``, it opens the queue first),
  the consumer follows it over libzmq. The job's commit answers the waiting claim.
* ``objq direct file://``: no broker (``broker="off"``): the consumer polls storage, woken
  by nothing else.
* ``Redis``: ``LPUSH`` and ``BRPOP`` on a local ``redis-server`` (no persistence), the usual
  anchor; skipped with one line without ``redis-server`` on PATH.

    python benchmarks/pickup_latency.py                 # 200 jobs per row, 20 ms apart
    python benchmarks/pickup_latency.py --jobs 50 --rows elected
"""

from __future__ import annotations

import argparse
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from provenance import objq_revision

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(1, str(ROOT))

QUEUE = "pickup"
#: How long the consumer's claims wait for a job before they are made again.
CLAIM_WAIT_SECONDS = 5.0
ROWS = {"elected": "objq elected file://", "direct": "objq direct file://", "redis": "Redis"}


def consume_objq(url: str, mode: str, jobs: int) -> None:
    """The consumer process: claim one job at a time, print each pickup latency (ms)."""
    from objq_broker import Queue

    with Queue(url, broker=mode) as queue:
        queue.declare(QUEUE)
        print("ready", flush=True)
        for _ in range(jobs):
            found = []
            while not found:
                found = queue.claim(QUEUE, timeout=CLAIM_WAIT_SECONDS)
            (delivery,) = found
            took = time.time() - float(delivery.payload)
            queue.ack(delivery, wait=False)
            print(f"{took * 1e3:.3f}", flush=True)


def consume_redis(port: int, jobs: int) -> None:
    import redis

    client = redis.Redis(host="127.0.0.1", port=port)
    print("ready", flush=True)
    for _ in range(jobs):
        _, sent = client.brpop([QUEUE], timeout=0)
        print(f"{(time.time() - float(sent)) * 1e3:.3f}", flush=True)


def start_consumer(args: list[str]) -> subprocess.Popen[str]:
    command = [sys.executable, str(Path(__file__).resolve()), "--consume", *args]
    consumer = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=HERE)
    assert consumer.stdout is not None
    line = consumer.stdout.readline().strip()
    if line != "ready":
        raise RuntimeError(f"the consumer did not start: {line!r}")
    return consumer


def collect(
    consumer: subprocess.Popen[str], send: Callable[[str], object], jobs: int, gap: float
) -> list[float]:
    """Send ``jobs`` jobs ``gap`` apart (``send(text)``), and read each pickup latency."""
    assert consumer.stdout is not None
    took: list[float] = []
    for _ in range(jobs):
        time.sleep(gap)  # the consumer is waiting again, idle
        send(f"{time.time():.6f}")
        took.append(float(consumer.stdout.readline()))
    consumer.wait(30)
    return took


def run_objq(mode: str, jobs: int, gap: float) -> list[float]:
    from objq_broker import Queue

    root = tempfile.mkdtemp(prefix="objq-bench-pickup-")
    url = f"file://{root}"
    with Queue(url, broker="auto" if mode == "elected" else "off") as queue:
        queue.declare(QUEUE)  # (this process leads when elected: it committed first)
        consumer = start_consumer(["objq", url, "auto" if mode == "elected" else "off", str(jobs)])

        def send(text: str) -> None:
            queue.enqueue(QUEUE, text.encode())

        return collect(consumer, send, jobs, gap)


def run_redis(jobs: int, gap: float) -> list[float] | None:
    if shutil.which("redis-server") is None:
        print("redis-server is not on PATH: the Redis row is skipped")
        return None
    import redis

    from tests.support.servers import start_redis

    server = start_redis()
    try:
        client = redis.Redis(host="127.0.0.1", port=server.port)
        consumer = start_consumer(["redis", str(server.port), str(jobs)])

        def send(text: str) -> None:
            client.lpush(QUEUE, text)

        return collect(consumer, send, jobs, gap)
    finally:
        server.stop()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--consume":
        kind, *rest = sys.argv[2:]
        if kind == "objq":
            consume_objq(rest[0], rest[1], int(rest[2]))
        else:
            consume_redis(int(rest[0]), int(rest[1]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--gap", type=float, default=0.02, help="seconds between jobs")
    modes = ["elected", "direct"]
    parser.add_argument("--rows", nargs="+", choices=modes, default=modes)
    args = parser.parse_args()
    print(
        f"# pickup latency, {args.jobs} jobs {args.gap * 1e3:g} ms apart; "
        f"{objq_revision(ROOT) or 'objq (no checkout)'}; Python {platform.python_version()}"
    )
    results = {ROWS[mode]: run_objq(mode, args.jobs, args.gap) for mode in args.rows}
    redis_took = run_redis(args.jobs, args.gap)
    anchor = None if redis_took is None else statistics.median(redis_took)
    if redis_took is not None:
        results[ROWS["redis"]] = redis_took
    print("| consumer | pickup median | p99 | median / Redis |")
    print("|---|---:|---:|---:|")
    for name, took in results.items():
        median = statistics.median(took)
        p99 = sorted(took)[max(int(len(took) * 0.99) - 1, 0)]
        ratio = "" if anchor is None or name == ROWS["redis"] else f"{median / anchor:.2f}"
        print(f"| {name} | {median:.2f} ms | {p99:.2f} ms | {ratio} |")


if __name__ == "__main__":
    main()
