"""Celery throughput: the objq kombu transport against Celery's Redis transport (the anchor).

Both run side by side in one run, with the same Celery settings (defaults, results ignored):

* ``objq file://``: ``broker_url = "objq+file://<tmpdir>"`` (the file store's default fsync),
  with the default settings: this process and the worker's elect a broker (``OBJQ_BROKER``
  as in the environment; ``OBJQ_BROKER=off`` measures direct commits).
* ``redis``: ``broker_url = "redis://127.0.0.1:<port>/0"`` on a redis-server this script starts
  with ``--save '' --appendonly no`` (no persistence).

For each broker, on a fresh, empty queue:

1. **apply_async, 1 thread**: ``noop.apply_async()`` for every message, one after the other,
   from this process (Celery's producer pool, one connection). Rate = messages / seconds.
2. **apply_async, 8 threads**: a smaller count sent from 8 threads sharing Celery's producer
   pool (``--threaded-messages``), into a second queue that is purged afterwards.
3. **drain**: with the messages of (1) waiting, a real ``celery worker`` process starts
   (``--pool prefork``, ``--concurrency`` and ``--prefetch-multiplier`` as given). Each pool
   process notes when it started and finished its first and last task and how many it ran, and
   writes that down at shutdown; drain rate = tasks run / (last finish - first start), so the
   worker's boot time is not counted. The worker is stopped (SIGTERM) once the broker reports
   the queue empty with nothing unacknowledged. For objq the table also gives the state commits
   made during the drain (the state's version counter) per 1,000 tasks. "Longest wait" is the
   longest any pool process waited between finishing one task and starting the next: a stall
   in delivery shows there even when the rate looks fine.

Two extra rows repeat all of it with ``--prefetch-multiplier`` = ``--large-prefetch`` (64) for
both brokers: Celery's default window (concurrency x 4 = 8 messages) bounds how many messages
one objq claim commit can hand out.

The Redis rows are measured against a local redis-server when one is installed. Without
``redis-server`` on PATH they are skipped with one line, the objq rows still run, and the
"vs redis" columns read ``n/a``.

    python benchmarks/celery_throughput.py                      # 10,000 messages
    python benchmarks/celery_throughput.py --messages 1000      # smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis
from celery import Celery
from celery.signals import task_postrun, task_prerun, worker_process_shutdown
from provenance import objq_revision

import objq_broker.kombu  # noqa: F401  (registers the objq+... broker URLs)
from objq_broker import Queue
from objq_broker.engine.snapshot import Snapshot
from objq_broker.storage import open_store

if TYPE_CHECKING:
    from tests.support.servers import RedisServer

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
QUEUE = "bench"
THREADED_QUEUE = "bench-threaded"
NOOP = "bench.noop"
PRODUCER_THREADS = 8
REDIS_SETTINGS = ("--save", "", "--appendonly", "no")
#: Longest a drain may take before the run gives up on that broker.
DRAIN_TIMEOUT_SECONDS = 600.0
#: Printed instead of the Redis rows when there is no redis-server to measure.
REDIS_MISSING = (
    "# redis-server not found on PATH: the Redis rows are skipped "
    "(apt-get install redis-server to measure them)"
)

# --- the app (also loaded by the worker subprocess: celery -A celery_throughput) ------------


def noop() -> None:
    """Does nothing: the benchmark measures the broker, not the task."""


def make_app(broker_url: str, transport_options: dict[str, Any]) -> Celery:
    made = Celery("celery_throughput", broker=broker_url)
    made.conf.update(
        task_ignore_result=True,
        task_default_queue=QUEUE,
        broker_transport_options=transport_options,
        worker_hijack_root_logger=False,
    )
    made.task(name=NOOP)(noop)
    return made


app = make_app(
    os.environ.get("BENCH_BROKER_URL", "memory://"),
    json.loads(os.environ.get("BENCH_TRANSPORT_OPTIONS", "{}")),
)


class _Tally:
    """First start, last finish, count, and longest wait between two tasks of one pool
    process (a stall in delivery shows there, while the rate alone hides it)."""

    first: float | None = None
    last: float | None = None
    count = 0
    longest_wait = 0.0


@task_prerun.connect
def _started(**_: Any) -> None:
    now = time.time()
    if _Tally.first is None:
        _Tally.first = now
    if _Tally.last is not None:
        _Tally.longest_wait = max(_Tally.longest_wait, now - _Tally.last)


@task_postrun.connect
def _finished(**_: Any) -> None:
    _Tally.last = time.time()
    _Tally.count += 1


@worker_process_shutdown.connect
def _write_tally(**_: Any) -> None:
    folder = os.environ.get("BENCH_TALLY_DIR")
    if folder and _Tally.count:
        record = {"first": _Tally.first, "last": _Tally.last, "count": _Tally.count,
                  "longest_wait": _Tally.longest_wait}  # fmt: skip
        Path(folder, f"{os.getpid()}.json").write_text(json.dumps(record))


# --- redis-server and brokers --------------------------------------------------------------


@dataclass
class Broker:
    label: str
    url: str
    pending: Callable[[], int]  # messages waiting or unacknowledged in QUEUE
    transport_options: dict[str, Any]
    prefetch: int | None = None  # Celery's --prefetch-multiplier for this row (None: default)
    commits: Callable[[], int] | None = None  # objq: the state's commit count so far


def objq_pending(store_url: str) -> Callable[[], int]:
    def pending() -> int:
        with Queue(store_url) as queue:
            if QUEUE not in queue.queues():
                return 0
            stats = queue.stats(QUEUE)
            return stats.ready + stats.delayed + stats.in_flight

    return pending


def objq_commits(store_url: str) -> Callable[[], int]:
    def commits() -> int:
        store = open_store(store_url)
        try:
            return Snapshot.read(store).version
        finally:
            store.close()

    return commits


def redis_pending(port: int) -> Callable[[], int]:
    def pending() -> int:
        client = redis.Redis(host="127.0.0.1", port=port)
        try:
            # The queue's list plus the transport's unacked hash (prefetched, not yet acked).
            return int(client.llen(QUEUE)) + int(client.hlen("unacked"))
        finally:
            client.close()

    return pending


def brokers(
    store: str, server: RedisServer | None, options: dict[str, Any], big: int
) -> list[Broker]:
    """The rows to measure: objq then Redis (when ``server`` runs) at Celery's default prefetch,
    then both again with a prefetch multiplier of ``big`` (none when it is 0)."""
    rows: list[Broker] = []
    for prefetch in (None, big) if big else (None,):
        suffix = "" if prefetch is None else f" prefetch x{prefetch}"
        rows.append(Broker(f"objq file://{suffix}", f"objq+{store}", objq_pending(store),
                           options, prefetch=prefetch, commits=objq_commits(store)))  # fmt: skip
        if server is not None:
            rows.append(Broker(f"redis{suffix}", server.url, redis_pending(server.port), options,
                               prefetch=prefetch))  # fmt: skip
    return rows


# --- measurements --------------------------------------------------------------------------


@dataclass
class Result:
    label: str
    sent: int
    send_seconds: float
    threaded_sent: int
    threaded_seconds: float
    drained: int
    drain_seconds: float
    drain_commits: int | None
    prefetch: int
    longest_wait: float  # seconds: the longest a pool process waited for its next task

    @property
    def send_rate(self) -> float:
        return self.sent / self.send_seconds

    @property
    def threaded_rate(self) -> float:
        return self.threaded_sent / self.threaded_seconds

    @property
    def drain_rate(self) -> float:
        return self.drained / self.drain_seconds


def send_serially(producer_app: Celery, messages: int) -> float:
    task = producer_app.tasks[NOOP]
    started = time.perf_counter()
    with producer_app.producer_or_acquire() as producer:
        for _ in range(messages):
            task.apply_async(producer=producer)
    return time.perf_counter() - started


def send_threaded(producer_app: Celery, messages: int, threads: int) -> float:
    task = producer_app.tasks[NOOP]
    counts = [messages // threads + (1 if i < messages % threads else 0) for i in range(threads)]
    gate = threading.Barrier(threads + 1)

    def produce(count: int) -> None:
        gate.wait()
        for _ in range(count):
            task.apply_async(queue=THREADED_QUEUE)

    with ThreadPoolExecutor(threads) as pool:
        futures = [pool.submit(produce, count) for count in counts]
        gate.wait()
        started = time.perf_counter()
        for future in futures:
            future.result()
        return time.perf_counter() - started


def purge(producer_app: Celery, queue: str) -> None:
    with producer_app.connection_for_write() as connection:
        connection.default_channel.queue_purge(queue)


def drain(broker: Broker, concurrency: int, prefetch: int, logs: Path) -> tuple[int, float, float]:
    with tempfile.TemporaryDirectory(prefix="celery-bench-tally-") as tally:
        env = dict(os.environ)
        env.update(
            BENCH_BROKER_URL=broker.url,
            BENCH_TRANSPORT_OPTIONS=json.dumps(broker.transport_options),
            BENCH_TALLY_DIR=tally,
            PYTHONPATH=os.pathsep.join(p for p in (str(HERE), str(ROOT)) if p),
        )
        command = [
            sys.executable, "-m", "celery", "-A", "celery_throughput", "worker",
            "--pool", "prefork", "--concurrency", str(concurrency),
            "--prefetch-multiplier", str(prefetch), "--queues", QUEUE,
            "--loglevel", "WARNING", "--without-gossip", "--without-mingle", "--without-heartbeat",
        ]  # fmt: skip
        with (logs / f"worker-{broker.label.split()[0]}.log").open("ab") as log:
            worker = subprocess.Popen(command, cwd=HERE, env=env, stdout=log, stderr=log)
        try:
            deadline = time.monotonic() + DRAIN_TIMEOUT_SECONDS
            while broker.pending() and time.monotonic() < deadline:
                if worker.poll() is not None:
                    sys.exit(f"{broker.label}: the worker exited (code {worker.returncode})")
                time.sleep(0.2)
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=120)
        tallies = [json.loads(p.read_text()) for p in Path(tally).glob("*.json")]
    if not tallies:
        sys.exit(f"{broker.label}: the worker ran no task (see {logs})")
    first = min(t["first"] for t in tallies)
    last = max(t["last"] for t in tallies)
    longest_wait = max(t["longest_wait"] for t in tallies)
    return sum(t["count"] for t in tallies), last - first, longest_wait


def measure(broker: Broker, messages: int, threaded: int, args: argparse.Namespace) -> Result:
    producer_app = make_app(broker.url, broker.transport_options)
    try:
        send_seconds = send_serially(producer_app, messages)
        threaded_seconds = send_threaded(producer_app, threaded, PRODUCER_THREADS)
        purge(producer_app, THREADED_QUEUE)
    finally:
        producer_app.close()
    prefetch = broker.prefetch or args.prefetch_multiplier
    before = broker.commits() if broker.commits else None
    drained, drain_seconds, longest_wait = drain(broker, args.concurrency, prefetch, args.logs)
    commits = broker.commits() - before if broker.commits and before is not None else None
    if drained < messages:
        sys.exit(f"{broker.label}: {drained} of {messages} tasks ran")
    print(
        f"{broker.label}: apply_async {messages / send_seconds:,.0f}/s, "
        f"8 threads {threaded / threaded_seconds:,.0f}/s, drain {drained / drain_seconds:,.0f}/s, "
        f"longest wait {longest_wait * 1000:,.0f} ms",
        flush=True,
    )
    return Result(
        broker.label,
        *(messages, send_seconds, threaded, threaded_seconds, drained, drain_seconds, commits),
        prefetch,
        longest_wait,
    )


# --- report --------------------------------------------------------------------------------


def ratios(r: Result, anchor: Result | None) -> tuple[str, str, str]:
    """The "vs redis" cells of ``r`` (1 thread, 8 threads, drain): ``n/a`` when there is no
    Redis row to compare with, rather than a number with nothing behind it."""
    if anchor is None:
        return "n/a", "n/a", "n/a"
    return (
        f"{r.send_rate / anchor.send_rate:.2f}",
        f"{r.threaded_rate / anchor.threaded_rate:.2f}",
        f"{r.drain_rate / anchor.drain_rate:.2f}",
    )


def table(results: list[Result]) -> str:
    lines = [
        "| broker | apply_async 1 thread (msg/s) | vs redis | apply_async 8 threads (msg/s) "
        "| vs redis | drain (msg/s) | vs redis | commits/1k drained | longest wait (ms) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        # The anchor is the Redis row with the same prefetch (none when Redis was skipped).
        same = [a for a in results if a.prefetch == r.prefetch]
        anchor = next((a for a in same if a.label.startswith("redis")), None)
        per_1k = "" if r.drain_commits is None else f"{r.drain_commits * 1000 / r.drained:,.0f}"
        vs_send, vs_threaded, vs_drain = ratios(r, anchor)
        lines.append(
            f"| {r.label} | {r.send_rate:,.0f} | {vs_send} | {r.threaded_rate:,.0f} "
            f"| {vs_threaded} | {r.drain_rate:,.0f} | {vs_drain} | {per_1k} "
            f"| {r.longest_wait * 1000:,.0f} |"
        )
    return "\n".join(lines)


def environment() -> str:
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"{platform.system()} {platform.release()} {platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, celery {version('celery')}, "
        f"kombu {version('kombu')}, redis-py {version('redis')}, load average at start {load}, "
        f"objq {objq_revision(ROOT) or 'outside a checkout'}"
    )


def start_redis() -> RedisServer | None:
    """A local redis-server for the Redis rows, or None (and one line saying so) without one."""
    # Checked here rather than left to tests.support.servers.start_redis, which also falls back to
    # /usr/bin/redis-server: the rows run only for a redis-server on PATH.
    if shutil.which("redis-server") is None:
        print(REDIS_MISSING, flush=True)
        return None
    sys.path.insert(0, str(ROOT))  # the tests' server helpers: tests.support.servers
    from tests.support.servers import start_redis as start

    return start(REDIS_SETTINGS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--threaded-messages", type=int, default=2_000)
    parser.add_argument("--concurrency", type=int, default=2, help="prefork pool processes")
    parser.add_argument("--prefetch-multiplier", type=int, default=4, help="Celery's default: 4")
    parser.add_argument("--visibility-timeout", type=float, default=60.0)
    parser.add_argument(
        "--large-prefetch",
        type=int,
        default=64,
        help="extra rows with this --prefetch-multiplier (0: none)",
    )
    args = parser.parse_args()
    print(environment(), flush=True)
    server = start_redis()
    scratch = Path(tempfile.mkdtemp(prefix="celery-bench-"))
    options = {"visibility_timeout": args.visibility_timeout}
    try:
        store = (scratch / "store").as_uri()
        args.logs = scratch
        rows = brokers(store, server, options, args.large_prefetch)
        results = [measure(b, args.messages, args.threaded_messages, args) for b in rows]
    finally:
        if server is not None:
            server.stop()
    print()
    print(table(results))


if __name__ == "__main__":
    main()
