"""Storage requests of idle framework workers: direct mode against the elected broker.

Twenty idle consumers on one namespace: 10 ``dramatiq`` worker processes (``--processes 1
--threads 1`` each) and 10 ``celery worker`` processes (``--pool solo --concurrency 1``, without
gossip, mingle and event heartbeats; ``--celery-chatter`` keeps those), running the example apps
in ``integrations/`` unchanged, configured by environment variables. Storage is a SeaweedFS S3
server on 127.0.0.1; every worker reaches it through its own listener of a counting HTTP proxy
(``tests/support/counting_proxy.py``), so each request is counted by verb, key and process.

For each mode (``direct``: ``OBJQ_BROKER=off``, every process polls storage; ``elected``:
``OBJQ_BROKER=auto``, the processes elect one of themselves to commit for all), in a fresh
bucket:

1. start the workers and wait until each logs that it consumes;
2. let them settle: at least ``--settle`` seconds, then until two 10 s slices in a row see about
   the same number of requests (within 25 %, or 2 requests);
3. count requests over ``--seconds`` of idling (every worker must still run at the end);
4. send one Dramatiq and one Celery job from a producer process in the same mode, and time how
   long after its send each job ran (``--wakes`` times; the first follows the idle window).

Requests per day and per month (30 days) are extrapolated from the window at S3 Standard list
prices: GET and HEAD $0.0004 per 1,000, PUT, POST and LIST $0.005 per 1,000, DELETE free.

    python benchmarks/idle_requests.py                                    # ~7 minutes
    python benchmarks/idle_requests.py --dramatiq 2 --celery 2 --seconds 20 --settle 5
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from provenance import objq_revision

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests' helpers
from tests.support import servers
from tests.support.counting_proxy import CountingProxy, Request
from tests.support.idle_fleet import BROKER_MODES, IdleFleet, Wake

#: Dollars per 1,000 requests of each verb (S3 Standard, us-east-1 list prices); HEAD and
#: anything not named bills as GET.
PRICE_PER_1000_USD = {"GET": 0.0004, "PUT": 0.005, "POST": 0.005, "LIST": 0.005, "DELETE": 0.0}
#: Verbs given a column of their own in the table.
VERB_COLUMNS = ("GET", "PUT", "LIST")
SECONDS_PER_DAY = 86_400
DAYS_PER_MONTH = 30


@dataclass
class Measured:
    """What one mode's run found."""

    mode: str
    dramatiq: int
    celery: int
    seconds: float
    window: Counter[Request]
    ready_seconds: float
    settled_seconds: float | None  # None: the rate had not settled by --settle-timeout
    halves: tuple[int, int]
    wakes: list[Wake] = field(default_factory=list)
    killed: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.window.values())

    @property
    def per_minute(self) -> float:
        return self.total * 60 / self.seconds

    @property
    def per_day(self) -> float:
        return self.total * SECONDS_PER_DAY / self.seconds

    def verbs(self) -> Counter[str]:
        counts: Counter[str] = Counter()
        for request, n in self.window.items():
            counts[request.verb] += n
        return counts

    def dollars_per_month(self) -> float:
        scale = SECONDS_PER_DAY * DAYS_PER_MONTH / self.seconds / 1000
        return sum(
            n * scale * PRICE_PER_1000_USD.get(verb, PRICE_PER_1000_USD["GET"])
            for verb, n in self.verbs().items()
        )


def measure(
    proxy: CountingProxy, endpoint: str, mode: str, args: argparse.Namespace, workdir: Path
) -> Measured:
    bucket = servers.new_bucket_name()
    servers.create_s3_bucket(endpoint, bucket)
    with IdleFleet(proxy, bucket=bucket, mode=mode, workdir=workdir / mode) as fleet:
        started = time.monotonic()
        fleet.start(dramatiq=args.dramatiq, celery=args.celery, celery_chatter=args.celery_chatter)
        fleet.wait_ready(args.startup_timeout)
        ready = time.monotonic() - started
        print(f"{mode}: {len(fleet.workers)} workers ready after {ready:.0f} s", file=sys.stderr)
        settled = fleet.settle(args.settle, args.settle_timeout)
        before = fleet.requests()
        fleet.idle(args.seconds / 2)
        middle = fleet.requests()
        fleet.idle(args.seconds / 2)
        after = fleet.requests()
        result = Measured(
            mode=mode,
            dramatiq=args.dramatiq,
            celery=args.celery,
            seconds=args.seconds,
            window=after - before,
            ready_seconds=ready,
            settled_seconds=settled,
            halves=(middle.total() - before.total(), after.total() - middle.total()),
        )
        print(f"{mode}: {result.total} requests in the window", file=sys.stderr)
        for n in range(args.wakes):
            if n:
                time.sleep(2.0)
            result.wakes.append(fleet.wake(args.wake_timeout))
        result.killed = fleet.stop()
    return result


def print_report(results: list[Measured], args: argparse.Namespace) -> None:
    root = Path(__file__).resolve().parent.parent
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    chatter = "on" if args.celery_chatter else "off"
    print(
        f"# idle storage requests, SeaweedFS {args.seconds:g} s window per mode; "
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {objq_revision(root) or 'not a checkout'}; "
        f"Python {platform.python_version()}; {os.cpu_count()} CPUs, load {load}; "
        f"Celery gossip/mingle/heartbeat {chatter}\n"
    )
    verbs = " | ".join(VERB_COLUMNS)
    print(
        f"| mode | consumers | {verbs} | other | requests in {args.seconds:g} s | per minute "
        "| per day | S3 $ per month |"
    )
    print("|---|---|" + "---:|" * (len(VERB_COLUMNS) + 5))
    for r in results:
        counts = r.verbs()
        other = sum(n for verb, n in counts.items() if verb not in VERB_COLUMNS)
        columns = " | ".join(f"{counts[verb]:,}" for verb in VERB_COLUMNS)
        print(
            f"| {r.mode} | {r.dramatiq} Dramatiq + {r.celery} Celery | {columns} | {other:,} "
            f"| {r.total:,} | {r.per_minute:,.1f} | {r.per_day:,.0f} "
            f"| {r.dollars_per_month():,.2f} |"
        )
    print("\n| mode | ready after (s) | settled after (s) | window halves | first wake after idle, "
          "Dramatiq / Celery (s) | median of all wakes (s) | workers killed at stop |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---|")
    for r in results:
        settled = "not settled" if r.settled_seconds is None else f"{r.settled_seconds:.0f}"
        first = r.wakes[0] if r.wakes else None
        woke = (
            "-" if first is None else f"{first.dramatiq_seconds:.2f} / {first.celery_seconds:.2f}"
        )
        median = (
            "-"
            if not r.wakes
            else f"{statistics.median(w.dramatiq_seconds for w in r.wakes):.2f} / "
            f"{statistics.median(w.celery_seconds for w in r.wakes):.2f}"
        )
        print(
            f"| {r.mode} | {r.ready_seconds:.0f} | {settled} | {r.halves[0]} + {r.halves[1]} "
            f"| {woke} | {median} | {', '.join(r.killed) or 'none'} |"
        )
    print("\nRequests in the window by process, verb, key and status:\n")
    print("| mode | process | verb | key | status | requests |")
    print("|---|---|---|---|---:|---:|")
    for r in results:
        for request, n in sorted(r.window.items(), key=lambda item: (-item[1], item[0])):
            process = request.listener.split("/", 1)[1]
            print(
                f"| {r.mode} | {process} | {request.verb} | `{request.kind}` | {request.status} "
                f"| {n:,} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="idle window per mode")
    parser.add_argument(
        "--modes", nargs="+", choices=list(BROKER_MODES), default=["direct", "elected"]
    )
    parser.add_argument("--dramatiq", type=int, default=10, help="dramatiq worker processes")
    parser.add_argument("--celery", type=int, default=10, help="celery worker processes")
    parser.add_argument("--settle", type=float, default=20.0, help="least settling time (s)")
    parser.add_argument("--settle-timeout", type=float, default=180.0)
    parser.add_argument("--startup-timeout", type=float, default=600.0)
    parser.add_argument("--wakes", type=int, default=3, help="wake-up checks per mode (>= 1)")
    parser.add_argument("--wake-timeout", type=float, default=120.0)
    parser.add_argument("--celery-chatter", action="store_true",
                        help="keep Celery's gossip, mingle and event heartbeats")  # fmt: skip
    args = parser.parse_args()
    if args.wakes < 1:
        parser.error("--wakes: expected at least 1 (the check that idle workers still wake)")
    servers.apply_dummy_aws_env()
    workdir = Path(tempfile.mkdtemp(prefix="objq-idle-requests-"))
    print(f"worker logs in {workdir} (removed after a successful run)", file=sys.stderr)
    seaweedfs = servers.start_seaweedfs()
    try:
        with CountingProxy(seaweedfs.endpoint) as proxy:
            results = [measure(proxy, seaweedfs.endpoint, m, args, workdir) for m in args.modes]
    finally:
        seaweedfs.stop()
    shutil.rmtree(workdir, ignore_errors=True)
    print_report(results, args)


if __name__ == "__main__":
    main()
