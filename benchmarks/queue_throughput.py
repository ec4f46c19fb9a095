"""Queue throughput: objq's ``Queue`` against the anchor, jqueue's ``BrokerQueue`` (PyPI 1.0.0).

Both libraries keep a whole queue in one object changed by compare-and-set writes, and both
batch concurrent operations into one write (group commit), so they are measured side by side,
in the same process and the same run, on the same storage kinds:

* ``memory``: objq ``Queue("memory://<unique>")``; jqueue ``InMemoryStorage()``.
* ``file``: a fresh temporary directory per run; objq ``Queue(Path(tmp).as_uri())``
  (fsyncs each write); jqueue ``LocalFileSystemStorage(tmp / "state.json")`` (does not fsync).
* ``file-nofsync`` (opt-in, ``--storage file-nofsync``): the same, with objq's
  ``fsync=False``, to separate objq's durability cost from its engine cost.

Each library runs in its natural concurrency model: objq's ``Queue`` is synchronous and
thread-safe, so concurrency N is N threads; jqueue is asyncio-only, so concurrency N is N tasks
on one event loop. objq's ``AsyncQueue`` runs as jqueue does, N tasks on one loop, in a column
of its own. Payloads are 1 KiB of ASCII text (base64 of random bytes), fresh per job.

Workloads:

* **enqueue**: single ``enqueue`` calls from an empty queue, at concurrency 1, 10, 50.
* **cycle**: each worker loops enqueue -> claim/dequeue one job -> ack (ack waits until it is
  durable in both libraries); throughput in cycles per second.
* **backlog**: single enqueues into a queue already holding 0 / 1,000 / 10,000 / 100,000 jobs,
  at concurrency 50 and 1. objq preloads with ``enqueue_many`` (one commit); jqueue has no bulk
  enqueue, so its preload is a ``QueueState`` built with its own models and written through its
  storage port (``InMemoryStorage(initial_content=...)``, documented for pre-populating).

Storage writes are counted for both: objq from ``Queue.metrics()`` (``state_writes``, and the
archive's and payload bodies' objects, ``archive_writes`` and ``bodies_writes``), jqueue by
subclassing its storage adapters to count ``write`` calls.

Each library/storage pair is warmed up once (a short unrecorded run) before measuring; every case
then runs ``--runs`` times (default 3, alternating objq and jqueue) and reports the median.

    .venv-bench/bin/python benchmarks/queue_throughput.py            # full run, ~10 minutes
    .venv-bench/bin/python benchmarks/queue_throughput.py --quick    # smoke run, ~1 minute
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import copy
import gc
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import TypeVar

from jqueue import BrokerQueue, InMemoryStorage, LocalFileSystemStorage
from jqueue.core import codec as jq_codec
from jqueue.domain.models import Job as JqJob
from jqueue.domain.models import QueueState as JqState
from provenance import objq_build, objq_revision

import objq_broker
from objq_broker import AsyncQueue, Queue
from objq_broker.builders import Delivery
from objq_broker.engine.batch import EngineMetrics

QUEUE = "bench"
T = TypeVar("T")
PAYLOAD_BYTES = 1024
STORAGES = ("memory", "file")
#: Opt-in (``--storage file-nofsync``): objq's file store without fsync, as jqueue's writes.
EXTRA_STORAGES = ("file-nofsync",)
CONCURRENCY = (1, 10, 50)
BACKLOGS = (0, 1_000, 10_000, 100_000)
BACKLOG_CONCURRENCY = (50, 1)

# Operations per timed run. The enqueue workload starts from an empty queue, so the state grows
# by this many jobs during the run (the same for both libraries).
ENQUEUE_OPS = {1: 500, 10: 2_000, 50: 2_000}
CYCLE_OPS = {1: 1_000, 10: 3_000, 50: 3_000}
# Backlog workload: (backlog, concurrency) -> (objq ops, jqueue ops). The ops stay a small share
# of the backlog (<= 25 %) so the backlog is what is measured. objq's rows at concurrency 50 run
# 5,000, so a one-off pause (the first commits after a large preload) does not set the rate.
# jqueue re-decodes and re-encodes the whole state per commit, so at large backlogs it gets
# fewer ops to stay within the time budget; its ops/s at a fixed backlog hardly depends on the
# count (the backlog dwarfs it).
BACKLOG_OPS = {
    (0, 50): (5_000, 1_000),
    (1_000, 50): (250, 250),
    (10_000, 50): (5_000, 300),
    (100_000, 50): (5_000, 100),
    (0, 1): (200, 200),
    (1_000, 1): (100, 100),
    (10_000, 1): (50, 20),
    (100_000, 1): (50, 3),
}


def payloads(n: int) -> list[bytes]:
    """``n`` distinct 1 KiB ASCII payloads (JSON-friendly text, as a real producer sends)."""
    raw = os.urandom(n * 768)
    return [base64.b64encode(raw[i * 768 : (i + 1) * 768]) for i in range(n)]


@dataclass
class Sample:
    ops: int
    seconds: float
    state_writes: int
    #: Objects written besides the state: the archive's and payload bodies'.
    object_writes: int = 0

    @property
    def rate(self) -> float:
        return self.ops / self.seconds


def split(total: int, workers: int) -> list[int]:
    """``total`` operations spread over ``workers`` as evenly as possible."""
    return [total // workers + (1 if i < total % workers else 0) for i in range(workers)]


# --- objq: a synchronous Queue driven by threads -------------------------------------------


#: Extra ``Queue`` keywords for objq (``--spill-at``).
OBJQ_OPTIONS: dict[str, object] = {}


@contextmanager
def objq_location(storage: str) -> Iterator[tuple[str, dict[str, object]]]:
    """A fresh place for one run: its URL and the options objq opens it with."""
    if storage == "memory":
        yield f"memory://bench-{uuid.uuid4().hex}", dict(OBJQ_OPTIONS)
        return
    tmp = tempfile.mkdtemp(prefix="objq-bench-")
    try:
        yield Path(tmp).as_uri(), {"fsync": storage != "file-nofsync", **OBJQ_OPTIONS}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def objq_queue(storage: str) -> Iterator[Queue]:
    with objq_location(storage) as (url, options):
        q = Queue(url, **options)  # type: ignore[arg-type]
        try:
            yield q
        finally:
            q.close()
            for key in q.store.list() if storage == "memory" else ():
                q.store.delete(key)  # memory stores live as long as the process: free it


def objq_run(storage: str, workload: str, concurrency: int, ops: int, backlog: int) -> Sample:
    with objq_queue(storage) as q:
        q.declare(QUEUE)
        if backlog:
            q.enqueue_many(QUEUE, payloads(backlog))
        shares = split(ops, concurrency)
        bodies = payloads(ops)
        starts = [sum(shares[:i]) for i in range(concurrency)]

        def enqueue(first: int, count: int) -> None:
            for body in bodies[first : first + count]:
                q.enqueue(QUEUE, body)

        def cycle(first: int, count: int) -> None:
            for body in bodies[first : first + count]:
                q.enqueue(QUEUE, body)
                deliveries = q.claim(QUEUE)
                while not deliveries:  # cannot happen (see jqueue's cycle), kept for safety
                    deliveries = q.claim(QUEUE)
                q.ack(deliveries[0])

        work = enqueue if workload == "enqueue" else cycle
        jobs = [(starts[i], shares[i]) for i in range(concurrency)]
        before = copy.copy(q.metrics())  # a snapshot: the counters go on counting
        return objq_sample(ops, _timed_threads(work, jobs), before, q.metrics())


def objq_sample(ops: int, elapsed: float, before: EngineMetrics, after: EngineMetrics) -> Sample:
    """A run of objq's: its storage writes are what its engine's counters moved by."""
    return Sample(
        ops,
        elapsed,
        after.state_writes - before.state_writes,
        after.archive_writes + after.bodies_writes - before.archive_writes - before.bodies_writes,
    )


def objq_async_run(storage: str, workload: str, concurrency: int, ops: int) -> Sample:
    """``objq_run`` through ``AsyncQueue``, ``concurrency`` tasks on one event loop."""
    with objq_location(storage) as (url, options):
        return asyncio.run(_objq_async(url, options, workload, concurrency, ops))


async def _objq_async(
    url: str, options: dict[str, object], workload: str, concurrency: int, ops: int
) -> Sample:
    async with AsyncQueue(url, **options) as q:  # type: ignore[arg-type]
        try:
            return await _objq_async_work(q, workload, concurrency, ops)
        finally:
            for key in q.core.store.list() if url.startswith("memory://") else ():
                q.core.store.delete(key)


async def _objq_async_work(q: AsyncQueue, workload: str, concurrency: int, ops: int) -> Sample:
    await q.declare(QUEUE)

    async def ack(delivery: Delivery) -> None:
        await q.ack(delivery)

    before = copy.copy(q.metrics())
    elapsed = await _timed_tasks(
        workload,
        concurrency,
        ops,
        enqueue=lambda body: q.enqueue(QUEUE, body),
        take=lambda: q.claim(QUEUE),
        ack=ack,
    )
    return objq_sample(ops, elapsed, before, q.metrics())


async def _timed_tasks(
    workload: str,
    concurrency: int,
    ops: int,
    *,
    enqueue: Callable[[bytes], Awaitable[object]],
    take: Callable[[], Awaitable[Sequence[T]]],
    ack: Callable[[T], Awaitable[object]],
) -> float:
    """Run ``workload`` on ``concurrency`` tasks of one event loop, ``ops`` in all, through
    one library's ``enqueue``, ``take`` (one job) and ``ack``; the seconds taken. In the cycle,
    each task's enqueue commits before its take, and every task takes at most one job per
    enqueue, so a take always finds a job (the loop is kept for safety)."""
    shares = split(ops, concurrency)
    bodies = payloads(ops)
    starts = [sum(shares[:i]) for i in range(concurrency)]

    async def produce(first: int, count: int) -> None:
        for body in bodies[first : first + count]:
            await enqueue(body)

    async def cycle(first: int, count: int) -> None:
        for body in bodies[first : first + count]:
            await enqueue(body)
            taken = await take()
            while not taken:
                taken = await take()
            await ack(taken[0])

    work = produce if workload == "enqueue" else cycle
    gc.collect()
    started = time.perf_counter()
    await asyncio.gather(*(work(starts[i], shares[i]) for i in range(concurrency)))
    return time.perf_counter() - started


def _timed_threads(work: Callable[[int, int], None], jobs: list[tuple[int, int]]) -> float:
    """Run ``work(*job)`` on one thread per job, all released at once; the seconds taken."""
    gate = threading.Barrier(len(jobs) + 1)
    errors: list[BaseException] = []

    def worker(first: int, count: int) -> None:
        gate.wait()
        try:
            work(first, count)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=job) for job in jobs]
    for thread in threads:
        thread.start()
    gc.collect()
    gate.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    return elapsed


# --- jqueue: BrokerQueue (its group-commit API) driven by asyncio tasks --------------------


class CountingMemoryStorage(InMemoryStorage):
    writes = 0

    async def write(self, content: bytes, if_match: str | None = None) -> str:
        etag = await super().write(content, if_match)
        self.writes += 1
        return etag


class CountingFileStorage(LocalFileSystemStorage):
    writes = 0

    async def write(self, content: bytes, if_match: str | None = None) -> str:
        etag = await super().write(content, if_match)
        self.writes += 1
        return etag


_jq_preloads: dict[int, bytes] = {}


def jq_preload(backlog: int) -> bytes:
    """A jqueue state holding ``backlog`` queued jobs, built with jqueue's own models."""
    if backlog not in _jq_preloads:
        jobs = tuple(JqJob.new(QUEUE, body) for body in payloads(backlog))
        _jq_preloads[backlog] = jq_codec.encode(JqState(jobs=jobs, version=len(jobs)))
    return _jq_preloads[backlog]


async def _jq_run(
    storage: CountingMemoryStorage | CountingFileStorage, workload: str, concurrency: int, ops: int
) -> Sample:
    async with BrokerQueue(storage) as q:

        async def ack(job: JqJob) -> None:
            await q.ack(job.id)

        writes0 = storage.writes
        elapsed = await _timed_tasks(
            workload,
            concurrency,
            ops,
            enqueue=lambda body: q.enqueue(QUEUE, body),
            take=lambda: q.dequeue(QUEUE),
            ack=ack,
        )
        return Sample(ops, elapsed, storage.writes - writes0)


def jq_run(storage: str, workload: str, concurrency: int, ops: int, backlog: int) -> Sample:
    preload = jq_preload(backlog) if backlog else b""
    if storage == "memory":
        return asyncio.run(_jq_run(CountingMemoryStorage(preload), workload, concurrency, ops))
    tmp = Path(tempfile.mkdtemp(prefix="jqueue-bench-"))
    try:
        path = tmp / "state.json"
        if preload:
            path.write_bytes(preload)
        return asyncio.run(_jq_run(CountingFileStorage(path), workload, concurrency, ops))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --- running and reporting ----------------------------------------------------------------


@dataclass
class Result:
    storage: str
    workload: str
    concurrency: int
    backlog: int
    objq: list[Sample]
    jq: list[Sample]
    #: objq's ``AsyncQueue`` (no backlog rows).
    aio: list[Sample] = field(default_factory=list)


def median_rate(samples: list[Sample]) -> float:
    return statistics.median(s.rate for s in samples)


def spread(samples: list[Sample]) -> str:
    """Half the range of the runs, as a share of the median ('' for a single run)."""
    if len(samples) < 2:
        return ""
    rates = [s.rate for s in samples]
    return f" ±{(max(rates) - min(rates)) / 2 / statistics.median(rates):.0%}"


def writes_per_1k(samples: list[Sample], objects: bool = True) -> float:
    writes = sum(s.state_writes + (s.object_writes if objects else 0) for s in samples)
    return 1000.0 * writes / sum(s.ops for s in samples)


def objq_revision_here() -> str:
    """The checkout objq_broker was imported from (a compiled copy's or an installed wheel's
    has none), and its build."""
    source = Path(objq_broker.__file__ or "").resolve().parent.parent
    return f"{objq_revision(source) or 'not a checkout'}; {objq_build()}"


def load_average() -> str:
    try:
        return "/".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def measure(
    storage: str,
    workload: str,
    concurrency: int,
    backlog: int,
    *,
    ops: tuple[int, int],
    runs: int,
) -> Result:
    result = Result(storage, workload, concurrency, backlog, [], [])
    for _ in range(runs):  # alternate the libraries, so drift hits them alike
        result.objq.append(objq_run(storage, workload, concurrency, ops[0], backlog))
        if not backlog:
            result.aio.append(objq_async_run(storage, workload, concurrency, ops[0]))
        result.jq.append(jq_run(storage, workload, concurrency, ops[1], backlog))
    aio = f"  AsyncQueue {median_rate(result.aio):>9,.0f}/s" if result.aio else ""
    log(
        f"  {storage:6} {workload:7} c={concurrency:<2} backlog={backlog:<6} "
        f"objq {median_rate(result.objq):>9,.0f}/s{aio}  jqueue {median_rate(result.jq):>9,.0f}/s"
        f"  ratio {median_rate(result.objq) / median_rate(result.jq):6.2f}"
    )
    return result


def warm_up(storage: str) -> None:
    for run in (objq_run, jq_run):
        run(storage, "enqueue", 10, 200, 0)
        run(storage, "cycle", 10, 100, 0)
    objq_async_run(storage, "cycle", 10, 100)


def fmt(rate: float) -> str:
    return f"{rate:,.0f}" if rate >= 100 else f"{rate:,.1f}" if rate >= 10 else f"{rate:.2f}"


def row(result: Result, first: list[str], ops_cell: str) -> str:
    objq, jq = median_rate(result.objq), median_rate(result.jq)
    objq_w, jq_w = writes_per_1k(result.objq), writes_per_1k(result.jq)
    state_w = writes_per_1k(result.objq, objects=False)
    cells = [
        *first,
        f"{fmt(objq)}{spread(result.objq)}",
        f"{fmt(jq)}{spread(result.jq)}",
        f"**{objq / jq:.2f}x**",
        f"{objq_w:,.1f} ({state_w:,.1f} + {objq_w - state_w:,.1f})",
        f"{jq_w:,.1f}",
        f"{objq_w / jq_w:.2f}",
        ops_cell,
    ]
    if result.aio:
        aio, aio_w = median_rate(result.aio), writes_per_1k(result.aio)
        aio_state = writes_per_1k(result.aio, objects=False)
        cells[len(first) + 3 : len(first) + 3] = [
            f"{fmt(aio)}{spread(result.aio)}",
            f"**{aio / jq:.2f}x**",
            f"{aio_w:,.1f} ({aio_state:,.1f} + {aio_w - aio_state:,.1f})",
        ]
    return "| " + " | ".join(cells) + " |"


def table(title: str, unit: str, results: list[Result], backlog_column: bool) -> list[str]:
    head = ["storage", *(["queued before"] if backlog_column else []), "concurrency"]
    per = "cycle" if unit == "cycles/s" else "op"
    lines = [
        f"### {title}",
        "",
        "| "
        + " | ".join(
            [
                *head,
                f"objq {unit} (threads)",
                f"jqueue {unit} (asyncio tasks)",
                "objq / jqueue",
                *(
                    [
                        f"objq AsyncQueue {unit} (asyncio tasks)",
                        "AsyncQueue / jqueue",
                        f"AsyncQueue writes per 1k {per}s (state + archive and bodies)",
                    ]
                    if not backlog_column
                    else []
                ),
                f"objq writes per 1k {per}s (state + archive and bodies)",
                f"jqueue writes per 1k {per}s",
                "writes objq / jqueue",
                f"{per}s per run (objq / jqueue)",
            ]
        )
        + " |",
        "|" + "---|" * (len(head) + 7 + (0 if backlog_column else 3)),
    ]
    for r in results:
        first = [r.storage, *([f"{r.backlog:,}"] if backlog_column else []), str(r.concurrency)]
        o, j = r.objq[0].ops, r.jq[0].ops
        ops_cell = f"{o:,}" if o == j else f"{o:,} / {j:,}"
        lines.append(row(r, first, ops_cell))
    return [*lines, ""]


def verdicts(backlog: list[Result], enqueue: list[Result]) -> list[str]:
    lines = ["### Targets", ""]
    for r in backlog:
        if r.storage.startswith("file") and r.backlog == 10_000:
            ratio = median_rate(r.objq) / median_rate(r.jq)
            met = "MET" if ratio >= 20 else "NOT MET"
            lines.append(
                f"- objq ≥ 20x jqueue BrokerQueue at 10,000 queued, {r.storage} storage, "
                f"concurrency {r.concurrency}: {ratio:.2f}x — **{met}**"
            )
    for r in [*enqueue, *backlog]:
        if r.concurrency == 50 and r.backlog in (0, 10_000):
            rate = median_rate(r.objq)
            met = "MET" if rate >= 5000 else "NOT MET"
            where = "backlog table" if r in backlog else "enqueue table"
            lines.append(
                f"- objq ≥ 5,000 enqueue ops/s at concurrency 50, {r.storage} storage, "
                f"{r.backlog:,} queued before ({where}, {r.objq[0].ops:,} ops): "
                f"{rate:,.0f} ops/s — **{met}**"
            )
    empty = {(r.storage, r.concurrency): median_rate(r.objq) for r in backlog if not r.backlog}
    for r in backlog:
        base = empty.get((r.storage, r.concurrency))
        if r.backlog == 100_000 and r.concurrency == 50 and base:
            ratio = median_rate(r.objq) / base
            met = "MET" if ratio >= 0.8 else "NOT MET"
            lines.append(
                f"- objq into 100,000 queued ≥ 0.8x its rate into an empty queue, {r.storage} "
                f"storage, concurrency 50: {ratio:.2f}x — **{met}**"
            )
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one run, fewer ops, no 100k row")
    parser.add_argument("--runs", type=int, default=None, help="runs per case (default 3)")
    parser.add_argument(
        "--storage",
        choices=(*STORAGES, *EXTRA_STORAGES, "both"),
        default="both",
        help="both = memory and file (default); file-nofsync = objq's file store, fsync off",
    )
    parser.add_argument(
        "--spill-at",
        type=int,
        default=None,
        help="objq keeps at most this many ready jobs per queue in the state's head and moves "
        "the rest to runs (docs/runs.md); default: the library's",
    )
    parser.add_argument(
        "--backlog-only", action="store_true", help="only the enqueue-into-a-backlog rows"
    )
    parser.add_argument(
        "--cycle-only", action="store_true", help="only the enqueue -> claim -> ack rows"
    )
    args = parser.parse_args()
    if args.spill_at is not None:
        OBJQ_OPTIONS["spill_at"] = args.spill_at
    runs = args.runs or (1 if args.quick else 3)
    scale = 4 if args.quick else 1
    storages = STORAGES if args.storage == "both" else (args.storage,)
    backlogs = BACKLOGS[:-1] if args.quick else BACKLOGS

    def ops(n: int) -> int:
        return max(n // scale, 2)

    total_started = time.perf_counter()
    load_before = load_average()
    enqueue: list[Result] = []
    cycles: list[Result] = []
    backlog: list[Result] = []
    for storage in storages:
        log(f"[{storage}] warming up")
        warm_up(storage)
        for c in () if args.backlog_only or args.cycle_only else CONCURRENCY:
            n = ops(ENQUEUE_OPS[c])
            enqueue.append(measure(storage, "enqueue", c, 0, ops=(n, n), runs=runs))
        for c in () if args.backlog_only else CONCURRENCY:
            n = ops(CYCLE_OPS[c])
            cycles.append(measure(storage, "cycle", c, 0, ops=(n, n), runs=runs))
        for c in () if args.cycle_only else BACKLOG_CONCURRENCY:
            for b in backlogs:
                o, j = BACKLOG_OPS[(b, c)]
                backlog.append(measure(storage, "enqueue", c, b, ops=(ops(o), ops(j)), runs=runs))
    took = time.perf_counter() - total_started
    load_after = load_average()

    mode = "".join(f" {arg}" for arg in sys.argv[1:])
    print(
        f"## Queue throughput: objq {version('objq-broker')} ({objq_revision_here()}) vs jqueue "
        f"{version('jqueue')} (BrokerQueue)\n\n"
        f"`.venv-bench/bin/python benchmarks/queue_throughput.py{mode}` — "
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, {platform.machine()} {platform.system()}; "
        f"median of {runs} run(s) per case (± = half the range), one warm-up per "
        f"library and storage; whole run {took:.0f} s; load average (1/5/15 min) "
        f"{load_before} before, {load_after} after.\n\n"
        f"Payloads are {PAYLOAD_BYTES} bytes. Ratios > 1 favour objq (for writes, < 1 means "
        f"objq writes less). objq's file store fsyncs every write (unless file-nofsync); "
        f"jqueue's does not. "
        f"objq's archive writes store finished (acked) jobs; its bodies writes, payloads kept "
        f"out of a state that would otherwise pass 64 KiB.\n"
    )
    lines = [
        *table("Enqueue, from an empty queue", "ops/s", enqueue, False),
        *table("Enqueue → claim → ack cycle", "cycles/s", cycles, False),
        *table(
            "Enqueue into a backlog (objq preloads with enqueue_many, jqueue with a prebuilt "
            "state)",
            "ops/s",
            backlog,
            True,
        ),
        *verdicts(backlog, enqueue),
    ]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
