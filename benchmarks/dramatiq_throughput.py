"""Dramatiq throughput: ``ObjqBroker`` against Dramatiq's ``RedisBroker`` (the anchor).

All brokers run side by side in one process and one run, with Dramatiq's default middleware:

* ``objq memory://``: ``ObjqBroker(url="memory://<unique>")``.
* ``objq file://``: ``ObjqBroker(url="file://<tmpdir>")``, the file store's default ``fsync=True``.
* ``objq file:// fsync=false`` (labelled extra row): ``file://<tmpdir>?fsync=false``.
* ``redis`` (the anchor): ``RedisBroker`` on a redis-server this script starts on 127.0.0.1
  with ``--save '' --appendonly no`` (no persistence at all; Redis never fsyncs per operation
  unless told ``--appendonly yes --appendfsync always``).
* ``redis AOF fsync=always`` (labelled extra row): a second redis-server with
  ``--appendonly yes --appendfsync always``, the Redis setting closest to objq's fsync per commit.
* ``stub``: Dramatiq's in-process ``StubBroker`` (no storage, no network: the ceiling).

The Redis rows are measured against a local redis-server when one is installed. Without
``redis-server`` on PATH they are skipped with one line, the objq and stub rows still run, and
the "vs redis" columns read ``n/a``.

Workloads (a fresh broker for each measurement, ``dramatiq.set_broker`` before the actor is
declared, every worker stopped and broker closed at the end of its measurement):

1. **enqueue, 1 thread**: no-op messages sent with ``actor.send()`` one after the other.
2. **enqueue, 16 threads**: the same count split over 16 threads released together.
3. **drain**: the messages are enqueued first, untimed (``actor.send()`` from 16 threads; for
   objq ``enqueue_many`` of ``actor.message().encode()`` in commits of 1,000, which stores the
   same jobs in 20 commits instead of ~2,500), then a
   ``dramatiq.Worker(broker, worker_threads=8, worker_timeout=100)`` is started and the clock
   runs from ``worker.start()`` until the actor (a lock-protected counter) has run for every
   message. Two extra objq rows have a time budget (``DRAIN_BUDGET_SECONDS``): when it runs out
   first, the rate is over the messages that ran by then and the table marks it partial.

For objq, the storage bill of each phase is ``state_writes + archive_writes`` from
``broker.client.metrics()`` per 1,000 messages (a complete drain counts up to a flush after the
worker stopped, so acks that became durable after the last message ran are included).

objq's state is one object rewritten by every commit, and a single-threaded producer makes one
commit per ``send()``, so a 1-thread enqueue costs O(n^2) in bytes written. Rows whose 1-thread
enqueue of the full count would take minutes measure fewer messages (``SINGLE_THREAD_CAP``); the
table says how many.

    python benchmarks/dramatiq_throughput.py                    # full run, 20,000 messages
    python benchmarks/dramatiq_throughput.py --messages 2000    # smoke run

``--deep N`` measures only objq's file:// drain, of ``--messages`` and of ``N`` preloaded
messages, and reports the deep drain's rate as a ratio of the shallow one's (a backlog must not
slow the drain); ``--spill-at`` passes the segmented state's bound to ``ObjqBroker``.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.brokers.stub import StubBroker
from provenance import objq_revision

from objq_broker.dramatiq import ObjqBroker

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests' server helpers
from tests.support import servers
from tests.support.servers import RedisServer

QUEUE = "bench"
ACTOR = "noop"
PRODUCER_THREADS = 16
WORKER_THREADS = 8
WORKER_TIMEOUT_MS = 100
ANCHOR = "redis"
#: Longest a drain is timed; past it the rate is over the messages that ran (marked partial).
DEFAULT_DRAIN_BUDGET_SECONDS = 300.0
#: Shorter budgets for the extra objq rows, to keep a full run under ~8 minutes: objq's drain
#: runs ~130-150 msg/s on every store (see DRAMATIQ_RESULTS.md), so 20,000 would take over 2
#: minutes each. The target row, ``objq file://``, always drains everything.
DRAIN_BUDGET_SECONDS: dict[str, float] = {
    "objq memory://": 30.0,
    "objq file:// fsync=false": 30.0,
}
#: Messages per ``enqueue_many`` commit when preloading an objq drain.
PRELOAD_CHUNK = 1_000
#: Most messages a 1-thread enqueue measures per broker (absent: all of --messages). objq's
#: single-threaded producer rewrites the whole, growing state once per message, so its cost grows
#: as n^2: 20,000 sends took 70-95 s on memory:// here (kept), ~5 minutes would be expected with
#: fsync=false and far more with fsync on file:// (5,000 took 21 s with fsync=false). Those two rows
#: measure 2,000 (an optimistic rate: memory:// does ~2,400 msg/s at 2,000 but 210-280 at 20,000).
#: Redis's rate does not depend on the count; its fsync-always row measures 5,000 to save time.
SINGLE_THREAD_CAP: dict[str, int] = {
    "objq file://": 2_000,
    "objq file:// fsync=false": 2_000,
    "redis AOF fsync=always": 5_000,
}

#: Extra ``ObjqBroker`` keywords (``--spill-at``).
OBJQ_OPTIONS: dict[str, Any] = {}

REDIS_DEFAULT = servers.REDIS_IN_MEMORY
REDIS_FSYNC_ALWAYS = ("--save", "", "--appendonly", "yes", "--appendfsync", "always")


# --- the counting actor --------------------------------------------------------------------


class Counter:
    """Counts actor runs; sets ``done`` when ``target`` runs have happened."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count = 0
        self.target = 0
        self.done = threading.Event()

    def reset(self, target: int) -> None:
        with self.lock:
            self.count = 0
            self.target = target
            self.done.clear()

    def hit(self) -> None:
        with self.lock:
            self.count += 1
            if self.count >= self.target:
                self.done.set()


COUNTER = Counter()


def noop() -> None:
    COUNTER.hit()


def declare_actor(broker: dramatiq.Broker) -> dramatiq.Actor[Any, Any]:
    dramatiq.set_broker(broker)
    return dramatiq.actor(noop, actor_name=ACTOR, queue_name=QUEUE, max_retries=0)


# --- redis-server --------------------------------------------------------------------------

#: Printed instead of the Redis rows when there is no redis-server to measure.
REDIS_MISSING = (
    "# redis-server not found on PATH: the Redis rows are skipped "
    "(apt-get install redis-server to measure them)"
)


def redis_installed() -> bool:
    # Checked here rather than left to servers.start_redis, which also falls back to
    # /usr/bin/redis-server: the rows run only for a redis-server on PATH.
    return shutil.which("redis-server") is not None


def start_redis(settings: tuple[str, ...]) -> RedisServer:
    try:
        return servers.start_redis(settings)
    except RuntimeError as exc:
        sys.exit(str(exc))


# --- brokers -------------------------------------------------------------------------------


@dataclass
class Kind:
    """One row of the table: how to open a fresh broker of this kind, and how to tidy up."""

    label: str
    open: Callable[[], dramatiq.Broker]
    objq: bool = False
    note: str = ""


@dataclass
class Phase:
    messages: int
    seconds: float
    writes: int | None = None  # objq: state_writes + archive_writes
    batches: int | None = None
    commit_seconds: float | None = None
    ran: int | None = None  # drain: actor runs counted (>= messages)
    target: int | None = None  # set when the drain budget ran out first (a partial drain)

    @property
    def rate(self) -> float:
        return self.messages / self.seconds

    @property
    def writes_per_1k(self) -> float | None:
        return None if self.writes is None else self.writes * 1000 / self.messages


@dataclass
class Row:
    kind: Kind
    single: Phase | None = None
    multi: Phase | None = None
    drain: Phase | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Brokers:
    """Opens fresh brokers of each kind and removes what they left behind."""

    def __init__(self, redis_default: RedisServer | None, redis_always: RedisServer | None) -> None:
        self.redis_default = redis_default
        self.redis_always = redis_always
        self.tmpdirs: list[str] = []
        self.memory_names: list[str] = []

    def kinds(self) -> list[Kind]:
        """Every row to measure; the Redis rows only for the servers that were started."""
        kinds = [
            Kind("objq memory://", self.objq_memory, objq=True),
            Kind("objq file://", lambda: self.objq_file(fsync=True), objq=True, note="fsync"),
            Kind(
                "objq file:// fsync=false",
                lambda: self.objq_file(fsync=False),
                objq=True,
                note="extra",
            ),
        ]
        if self.redis_default is not None:
            default = self.redis_default
            kinds.append(Kind(ANCHOR, lambda: self.redis(default), note="anchor"))
        if self.redis_always is not None:
            server = self.redis_always
            kinds.append(Kind("redis AOF fsync=always", lambda: self.redis(server), note="extra"))
        kinds.append(Kind("stub", StubBroker))
        return kinds

    def objq_memory(self) -> dramatiq.Broker:
        name = f"dramatiq-bench-{uuid.uuid4().hex}"
        self.memory_names.append(name)
        return ObjqBroker(url=f"memory://{name}", **OBJQ_OPTIONS)

    def objq_file(self, *, fsync: bool) -> dramatiq.Broker:
        tmp = tempfile.mkdtemp(prefix="dramatiq-bench-objq-")
        self.tmpdirs.append(tmp)
        url = Path(tmp).as_uri() + ("" if fsync else "?fsync=false")
        return ObjqBroker(url=url, **OBJQ_OPTIONS)

    @staticmethod
    def redis(server: RedisServer) -> dramatiq.Broker:
        server.flush()
        return RedisBroker(host="127.0.0.1", port=server.port)

    def tidy(self) -> None:
        """Free what the previous measurement stored (memory stores live as long as the process)."""
        from objq_broker.storage import open_store

        for name in self.memory_names:
            store = open_store(f"memory://{name}")
            for key in store.list():
                store.delete(key)
        self.memory_names.clear()
        for tmp in self.tmpdirs:
            shutil.rmtree(tmp, ignore_errors=True)
        self.tmpdirs.clear()


def close_broker(broker: dramatiq.Broker) -> None:
    broker.close()
    if isinstance(broker, RedisBroker):
        broker.client.connection_pool.disconnect()


def deep_drains(kinds: Brokers, shallow: int, deep: int) -> None:
    """objq file://: drain ``shallow`` then ``deep`` preloaded messages; print both rates, the
    ratio, the preload time and the process's peak RSS (which the deep preload sets)."""
    kind = Kind("objq file://", lambda: kinds.objq_file(fsync=True), objq=True)
    rates = []
    for messages in (shallow, deep):
        started = time.perf_counter()
        phase = measure_drain(kinds, kind, messages, DEFAULT_DRAIN_BUDGET_SECONDS * 10)
        total = time.perf_counter() - started
        rates.append(phase.rate)
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(
            f"  objq file:// drain {messages:>9,} msgs: preload and drain {total:7.1f} s, drain "
            f"{phase.seconds:7.1f} s = {phase.rate:7,.0f} msg/s, "
            f"{phase.writes_per_1k:,.0f} writes/1k; peak RSS so far {peak_mb:,.0f} MB",
            flush=True,
        )
    print(f"\ndrain of {deep:,} / drain of {shallow:,}: {rates[1] / rates[0]:.2f}x")


def objq_writes(broker: dramatiq.Broker) -> tuple[int, int, float]:
    """(state_writes + archive_writes, batches, seconds spent committing) so far. Engines that
    also store payload bodies outside the state count those writes too (``bodies_writes``)."""
    if not isinstance(broker, ObjqBroker):
        return 0, 0, 0.0
    metrics = broker.client.metrics()
    return (
        metrics.state_writes + metrics.archive_writes + getattr(metrics, "bodies_writes", 0),
        metrics.batches,
        metrics.commit_seconds_total,
    )


@contextmanager
def fresh(kinds: Brokers, kind: Kind) -> Iterator[tuple[dramatiq.Broker, Any]]:
    broker = kind.open()
    try:
        actor = declare_actor(broker)
        yield broker, actor
    finally:
        close_broker(broker)
        kinds.tidy()


# --- workloads -----------------------------------------------------------------------------


def split(total: int, workers: int) -> list[int]:
    return [total // workers + (1 if i < total % workers else 0) for i in range(workers)]


def send_all(actor: Any, messages: int, threads: int) -> float:
    """Send ``messages`` with ``actor.send()`` from ``threads`` threads; seconds taken."""
    if threads == 1:
        started = time.perf_counter()
        for _ in range(messages):
            actor.send()
        return time.perf_counter() - started
    gate = threading.Barrier(threads + 1)
    errors: list[BaseException] = []

    def produce(count: int) -> None:
        gate.wait()
        try:
            for _ in range(count):
                actor.send()
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=produce, args=(n,)) for n in split(messages, threads)]
    for worker in workers:
        worker.start()
    gate.wait()
    started = time.perf_counter()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    return elapsed


def preload(broker: dramatiq.Broker, actor: Any, messages: int) -> None:
    """Enqueue the drain's messages (untimed). objq gets them through ``enqueue_many`` in
    commits of ``PRELOAD_CHUNK`` (the same stored jobs ``ObjqBroker.enqueue`` makes, in
    far fewer state rewrites); the other brokers through ``actor.send()`` from 16 threads."""
    if not isinstance(broker, ObjqBroker):
        send_all(actor, messages, PRODUCER_THREADS)
        return
    for first in range(0, messages, PRELOAD_CHUNK):
        count = min(PRELOAD_CHUNK, messages - first)
        broker.client.enqueue_many(QUEUE, [actor.message().encode() for _ in range(count)])
    broker.client.flush()


def measure_enqueue(kinds: Brokers, kind: Kind, messages: int, threads: int) -> Phase:
    with fresh(kinds, kind) as (broker, actor):
        writes0, batches0, commit0 = objq_writes(broker)
        seconds = send_all(actor, messages, threads)
        if isinstance(broker, ObjqBroker):
            broker.client.flush()  # nothing should be pending: sends return once durable
        writes1, batches1, commit1 = objq_writes(broker)
    phase = Phase(messages, seconds)
    if kind.objq:
        phase.writes = writes1 - writes0
        phase.batches = batches1 - batches0
        phase.commit_seconds = commit1 - commit0
    return phase


def measure_drain(kinds: Brokers, kind: Kind, messages: int, budget: float) -> Phase:
    """Drain ``messages`` preloaded messages; stop the clock after ``budget`` seconds at most
    (then the rate is over the messages that ran by then, and the phase is marked partial)."""
    with fresh(kinds, kind) as (broker, actor):
        preload(broker, actor, messages)
        COUNTER.reset(messages)
        writes0, batches0, commit0 = objq_writes(broker)
        worker = dramatiq.Worker(
            broker, worker_threads=WORKER_THREADS, worker_timeout=WORKER_TIMEOUT_MS
        )
        started = time.perf_counter()
        worker.start()
        try:
            finished = COUNTER.done.wait(budget)
            elapsed = time.perf_counter() - started
            ran = COUNTER.count
            if not finished:  # the bill of what ran so far, before shutdown releases the rest
                writes1, batches1, commit1 = objq_writes(broker)
        finally:
            worker.stop()
        if finished:
            if isinstance(broker, ObjqBroker):
                broker.client.flush()  # acks submitted without waiting become durable here
            writes1, batches1, commit1 = objq_writes(broker)
    if finished:
        phase = Phase(messages, elapsed, ran=ran)
    else:
        phase = Phase(ran, elapsed, ran=ran, target=messages)
    if kind.objq:
        phase.writes = writes1 - writes0
        phase.batches = batches1 - batches0
        phase.commit_seconds = commit1 - commit0
    return phase


# --- reporting -----------------------------------------------------------------------------


def fmt_rate(phase: Phase | None, full: int) -> str:
    if phase is None:
        return "-"
    text = f"{phase.rate:,.0f}"
    if phase.target is not None:
        return f"{text} (partial: {phase.messages:,} of {phase.target:,} in {phase.seconds:.0f} s)"
    return text if phase.messages == full else f"{text} ({phase.messages:,} msgs)"


def fmt_ratio(phase: Phase | None, anchor: Phase | None) -> str:
    if phase is None or anchor is None:
        return "-"
    return f"{phase.rate / anchor.rate:.2f}"


def ratios(row: Row, anchor: Row | None) -> tuple[str, str, str]:
    """The "vs redis" cells of ``row`` (enqueue x1, enqueue x16, drain): ``n/a`` when there is
    no Redis row to compare with, rather than a number with nothing behind it."""
    if anchor is None:
        return "n/a", "n/a", "n/a"
    return (
        fmt_ratio(row.single, anchor.single),
        fmt_ratio(row.multi, anchor.multi),
        fmt_ratio(row.drain, anchor.drain),
    )


def fmt_writes(phase: Phase | None) -> str:
    if phase is None or phase.writes_per_1k is None:
        return "-"
    return f"{phase.writes_per_1k:,.0f}"


REDIS_NOTE = (
    "Redis durability: the anchor runs with persistence off (`--save '' --appendonly no`), so "
    "an acknowledged message lives only in memory. Redis never fsyncs per operation unless told "
    "to: its stock config snapshots (RDB) now and then, and `appendonly yes` defaults to "
    "`appendfsync everysec` (up to ~1 s of writes lost on a crash). The row `redis AOF "
    "fsync=always` fsyncs every write, as objq file:// (fsync=True) does every commit."
)


def table(rows: list[Row], messages: int) -> str:
    anchor = next((row for row in rows if row.kind.label == ANCHOR), None)
    lines = [
        f"| broker | enqueue 1 thread (msg/s) | vs redis | enqueue {PRODUCER_THREADS} threads "
        f"(msg/s) | vs redis | drain, {WORKER_THREADS} worker threads (msg/s) | vs redis |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        vs_single, vs_multi, vs_drain = ratios(row, anchor)
        lines.append(
            f"| {row.kind.label} | {fmt_rate(row.single, messages)} | {vs_single} | "
            f"{fmt_rate(row.multi, messages)} | {vs_multi} | {fmt_rate(row.drain, messages)} | "
            f"{vs_drain} |"
        )
    lines += [
        "",
        "objq storage writes per 1,000 messages (state_writes + archive_writes, + bodies_writes "
        "where the engine has them), and the drain's engine batches (including batches that "
        "wrote nothing, such as empty delay-queue claims):",
        "",
        f"| broker | writes/1k enqueue 1 thread | writes/1k enqueue {PRODUCER_THREADS} threads | "
        "writes/1k drain | drain batches | drain msgs/batch | drain time in commits (% of wall) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        if not row.kind.objq or row.drain is None:
            continue
        drain = row.drain
        batches = drain.batches or 0
        per_commit = f"{drain.messages / batches:,.1f}" if batches else "-"
        share = (
            f"{100 * drain.commit_seconds / drain.seconds:.0f} %"
            if drain.commit_seconds is not None
            else "-"
        )
        lines.append(
            f"| {row.kind.label} | {fmt_writes(row.single)} | {fmt_writes(row.multi)} | "
            f"{fmt_writes(drain)} | {batches:,} | {per_commit} | {share} |"
        )
    if anchor is not None:  # the note explains the Redis rows: none, no note
        lines += ["", REDIS_NOTE]
    return "\n".join(lines)


def machine() -> str:
    try:
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "?"
    return (
        f"{platform.system()} {platform.release()} {platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, dramatiq {version('dramatiq')}, "
        f"redis-py {version('redis')}, load average at start {load}"
    )


def objq_source() -> str:
    """Where objq_broker was imported from, and its git commit (with a dirty mark) if known."""
    import objq_broker

    root = Path(objq_broker.__file__).resolve().parent.parent
    revision = objq_revision(root)
    if revision is None:
        return f"objq_broker from {root} (not a git checkout)"
    return f"objq_broker from {root} at {revision}"


def redis_version() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        return "not installed"
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False).stdout
    return out.split()[2].removeprefix("v=") if out else "?"


# --- main ----------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000, help="messages per measurement")
    parser.add_argument(
        "--only",
        action="append",
        help="run only brokers whose label contains this text (repeatable; the anchor always "
        "runs when redis-server is installed)",
    )
    parser.add_argument(
        "--no-single-cap",
        action="store_true",
        help="measure the 1-thread enqueue with all --messages on every broker (slow for objq)",
    )
    parser.add_argument(
        "--no-drain-budget",
        action="store_true",
        help=f"time every drain to the end (up to {DEFAULT_DRAIN_BUDGET_SECONDS:g} s)",
    )
    parser.add_argument(
        "--no-redis-fsync", action="store_true", help="skip the 'redis AOF fsync=always' row"
    )
    parser.add_argument(
        "--deep", type=int, default=None, help="only objq file:// drains: --messages, then this"
    )
    parser.add_argument(
        "--spill-at", type=int, default=None, help="ObjqBroker(spill_at=...) (docs/runs.md)"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.spill_at is not None:
        OBJQ_OPTIONS["spill_at"] = args.spill_at
    if args.deep is not None:
        print(f"# dramatiq_throughput: {' '.join(sys.argv[1:])}")
        print(f"# {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {machine()}; {objq_source()}")
        deep_drains(Brokers(None, None), args.messages, args.deep)
    else:
        side_by_side(args)


def start_redis_servers(no_fsync: bool) -> tuple[RedisServer | None, RedisServer | None]:
    """(the anchor's server, the fsync-always row's server); neither without redis-server."""
    if not redis_installed():
        print(REDIS_MISSING, flush=True)
        return None, None
    default = start_redis(REDIS_DEFAULT)
    return default, None if no_fsync else start_redis(REDIS_FSYNC_ALWAYS)


def side_by_side(args: argparse.Namespace) -> None:
    """Every broker kind, the anchor included: enqueue from 1 and 16 threads, and drain."""
    messages = args.messages

    print(f"# dramatiq_throughput: {' '.join(sys.argv[1:]) or '(defaults)'}")
    print(f"# {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {machine()}; redis-server {redis_version()}")
    print(f"# {objq_source()}")
    print(
        f"# {messages:,} no-op messages per measurement; enqueue from 1 and {PRODUCER_THREADS} "
        f"threads; drain with Worker(worker_threads={WORKER_THREADS}, "
        f"worker_timeout={WORKER_TIMEOUT_MS}); redis: --save '' --appendonly no (no fsync)"
    )
    redis_default, redis_always = start_redis_servers(args.no_redis_fsync)
    brokers = Brokers(redis_default, redis_always)
    rows: list[Row] = []
    run_started = time.perf_counter()
    try:
        for kind in brokers.kinds():
            if (
                args.only
                and kind.label != ANCHOR
                and not any(text in kind.label for text in args.only)
            ):
                continue
            row = Row(kind)
            cap = None if args.no_single_cap else SINGLE_THREAD_CAP.get(kind.label)
            single = messages if cap is None else min(messages, cap)
            budget = DEFAULT_DRAIN_BUDGET_SECONDS
            if not args.no_drain_budget:
                budget = DRAIN_BUDGET_SECONDS.get(kind.label, budget)
            for name, run in (
                ("enqueue x1", lambda k=kind, n=single: measure_enqueue(brokers, k, n, 1)),
                (
                    f"enqueue x{PRODUCER_THREADS}",
                    lambda k=kind: measure_enqueue(brokers, k, messages, PRODUCER_THREADS),
                ),
                ("drain", lambda k=kind, b=budget: measure_drain(brokers, k, messages, b)),
            ):
                phase = run()
                extra = "" if phase.writes is None else f", {phase.writes_per_1k:,.0f} writes/1k"
                ran = "" if phase.ran in (None, phase.messages) else f", ran {phase.ran:,}"
                if phase.target is not None:
                    ran += f", PARTIAL: budget of {budget:g} s ran out"
                print(
                    f"  {kind.label:<26} {name:<12} {phase.messages:>7,} msgs "
                    f"{phase.seconds:8.2f} s {phase.rate:10,.0f} msg/s{extra}{ran}",
                    flush=True,
                )
                if name == "enqueue x1":
                    row.single = phase
                elif name == "drain":
                    row.drain = phase
                else:
                    row.multi = phase
            rows.append(row)
    finally:
        for server in (redis_default, redis_always):
            if server is not None:
                server.stop()
        brokers.tidy()
    print()
    print(table(rows, messages))
    print()
    print(f"total run time: {time.perf_counter() - run_started:,.0f} s")


if __name__ == "__main__":
    main()
