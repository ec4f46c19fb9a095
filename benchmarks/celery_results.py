"""Celery results: objq's result backend against Celery's Redis backend (the anchor).

All rows run in one run, on one machine, with local redis-servers this script starts: the
anchor with no persistence (``--save '' --appendonly no``), and one that fsyncs every write
(``--appendonly yes --appendfsync always``), as durable as objq's default:

* ``objq broker + objq results``: ``broker_url`` and ``result_backend`` both ``objq+file://``
  (two folders of one temporary directory), committing directly (``OBJQ_BROKER=off``):
  nothing to run but the worker.
* the same with ``?fsync=false`` on both stores: as durable as that Redis (in memory only).
* both again with the elected broker (``OBJQ_BROKER=auto``, the default): the worker and this
  process elect one of them to commit for both.
* ``objq broker + Redis results``: the same broker, results in Redis: the backends alone differ.
* ``Redis broker + Redis results``: the usual Celery deployment, for the whole round trip;
  and the same on the Redis that fsyncs every write.

For each row a real ``celery worker`` process (prefork, concurrency 1) serves the app, and:

1. **round trip**: ``add.delay(n, 1).get()`` one after the other, from this process; median and
   99th percentile of the time from ``delay`` to the value in hand. Then the same after the
   worker idled (``--idle-seconds`` before each of ``--idle-round-trips``): what a task sent to
   a quiet worker waits, where the worker's polls have slowed to ``polling_interval``.
2. **stored per second**: ``backend.store_result(...)`` of small results from this process, one
   thread and eight threads (what workers do after each task), against the row's backend.

Without ``redis-server`` on PATH the Redis rows are skipped with one line, and the objq rows run.
``--transport-option NAME=JSON`` sets an objq ``broker_transport_options`` entry.

    python benchmarks/celery_results.py     # 300 round trips, 10 after idling, 2,000 stores
    python benchmarks/celery_results.py --round-trips 50 --idle-round-trips 3 --stores 200
    python benchmarks/celery_results.py --rows elected --idle-round-trips 0   # one row + anchor
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

from celery import Celery
from celery_worker import BACKEND_ENV, BROKER_ENV, start_worker, stop_worker
from provenance import objq_revision

import objq_broker.kombu  # noqa: F401  (registers the objq+... broker and backend URLs)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(1, str(ROOT))
from tests.support.servers import RedisServer, start_redis  # noqa: E402

QUEUE = "bench-results"
ADD = "bench.add"
#: Longest a round trip may take before the row gives up.
GET_TIMEOUT_SECONDS = 60.0
WORKER_START_SECONDS = 120.0
#: redis-server settings: no persistence (the anchor), and every write fsynced (AOF, always).
REDIS_IN_MEMORY = ("--save", "", "--appendonly", "no")
REDIS_FSYNC_ALWAYS = ("--save", "", "--appendonly", "yes", "--appendfsync", "always")
#: The objq transport's options (JSON), for this process and the worker it starts.
OPTIONS_ENV = "BENCH_TRANSPORT_OPTIONS"


def add(x: int, y: int) -> int:
    return x + y


def make_app(broker_url: str, backend_url: str) -> Celery:
    made = Celery("celery_results", broker=broker_url, backend=backend_url)
    options = json.loads(os.environ.get(OPTIONS_ENV) or "{}")
    made.conf.update(
        task_default_queue=QUEUE,
        broker_transport_options=options if broker_url.startswith("objq+") else {},
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
    )
    made.task(name=ADD)(add)
    return made


# The worker subprocess loads this module (celery -A celery_results) with the row's URLs.
app = make_app(os.environ.get(BROKER_ENV, "memory://"), os.environ.get(BACKEND_ENV, ""))


@dataclass
class Row:
    label: str
    broker_url: str
    backend_url: str
    round_trips: list[float]
    idle_round_trips: list[float]  # each after the worker idled ``--idle-seconds``
    stores_1: float  # results stored per second, one thread
    stores_8: float  # ... eight threads

    def median(self) -> float:
        return statistics.median(self.round_trips)

    def idle_median(self) -> float:
        return statistics.median(self.idle_round_trips) if self.idle_round_trips else 0.0

    def p99(self) -> float:
        ordered = sorted(self.round_trips)
        return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def stores_per_second(made: Celery, count: int, threads: int) -> float:
    backend = made.backend

    def store(n: int) -> None:
        backend.store_result(uuid.uuid4().hex, {"n": n}, "SUCCESS")

    started = time.perf_counter()
    if threads == 1:
        for n in range(count):
            store(n)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(store, range(count)))
    return count / (time.perf_counter() - started)


def measure(
    label: str, broker_url: str, backend_url: str, args: argparse.Namespace, broker_mode: str = ""
) -> Row:
    """One row; ``broker_mode`` is ``$OBJQ_BROKER`` for this process and its worker."""
    os.environ.pop("OBJQ_BROKER", None)
    if broker_mode:
        os.environ["OBJQ_BROKER"] = broker_mode
    made = make_app(broker_url, backend_url)
    logs = Path(tempfile.mkdtemp(prefix="objq-bench-results-")) / "worker.log"
    worker = start_worker(
        "celery_results", QUEUE, broker_url, backend_url, logs, loglevel="WARNING"
    )
    connection = made.connection_for_write()
    producer = made.amqp.Producer(connection)
    try:
        # The first task waits for the worker to start; it is not counted.
        made.send_task(ADD, (0, 0), producer=producer).get(timeout=WORKER_START_SECONDS)

        def round_trip(n: int) -> float:
            started = time.perf_counter()
            sent = made.send_task(ADD, (n, 1), producer=producer)
            value = sent.get(timeout=GET_TIMEOUT_SECONDS)
            if value != n + 1:
                raise SystemExit(f"{label}: add({n}, 1) came back as {value!r}")
            return time.perf_counter() - started

        round_trips = [round_trip(n) for n in range(args.round_trips)]
        idle_round_trips = []
        for n in range(args.idle_round_trips):
            time.sleep(args.idle_seconds)
            idle_round_trips.append(round_trip(n))
    finally:
        stop_worker(worker)
        # Our own connection, closed here: the app's pooled one outlives app.close(), and
        # with it an elected broker this process may run on a store about to be deleted.
        connection.close()
    print(f"  {label}: round trips done; storing results", flush=True)
    try:
        return Row(
            label,
            broker_url,
            backend_url,
            round_trips,
            idle_round_trips,
            stores_per_second(made, args.stores, 1),
            stores_per_second(made, args.stores, 8),
        )
    finally:
        made.close()
        os.environ.pop("OBJQ_BROKER", None)


def print_table(rows: list[Row], anchor: Row | None, revision: str | None) -> None:
    print()
    print(f"objq {revision or '(not a checkout)'}; celery {version('celery')}, "
          f"kombu {version('kombu')}; Python {platform.python_version()}; "
          f"{os.cpu_count()} CPUs")  # fmt: skip
    print()
    print(
        "| broker + results | round trip median | p99 | after idling, median "
        "| stored/s, 1 thread | 8 threads |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row.label} | {row.median() * 1000:.1f} ms | {row.p99() * 1000:.1f} ms | "
            f"{row.idle_median() * 1000:.1f} ms | {row.stores_1:,.0f} | {row.stores_8:,.0f} |"
        )
    if anchor is None:
        return
    print()
    print(f"round trip median against {anchor.label} (target for objq + objq: at most 2x):")
    for row in rows:
        if row is not anchor:
            print(f"  {row.label}: {row.median() / anchor.median():.2f}x")


#: The objq rows: ``--rows`` name, label, the two store folders, URL query, ``$OBJQ_BROKER``.
#: Without fsync a write is durable as Redis's without persistence is: in memory only. With
#: the elected broker the worker and this process elect one of them to commit for both: claims
#: are served from its state in memory, and a claim that found nothing waits there.
OBJQ_ROWS = (
    ("direct", "objq + objq, direct", ("queue", "results"), "", "off"),
    ("direct-no-fsync", "objq + objq, direct, no fsync", ("q2", "r2"), "?fsync=false", "off"),
    ("elected", "objq + objq, elected broker", ("q3", "r3"), "", "auto"),
    ("elected-no-fsync", "objq + objq, elected broker, no fsync", ("q4", "r4"), "?fsync=false",
     "auto"),
)  # fmt: skip


#: The rows ``--rows`` can pick.
ROWS = (*(row[0] for row in OBJQ_ROWS), "objq-redis", "redis-fsync")


def objq_rows(scratch: Path, wanted: set[str], args: argparse.Namespace) -> list[Row]:
    rows = []
    for name, label, folders, query, mode in OBJQ_ROWS:
        if name in wanted:
            broker, backend = (f"objq+{(scratch / f).as_uri()}{query}" for f in folders)
            rows.append(measure(label, broker, backend, args, broker_mode=mode))
    return rows


def redis_rows(
    broker: str, wanted: set[str], args: argparse.Namespace
) -> tuple[list[Row], Row | None]:
    """The Redis rows asked for, and the anchor (Redis + Redis); none without redis-server.
    ``broker`` is the objq broker of the ``objq + Redis`` row."""
    if shutil.which("redis-server") is None:
        print(
            "# redis-server not found on PATH: the Redis rows are skipped "
            "(apt-get install redis-server to measure them)"
        )
        return [], None
    rows = []
    servers: list[RedisServer] = []
    try:
        servers.append(redis := start_redis(REDIS_IN_MEMORY))
        if "objq-redis" in wanted:
            rows.append(measure("objq + Redis", broker, redis.url, args))
            redis.flush()
        anchor = measure("Redis + Redis", redis.url, redis.url, args)
        rows.append(anchor)
        # As durable as objq's default: every write fsynced before Redis answers.
        if "redis-fsync" in wanted:
            servers.append(durable := start_redis(REDIS_FSYNC_ALWAYS))
            rows.append(measure("Redis + Redis, fsync always", durable.url, durable.url, args))
        return rows, anchor
    finally:
        for server in servers:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--round-trips", type=int, default=300)
    parser.add_argument("--idle-round-trips", type=int, default=10)
    parser.add_argument(
        "--idle-seconds", type=float, default=1.0, help="the worker's idle time before each"
    )
    parser.add_argument("--stores", type=int, default=2000)
    parser.add_argument(
        "--rows",
        nargs="+",
        choices=ROWS,
        default=list(ROWS),  # Redis + Redis, the anchor, is always measured when it can be
        help="which rows to measure (Redis + Redis, the anchor, always runs when it can)",
    )
    parser.add_argument(
        "--transport-option",
        action="append",
        default=[],
        metavar="NAME=JSON",
        help="an objq broker_transport_options entry, e.g. polling_interval=0.5 (repeatable)",
    )
    args = parser.parse_args()
    options = dict(option.split("=", 1) for option in args.transport_option)
    os.environ[OPTIONS_ENV] = json.dumps({k: json.loads(v) for k, v in options.items()})
    if options:
        print(f"objq transport options: {os.environ[OPTIONS_ENV]}")
    scratch = Path(tempfile.mkdtemp(prefix="objq-bench-results-"))
    try:
        rows = objq_rows(scratch, set(args.rows), args)
        broker = f"objq+{(scratch / 'queue').as_uri()}"  # the direct row's
        redis, anchor = redis_rows(broker, set(args.rows), args)
        rows += redis
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print_table(rows, anchor, objq_revision(ROOT))


if __name__ == "__main__":
    main()
