"""Queues on a real S3 server (SeaweedFS) behind a proxy that injects network faults.

The proxy (``tests/support/fault_proxy.py``) answers 503 Slow Down, resets connections,
executes a request and then drops its answer, holds requests without ever answering, and
delays them. The tests check what callers may rely on whatever the network does:

* no acknowledged enqueue is lost, and no job is acknowledged twice;
* once the faults stop, everything drains;
* a call that fails raises a :class:`~objq_broker.errors.StorageError` subclass, never a
  queue error, and does so about when the commit deadline says: the deadline plus at most the
  one storage call in flight when it passed (``CALL_SLACK_SECONDS``), never after the SDK's
  own minute-long timeouts.

The same workload also runs on six writers of one in-memory store that injects faults
(``FaultyStore``): many more commits a second than SeaweedFS takes, so a writer that looks for
its landed write meets far more commits by the others meanwhile.
"""

from __future__ import annotations

import functools
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

import pytest

from objq_broker import Queue, QueueStats
from objq_broker.builders import Delivery
from objq_broker.engine.archive import iter_archive
from objq_broker.errors import JobNotFound, LeaseLost, QueueError, StorageError
from objq_broker.storage import MemoryStore, s3
from objq_broker.storage.faulty import FaultyStore
from tests.support.fault_proxy import FaultProxy, Faults
from tests.support.servers import create_s3_bucket, new_bucket_name
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

T = TypeVar("T")

#: The commit deadline of the queues here, unless a test says otherwise.
DEADLINE_SECONDS = 10.0
#: How long past the deadline a call may fail: the storage call in flight when the deadline
#: passed, every attempt of it timing out (the proxy accepts connections at once, so no
#: connect timeout adds up), plus a second for scheduling.
CALL_SLACK_SECONDS = s3.DEFAULT_MAX_ATTEMPTS * s3.DEFAULT_READ_TIMEOUT_SECONDS + 1.0
#: The mix of faults while the workload runs: each request has a 20% chance of one of them.
WORKLOAD_FAULTS = Faults(
    unavailable=0.08,
    reset=0.05,
    drop_after=0.05,
    blackhole=0.02,
    latency=0.1,
    latency_seconds=0.05,
)
#: How long the workload's faults last.
FAULT_SECONDS = 5.0
#: The workload's commit deadline: longer than the faults plus one blackholed call, so no batch
#: can reach it. The engine must ride the faults out; the test still checks how any failure
#: a caller sees is reported.
WORKLOAD_DEADLINE_SECONDS = FAULT_SECONDS + CALL_SLACK_SECONDS + 1.0
#: Longer than an ack can take, so that no lease runs out under a slow ack.
LEASE_SECONDS = 30.0
PRODUCERS = 3
CONSUMERS = 3
QUEUE = "jobs"


@pytest.fixture
def proxy(seaweedfs_endpoint: str) -> Iterator[FaultProxy]:
    with FaultProxy(seaweedfs_endpoint, seed=20261126) as started:
        yield started


@pytest.fixture
def bucket(seaweedfs_endpoint: str) -> str:
    name = new_bucket_name()
    create_s3_bucket(seaweedfs_endpoint, name)
    return name


@pytest.fixture
def url(bucket: str, proxy: FaultProxy) -> str:
    """A store in a new bucket, reached through the proxy."""
    return f"s3://{bucket}/objq?endpoint_url={proxy.url}"


def open_queue(url: str, mode: str, deadline: float = DEADLINE_SECONDS) -> Queue:
    return Queue(url, broker=mode, commit_deadline_seconds=deadline)


def timed(call: Callable[[], T]) -> tuple[T | None, Exception | None, float]:
    """(result, None, seconds) or (None, error, seconds)."""
    started = time.monotonic()
    try:
        return call(), None, time.monotonic() - started
    except Exception as exc:
        return None, exc, time.monotonic() - started


def in_background(
    call: Callable[[], T],
) -> tuple[threading.Thread, list[tuple[T | None, Exception | None, float]]]:
    """Start ``timed(call)`` in a thread; the list gets its outcome."""
    outcome: list[tuple[T | None, Exception | None, float]] = []
    thread = threading.Thread(target=lambda: outcome.append(timed(call)))
    thread.start()
    return thread, outcome


def state_path(url: str) -> str:
    """The request target of the state object of the store at ``url``."""
    bucket, prefix = url.removeprefix("s3://").split("?")[0].split("/", 1)
    return f"/{bucket}/{prefix}/state.json"


def payloads(queue: Queue) -> list[bytes]:
    return sorted(job.payload for _, job in queue.jobs(QUEUE))


# --- one caller at a time -----------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["off", "auto"])
def test_blackholed_storage_fails_a_commit_on_time_with_a_storage_error(
    url: str, proxy: FaultProxy, mode: str
) -> None:
    """``off``: the caller's own engine commits. ``auto``: the caller is a follower whose
    broker (another queue of this process) commits for it. The deadline is shorter than one
    blackholed storage call: the old defaults (four attempts of 30 s each per call) overran it
    by two minutes."""
    deadline = 5.0
    with open_queue(url, mode, deadline) as first, open_queue(url, mode, deadline) as caller:
        first.enqueue(QUEUE, b"before")
        caller.enqueue(QUEUE, b"caller's")
        # Given storage that takes every request and never answers
        proxy.set_faults(Faults(blackhole=1.0))
        # When a caller enqueues
        _, error, seconds = timed(lambda: caller.enqueue(QUEUE, b"during"))
        # Then the call fails with a storage error naming the timeout, soon after the deadline
        assert isinstance(error, StorageError), repr(error)
        # (a follower sees its broker, which waits on storage, not answer in time)
        assert re.search("timeout|no answer within", str(error), re.IGNORECASE), str(error)
        assert seconds <= deadline + CALL_SLACK_SECONDS, seconds
        assert {fault for fault, _ in proxy.injected()} == {"blackhole"}
        # And once the network is back, the queue works again. Nothing phantom landed: a
        # direct writer gave up on the batch; a broker may yet commit a follower's session,
        # as its error says ("may or may not have been applied"), but once at most
        proxy.faults_off()
        caller.enqueue(QUEUE, b"after")
        found = payloads(caller)
        if mode == "auto" and b"during" in found:
            found.remove(b"during")
        assert found == [b"after", b"before", b"caller's"]


def test_a_write_sent_again_after_a_stall_is_not_reported_as_a_lost_race(
    url: str, proxy: FaultProxy
) -> None:
    """A state write held by the network is sent again by the SDK after its read timeout;
    meanwhile another writer has committed, so the second attempt gets 412. That 412 may be
    the first attempt's own write: the engine must look, not give up on a lost race (it did,
    after 30 s, with a QueueError)."""
    with open_queue(url, "off") as stalled, open_queue(url, "off") as other:
        other.declare(QUEUE)
        stalled.enqueue(QUEUE, b"first")  # its cached state is current: it writes blind next
        # Given the stalled writer's next request, its state write, held by the network
        proxy.set_faults(Faults(blackhole=1.0))
        thread, outcome = in_background(lambda: stalled.enqueue(QUEUE, b"stalled"))
        wait_for(
            lambda: ("blackhole", f"PUT {state_path(url)}") in proxy.injected(),
            10,
            "the stalled writer's state write to be held",
        )
        # When the network comes back and the other writer commits meanwhile
        proxy.faults_off()
        other.enqueue(QUEUE, b"other")
        thread.join(DEADLINE_SECONDS + CALL_SLACK_SECONDS)
        # Then the stalled enqueue succeeds within the deadline, and lands once
        [(_, error, seconds)] = outcome
        assert error is None, repr(error)
        assert seconds < DEADLINE_SECONDS, seconds
        assert payloads(other) == [b"first", b"other", b"stalled"]


def test_a_race_lost_by_a_write_answered_past_the_deadline_is_not_a_queue_error(
    seaweedfs_endpoint: str, bucket: str, url: str, proxy: FaultProxy
) -> None:
    deadline = 0.5
    with (
        open_queue(url, "off", deadline) as slow,
        open_queue(f"s3://{bucket}/objq?endpoint_url={seaweedfs_endpoint}", "off") as other,
    ):
        other.declare(QUEUE)
        slow.enqueue(QUEUE, b"first")  # its cached state is current: it writes blind next
        # Given a writer whose state write the network holds past its commit deadline (and
        # well within the SDK's read timeout: the write is sent once)
        proxy.pause()
        thread, outcome = in_background(lambda: slow.enqueue(QUEUE, b"slow"))
        wait_for(
            lambda: f"PUT {state_path(url)}" in proxy.paused(),
            10,
            "the slow writer's state write to be held",
        )
        # When another writer, on a good network, commits meanwhile, and then the held write
        # goes through after the deadline: it finds the state moved (412)
        other.enqueue(QUEUE, b"other")
        time.sleep(deadline)
        proxy.resume()
        thread.join(deadline + CALL_SLACK_SECONDS)
        # Then the slow enqueue lands once, or fails with a storage error (storage was slow);
        # a race lost after storage trouble is no refusal of the queue's
        [(_, error, seconds)] = outcome
        assert not isinstance(error, QueueError), repr(error)
        assert error is None or isinstance(error, StorageError), repr(error)
        assert seconds <= deadline + CALL_SLACK_SECONDS, seconds
        expected = [b"first", b"other"] + ([b"slow"] if error is None else [])
        assert payloads(other) == sorted(expected)


# --- producers and consumers through a faulty network -------------------------------------------


@dataclass
class Ledger:
    """What the workers saw; shared by their threads."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    produced: set[str] = field(default_factory=set)
    acked: Counter[str] = field(default_factory=Counter)  # successful acks, by job body
    #: Bodies whose ack failed and which a later ack then found settled: the failed ack landed
    #: (or the lease ran out and the job went to another consumer; ``acked`` tells).
    unsure: set[str] = field(default_factory=set)
    #: (what, error, seconds) of every call that failed.
    failures: list[tuple[str, Exception, float]] = field(default_factory=list)
    crashed: list[BaseException] = field(default_factory=list)

    def failed(self, what: str, error: Exception, seconds: float) -> None:
        with self.lock:
            self.failures.append((what, error, seconds))

    def settled(self) -> set[str]:
        with self.lock:
            return set(self.acked) | self.unsure


def produce(queue: Queue, name: str, stop: threading.Event, ledger: Ledger) -> None:
    """Enqueue unique bodies until told to stop. A failed enqueue is sent again with the same
    idempotency key until it succeeds, as a careful producer does."""
    count = 0
    while not stop.is_set():
        body = f"{name}-{count}"
        count += 1
        while True:
            _, error, seconds = timed(lambda: queue.enqueue(QUEUE, body.encode(), key=body))
            if error is None:
                break
            ledger.failed("enqueue", error, seconds)
        with ledger.lock:
            ledger.produced.add(body)


def consume(queue: Queue, stop: threading.Event, ledger: Ledger) -> None:
    while not stop.is_set():
        found, error, seconds = timed(lambda: queue.claim(QUEUE, 4, timeout=0.5))
        if error is not None:
            ledger.failed("claim", error, seconds)
        for delivery in found or []:
            ack(queue, delivery, ledger)


def ack(queue: Queue, delivery: Delivery, ledger: Ledger) -> None:
    """Ack until the outcome is known: success, or, after a failed ack, a job settled."""
    body = delivery.payload.decode()
    retried = False
    while True:
        _, error, seconds = timed(lambda: queue.ack(delivery))
        if error is None:
            with ledger.lock:
                ledger.acked[body] += 1
            return
        if retried and isinstance(error, LeaseLost | JobNotFound):
            with ledger.lock:
                ledger.unsure.add(body)
            return
        ledger.failed("ack", error, seconds)
        retried = True


def worker(ledger: Ledger, work: Callable[[], None]) -> threading.Thread:
    def run() -> None:
        try:
            work()
        except BaseException as exc:  # reported by the test, not lost in a thread
            ledger.crashed.append(exc)

    return threading.Thread(target=run)


@pytest.mark.parametrize("mode", ["off", "auto"])
def test_workload_under_faults_loses_nothing_acks_nothing_twice_and_drains(
    url: str, proxy: FaultProxy, mode: str
) -> None:
    ledger = Ledger()
    deadline = WORKLOAD_DEADLINE_SECONDS
    queues = [open_queue(url, mode, deadline) for _ in range(PRODUCERS + CONSUMERS)]

    def faults(on: bool) -> None:
        if on:  # every kind of fault first, whatever the draws then bring
            proxy.inject_next("unavailable", "reset", "drop_after", "blackhole")
            proxy.set_faults(WORKLOAD_FAULTS)
        else:
            proxy.faults_off()

    stats, archived = run_workload(queues, ledger, faults, deadline)
    injected = proxy.counts()
    assert all(injected[name] for name in ("unavailable", "reset", "drop_after", "blackhole"))
    check_workload(ledger, stats, archived, deadline)


@pytest.mark.parametrize("seed", [1, 2])
def test_writers_whose_writes_land_unseen_lose_nothing_and_refuse_nothing(seed: int) -> None:
    """Six writers of one namespace, in memory, whose writes often fail, half of those after
    landing: each must tell its own landed write from a lost race, however many commits the
    others made before it looked (a window of the last 64 commits was not enough)."""
    ledger = Ledger()
    shared = MemoryStore(f"unseen-{seed}")
    stores = [
        FaultyStore(shared, seed=seed * 10 + n, latency_seconds=(0.0, 0.002))
        for n in range(PRODUCERS + CONSUMERS)
    ]
    deadline = WORKLOAD_DEADLINE_SECONDS
    queues = [
        Queue(store=store, broker="off", commit_deadline_seconds=deadline) for store in stores
    ]

    def faults(on: bool) -> None:
        for store in stores:
            store.error_rate = store.landed_rate = 0.1 if on else 0.0

    stats, archived = run_workload(queues, ledger, faults, deadline)
    assert sum(store.counts.landed_then_failed for store in stores) > 0
    check_workload(ledger, stats, archived, deadline)


def run_workload(
    queues: list[Queue], ledger: Ledger, faults: Callable[[bool], None], deadline: float
) -> tuple[QueueStats, set[str]]:
    """Producers on the first ``PRODUCERS`` of ``queues`` and consumers on the others, with
    ``faults(True)`` for ``FAULT_SECONDS``, then ``faults(False)`` until every job produced is
    acked; the queue's stats then, and the bodies archived as done. Closes ``queues``."""
    stop_producing, stop_consuming = threading.Event(), threading.Event()
    producers = [
        worker(ledger, functools.partial(produce, q, f"p{i}", stop_producing, ledger))
        for i, q in enumerate(queues[:PRODUCERS])
    ]
    consumers = [
        worker(ledger, functools.partial(consume, q, stop_consuming, ledger))
        for q in queues[PRODUCERS:]
    ]

    def drained() -> bool:
        if ledger.crashed:
            raise AssertionError(f"a worker crashed: {ledger.crashed!r}")
        return ledger.produced <= ledger.settled()

    try:
        queues[0].declare(QUEUE, lease_seconds=LEASE_SECONDS, max_attempts=1000)
        # Given producers and consumers at work while storage misbehaves
        faults(True)
        for thread in producers + consumers:
            thread.start()
        time.sleep(FAULT_SECONDS)
        # When the faults stop, and then the producers (each finishes the enqueue it is on)
        faults(False)
        stop_producing.set()
        for thread in producers:
            thread.join(2 * (deadline + CALL_SLACK_SECONDS))
        # Then every job produced is acked, once the leases of lost claims run out at worst
        wait_for(
            drained,
            LEASE_SECONDS + deadline + CALL_SLACK_SECONDS,
            "every produced job to be acked",
            progress=lambda: (
                f"{len(ledger.produced - ledger.settled())} of {len(ledger.produced)} not acked"
            ),
        )
        stop_consuming.set()
        for thread in consumers:
            thread.join(deadline + CALL_SLACK_SECONDS)
        stats = queues[0].stats(QUEUE)
        archived = {
            record.job.payload.decode()
            for record in iter_archive(queues[0].store)
            if record.outcome == "done"
        }
    finally:
        stop_producing.set()
        stop_consuming.set()
        for queue in queues:
            queue.close()
    return stats, archived


def check_workload(ledger: Ledger, stats: QueueStats, archived: set[str], deadline: float) -> None:
    assert not ledger.crashed
    assert ledger.produced, "the workload produced nothing"
    # No job acked twice, and none lost: each was acked, or its failed ack landed
    twice = {body: n for body, n in ledger.acked.items() if n > 1}
    assert not twice, f"acked more than once: {twice}"
    assert set(ledger.acked) <= ledger.produced
    assert ledger.unsure - set(ledger.acked) <= archived
    assert (stats.ready, stats.delayed, stats.in_flight, stats.dead) == (0, 0, 0, 0)
    # Any call that failed raised a storage error, about when the deadline says
    wrong = [(what, repr(error)) for what, error, _ in ledger.failures
             if not isinstance(error, StorageError)]  # fmt: skip
    assert not wrong, wrong
    late = [(what, seconds) for what, _, seconds in ledger.failures
            if seconds > deadline + CALL_SLACK_SECONDS]  # fmt: skip
    assert not late, late
