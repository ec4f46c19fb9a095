"""Dramatiq's result and rate-limiter backends on objq's storage, on every storage backend,
with a real Dramatiq worker, and from several processes at once."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import dramatiq
import pytest
from dramatiq.middleware import GroupCallbacks
from dramatiq.rate_limits import Barrier, ConcurrentRateLimiter
from dramatiq.results import ResultFailure, ResultMissing, Results, ResultTimeout

from objq_broker.dramatiq import ObjqBroker, ObjqRateLimiterBackend, ObjqResultBackend
from objq_broker.errors import ConfigurationError, StateCorrupt
from objq_broker.results.store import ResultStore
from objq_broker.storage import ObjectStore
from objq_broker.storage.base import Blob
from tests.results import dramatiq_hammer
from tests.support.clock import ManualClock
from tests.support.processes import Children
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]


def a_message(actor_name: str = "add") -> dramatiq.Message[object]:
    return dramatiq.Message(
        queue_name="default", actor_name=actor_name, args=(), kwargs={}, options={}
    )


# --- configuration ---------------------------------------------------------------------------


@pytest.mark.parametrize("backend_class", [ObjqResultBackend, ObjqRateLimiterBackend])
def test_a_backend_needs_exactly_one_of_url_and_store(
    backend_class: type[ObjqResultBackend | ObjqRateLimiterBackend], tmp_path: Path
) -> None:
    url = tmp_path.as_uri()
    with pytest.raises(ConfigurationError, match="found neither"):
        backend_class()
    opened = ObjqResultBackend(url=url).records.store
    with pytest.raises(ConfigurationError, match="found both"):
        backend_class(url, store=opened)
    with pytest.raises(ConfigurationError, match=r"storage options go with url=.*'fsync'"):
        backend_class(store=opened, fsync=False)
    backend_class(url, fsync=False)  # storage options, with the URL they belong to


def test_ttls_must_be_positive_milliseconds(store: ObjectStore) -> None:
    results = ObjqResultBackend(store=store)
    with pytest.raises(ConfigurationError, match="expected a TTL in milliseconds above 0"):
        results.store_result(a_message(), 1, ttl=0)
    limits = ObjqRateLimiterBackend(store=store)
    with pytest.raises(ConfigurationError, match="found -5"):
        limits.add("k", 1, ttl=-5)
    assert store.list("") == [], "a refused call wrote something"


# --- results ---------------------------------------------------------------------------------


def test_results_are_read_back_until_their_ttl_passes(store_url: str, store: ObjectStore) -> None:
    # A worker's backend and a client's, each with its own store object on the same storage
    worker_side = ObjqResultBackend(url=store_url)
    client_side = ObjqResultBackend(store=store)
    clock = ManualClock(time.time())
    worker_side.records.clock = client_side.records.clock = clock
    short, kept, unknown = a_message(), a_message(), a_message()
    worker_side.store_result(short, {"sum": 42}, ttl=1000)
    worker_side.store_result(kept, [1, 2], ttl=600_000)

    assert client_side.get_result(short) == {"sum": 42}
    assert client_side.get_result(kept, block=True) == [1, 2]
    with pytest.raises(ResultMissing):
        client_side.get_result(unknown)
    # One object per result, under results/: nothing anywhere else
    assert len(store.list("")) == 2
    assert len(store.list("results/")) == 2

    clock.now += 1.001
    with pytest.raises(ResultMissing):
        client_side.get_result(short)
    assert client_side.get_result(kept) == [1, 2]
    assert client_side.records.purge() == 1  # the expired one
    assert len(store.list("results/")) == 1


def test_an_actors_exception_is_a_result_failure(store: ObjectStore) -> None:
    backend = ObjqResultBackend(store=store)
    message = a_message()
    backend.store_exception(message, ValueError("bad input"), ttl=60_000)
    with pytest.raises(ResultFailure, match="actor raised ValueError: bad input") as failure:
        backend.get_result(message, block=True, timeout=1000)
    assert (failure.value.orig_exc_type, failure.value.orig_exc_msg) == ("ValueError", "bad input")


def test_a_blocking_get_is_woken_by_a_local_store_at_once(store: ObjectStore) -> None:
    # A long poll interval: polling alone would read again only at 0.315, 0.635 and 1.275 s
    backend = ObjqResultBackend(store=store, poll_seconds=10.0)
    message = a_message()
    stored_at: list[float] = []

    def store_later() -> None:
        backend.store_result(message, "done", ttl=60_000)
        stored_at.append(time.monotonic())

    timer = threading.Timer(0.7, store_later)
    timer.start()
    try:
        assert backend.get_result(message, block=True, timeout=10_000) == "done"
        woke_at = time.monotonic()
    finally:
        timer.join()
    assert woke_at - stored_at[0] < 0.15, "the waiter slept on past a store by its own process"


def test_a_blocking_get_times_out_and_a_plain_get_misses(store: ObjectStore) -> None:
    backend = ObjqResultBackend(store=store)
    message = a_message()
    started = time.monotonic()
    with pytest.raises(ResultTimeout):
        backend.get_result(message, block=True, timeout=300)
    assert 0.25 <= time.monotonic() - started < 3
    with pytest.raises(ResultTimeout):  # a timeout of 0 still looks once
        backend.get_result(message, block=True, timeout=0)
    with pytest.raises(ResultMissing):
        backend.get_result(message)


_STORE_FROM_ANOTHER_PROCESS = """\
import sys, time
import dramatiq
from objq_broker.results.dramatiq import ObjqResultBackend
url, message_id = sys.argv[1], sys.argv[2]
message = dramatiq.Message(
    queue_name="default", actor_name="add", args=(), kwargs={}, options={},
    message_id=message_id,
)
time.sleep(0.5)
ObjqResultBackend(url=url).store_result(message, {"from": "another process"}, ttl=60_000)
"""


@pytest.mark.slow
def test_a_result_stored_by_another_process_is_found(tmp_path: Path, children: Children) -> None:
    url = (tmp_path / "store").as_uri()
    backend = ObjqResultBackend(url=url, poll_seconds=0.1)
    message = a_message()
    writer = children.adopt(
        subprocess.Popen(
            [sys.executable, "-c", _STORE_FROM_ANOTHER_PROCESS, url, message.message_id],
            cwd=ROOT,
        )
    )
    assert backend.get_result(message, block=True, timeout=30_000) == {"from": "another process"}
    assert writer.wait(timeout=60) == 0


def test_a_corrupt_result_object_is_reported(store: ObjectStore) -> None:
    backend = ObjqResultBackend(store=store)
    message = a_message()
    key = f"results/{backend.build_message_key(message)}"
    store.put(key, b"not a record")
    with pytest.raises(StateCorrupt, match=r"results/\w+: expected a result record"):
        backend.get_result(message)
    with pytest.raises(StateCorrupt):
        backend.get_result(message, block=True, timeout=100)
    assert store.get(key) == b"not a record"


# --- Dramatiq's worker, groups, pipelines, callbacks -----------------------------------------


@pytest.fixture
def file_broker(tmp_path: Path) -> Iterator[ObjqBroker]:
    """An ObjqBroker on a directory, with objq's result and rate-limiter backends on it too."""
    url = (tmp_path / "objq").as_uri()
    broker = ObjqBroker(url=url, lease_seconds=30)
    broker.add_middleware(Results(backend=ObjqResultBackend(url=url, poll_seconds=0.05)))
    broker.add_middleware(GroupCallbacks(ObjqRateLimiterBackend(url=url, poll_seconds=0.05)))
    dramatiq.set_broker(broker)  # message.get_result() looks the backend up there
    yield broker
    broker.close()


def test_a_dramatiq_worker_stores_results_for_groups_pipelines_and_callbacks(
    file_broker: ObjqBroker,
) -> None:
    runs: list[tuple[int, int]] = []
    completed: list[str] = []
    lock = threading.Lock()

    @dramatiq.actor(broker=file_broker, store_results=True)
    def add(x: int, y: int) -> int:
        with lock:
            runs.append((x, y))
        return x + y

    @dramatiq.actor(broker=file_broker, store_results=True, max_retries=0)
    def fail() -> None:
        raise KeyError("no such thing")

    @dramatiq.actor(broker=file_broker)
    def group_done(name: str) -> None:
        with lock:
            completed.append(name)

    worker = dramatiq.Worker(file_broker, worker_threads=4, worker_timeout=100)
    worker.start()
    try:
        assert add.send(1, 2).get_result(block=True, timeout=30_000) == 3
        with pytest.raises(ResultFailure, match="KeyError"):
            fail.send().get_result(block=True, timeout=30_000)

        jobs = dramatiq.group([add.message(n, n) for n in range(10)], broker=file_broker)
        jobs.add_completion_callback(group_done.message("squares"))
        jobs.run()
        jobs.wait(timeout=30_000)
        assert list(jobs.get_results(block=True, timeout=30_000)) == [2 * n for n in range(10)]

        chain = dramatiq.pipeline(
            [
                add.message(1, 2),
                add.message_with_options(args=(10,)),
                add.message_with_options(args=(100,)),
            ],
            broker=file_broker,
        ).run()
        assert chain.get_result(block=True, timeout=30_000) == 113

        # The callback runs once, when the last of the group's ten messages is done
        wait_for(lambda: completed, 30, "the group's completion callback")
        file_broker.join("default", timeout=30_000)
    finally:
        worker.stop()
    assert completed == ["squares"]
    # Every message ran once: 1 + 10 + 3 (a pipeline appends each result to the next's arguments)
    expected = [(1, 2), *((n, n) for n in range(10)), (1, 2), (10, 3), (100, 13)]
    assert sorted(runs) == sorted(expected)


def test_results_of_a_capped_grouped_queue_come_back_and_each_group_ran_in_order(
    file_broker: ObjqBroker,
) -> None:
    # Given a queue that runs one job of a tenant at a time, with an actor naming the tenant
    file_broker.client.declare("tenants", group_concurrency=1)
    running: dict[str, int] = {}
    started: list[tuple[str, int]] = []
    lock = threading.Lock()

    @dramatiq.actor(
        broker=file_broker,
        queue_name="tenants",
        store_results=True,
        group=lambda message: message.kwargs["tenant"],
    )
    def work(*, tenant: str, n: int) -> str:
        with lock:
            running[tenant] = running.get(tenant, 0) + 1
            started.append((tenant, n))
            overlapping = running[tenant] > 1
        time.sleep(0.01)
        with lock:
            running[tenant] -= 1
        assert not overlapping, f"two of {tenant}'s jobs ran at once"
        return f"{tenant}:{n}"

    # When three tenants' messages are sent and four worker threads run them
    sent = [work.send(tenant=f"t{n % 3}", n=n) for n in range(12)]
    worker = dramatiq.Worker(file_broker, worker_threads=4, worker_timeout=100)
    worker.start()
    try:
        results = [m.get_result(block=True, timeout=30_000) for m in sent]
    finally:
        worker.stop()
    # Then every result comes back, and each tenant's jobs started one after another, in order
    assert results == [f"t{n % 3}:{n}" for n in range(12)]
    for tenant in ("t0", "t1", "t2"):
        mine = [n for t, n in started if t == tenant]
        assert mine == sorted(mine) and len(mine) == 4, started


def test_results_never_enter_the_queue_state(file_broker: ObjqBroker) -> None:
    secrets: list[str] = []

    @dramatiq.actor(broker=file_broker, store_results=True)
    def make_secret() -> str:
        secrets.append(f"secret-{uuid.uuid4().hex}")  # made here: in no message's arguments
        return secrets[-1]

    worker = dramatiq.Worker(file_broker, worker_threads=1, worker_timeout=100)
    worker.start()
    try:
        result = make_secret.send().get_result(block=True, timeout=30_000)
    finally:
        worker.stop()
    assert result == secrets[0]
    secret = secrets[0].encode()
    store = file_broker.client.store
    # The result is in its own object under results/, and in no other object at all
    [result_key] = store.list("results/")
    stored = ResultStore(store).get(result_key.removeprefix("results/"))
    assert stored is not None and secret in stored
    others = [key for key in store.list("") if key != result_key and secret in store.get(key)]
    assert others == []
    assert "state.json" in store.list(""), "the queue's state was not where it was looked for"


# --- rate limits -----------------------------------------------------------------------------


def test_add_incr_and_decr_respect_their_bounds_under_concurrency(store: ObjectStore) -> None:
    backend = ObjqRateLimiterBackend(store=store)

    def in_parallel(call: Callable[[], bool], times: int) -> list[bool]:
        with ThreadPoolExecutor(8) as pool:
            return list(pool.map(lambda _: bool(call()), range(times)))

    # One add of many wins
    assert in_parallel(lambda: backend.add("slots", 1, ttl=60_000), 8).count(True) == 1
    # incr never passes its maximum, and loses no increment on the way there
    assert in_parallel(lambda: backend.incr("slots", 1, maximum=5, ttl=60_000), 24).count(True) == 4
    assert not backend.incr("slots", 1, maximum=5, ttl=60_000)
    assert backend.incr("slots", 0, maximum=5, ttl=60_000)  # the value is exactly 5
    # decr never passes its minimum
    assert in_parallel(lambda: backend.decr("slots", 1, minimum=0, ttl=60_000), 24).count(True) == 5
    assert not backend.decr("slots", 1, minimum=0, ttl=60_000)
    # Objects live under rate-limits/, one per limiter
    assert store.list("") == ["rate-limits/slots"]


def test_counters_expire_after_their_ttl_in_milliseconds(store: ObjectStore) -> None:
    backend = ObjqRateLimiterBackend(store=store)
    backend.records.clock = clock = ManualClock(time.time())
    assert backend.add("mutex", 1, ttl=300)
    clock.now += 0.299
    assert not backend.add("mutex", 1, ttl=300)
    clock.now += 0.002
    assert backend.add("mutex", 1, ttl=300), "an expired counter still blocked add"


def test_a_short_lived_counter_does_not_cut_a_long_one_short(store: ObjectStore) -> None:
    # Both keys belong to limiter "shared", so they share one object
    backend = ObjqRateLimiterBackend(store=store)
    backend.records.clock = clock = ManualClock(time.time())
    assert backend.add("shared", 1, ttl=600_000)
    assert backend.add("shared@1", 1, ttl=200)
    clock.now += 0.4
    assert not backend.add("shared", 1, ttl=600_000), "the long-lived counter was lost"
    assert backend.add("shared@1", 1, ttl=200), "the short-lived counter did not expire"


def test_a_concurrent_limiter_of_two_never_lets_three_in(store: ObjectStore) -> None:
    backend = ObjqRateLimiterBackend(store=store)
    limiter = ConcurrentRateLimiter(backend, "two-at-once", limit=2, ttl=60_000)
    inside, most_inside, got = 0, 0, 0
    lock = threading.Lock()

    def work(_: int) -> None:
        nonlocal inside, most_inside, got
        for _attempt in range(4):
            with limiter.acquire(raise_on_failure=False) as acquired:
                if not acquired:
                    continue
                with lock:
                    inside += 1
                    got += 1
                    most_inside = max(most_inside, inside)
                time.sleep(0.05)
                with lock:
                    inside -= 1

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(work, range(8)))
    assert 1 <= most_inside <= 2, most_inside
    assert got >= 2
    # Every slot was given back: both can be taken again
    assert backend.incr("two-at-once", 2, maximum=2, ttl=60_000)


def test_incr_and_sum_refuses_keys_of_another_limiter(store: ObjectStore) -> None:
    backend = ObjqRateLimiterBackend(store=store)
    with pytest.raises(ConfigurationError, match=r"expected keys of limiter 'a'.*\['b'\]"):
        backend.incr_and_sum("a@1", lambda: ["a@1", "b@1"], 1, maximum=10, ttl=60_000)
    assert store.list("") == [], "a refused incr_and_sum wrote something"


#: How far apart the waiter's reads must be before the last party arrives, right after one
#: of them, and how soon after the arrival the waiter must wake.
SLOW_READS_SECONDS, WOKEN_WITHIN_SECONDS = 2.0, 1.0


class _ReadTimes:
    """``store``, noting when one thread (the waiter's) reads from it."""

    def __init__(self, store: ObjectStore, thread: int) -> None:
        self._store, self._thread = store, thread
        self.times: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def read(self, key: str) -> Blob | None:
        blob = self._store.read(key)
        if threading.get_ident() == self._thread:
            self.times.append(time.monotonic())
        return blob


def test_a_barrier_wakes_its_waiter_when_the_last_party_arrives(store: ObjectStore) -> None:
    reads = _ReadTimes(store, threading.get_ident())
    backend = ObjqRateLimiterBackend(store=cast(ObjectStore, reads), poll_seconds=10.0)
    barrier = Barrier(backend, f"barrier-{uuid.uuid4().hex}", ttl=60_000)
    assert barrier.create(parties=2)
    assert not barrier.create(parties=5)
    arrived_at: list[float] = []

    def last_party() -> None:
        # Right after a read of the waiter's that came 2 s or more after the one before: its
        # pauses grow, so its next read is further off still, and only the notify in its
        # process can wake it within the bound below (which leaves room for the read a woken
        # waiter makes: a busy S3 server took 0.4 s for it).
        while len(reads.times) < 2 or reads.times[-1] - reads.times[-2] < SLOW_READS_SECONDS:
            time.sleep(0.005)
        assert barrier.wait(block=False)
        arrived_at.append(time.monotonic())

    party = threading.Thread(target=last_party, daemon=True)
    party.start()
    try:
        assert barrier.wait(timeout=60_000)
        woke_at = time.monotonic()
    finally:
        party.join(timeout=60)
    assert woke_at - arrived_at[0] < WOKEN_WITHIN_SECONDS, (
        "the waiter slept on past a notify in its process"
    )
    # No notify: a wait times out
    lonely = Barrier(backend, f"barrier-{uuid.uuid4().hex}", ttl=60_000)
    assert lonely.create(parties=2)
    assert not lonely.wait(timeout=200)


_LAST_PARTY = """\
import sys, time
from dramatiq.rate_limits import Barrier
from objq_broker.results.dramatiq import ObjqRateLimiterBackend
time.sleep(0.5)
assert Barrier(ObjqRateLimiterBackend(url=sys.argv[1]), sys.argv[2], ttl=60_000).wait(block=False)
"""


@pytest.mark.slow
def test_a_barrier_waiter_sees_the_last_party_of_another_process(
    tmp_path: Path, children: Children
) -> None:
    url = (tmp_path / "store").as_uri()
    barrier = Barrier(ObjqRateLimiterBackend(url=url, poll_seconds=0.1), "across", ttl=60_000)
    assert barrier.create(parties=2)
    last = children.adopt(
        subprocess.Popen([sys.executable, "-c", _LAST_PARTY, url, "across"], cwd=ROOT)
    )
    started = time.monotonic()
    assert barrier.wait(timeout=30_000)
    assert time.monotonic() - started < 10
    assert last.wait(timeout=60) == 0


def test_a_corrupt_counters_object_is_reported_and_never_overwritten(store: ObjectStore) -> None:
    backend = ObjqRateLimiterBackend(store=store)
    store.put("rate-limits/broken", b"not a record")
    with pytest.raises(StateCorrupt, match="rate-limits/broken: expected a result record"):
        backend.incr("broken", 1, maximum=5, ttl=60_000)
    assert store.get("rate-limits/broken") == b"not a record"
    # A record whose data are not counters (a result stored under the wrong prefix, say)
    ResultStore(store, "rate-limits/").set("result", b'{"sum": 42}', ttl=None)
    raw = store.get("rate-limits/result")
    with pytest.raises(StateCorrupt, match="rate-limits/result: expected rate-limit counters"):
        backend.add("result", 1, ttl=60_000)
    with pytest.raises(StateCorrupt):
        backend.wait("result", 100)
    assert store.get("rate-limits/result") == raw


# --- several processes at once ---------------------------------------------------------------

#: How long the processes hammer a limiter together (seconds).
HAMMER_SECONDS = 2.0


def _hammer_everywhere(
    url: str, kind: str, children: Children
) -> tuple[list[tuple[float, float]], tuple[float, float]]:
    """Hammer limiter ``kind`` from 3 threads here and 3 in each of 2 child processes, all at
    once; every slot got, as ``dramatiq_hammer`` reports them, and when the hammering began
    and ended (``time.time()``)."""
    command = [sys.executable, "-m", "tests.results.dramatiq_hammer", url, kind, "3"]
    started = [
        children.adopt(
            subprocess.Popen(
                command, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            )
        )
        for _ in range(2)
    ]
    for child in started:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    start = time.time() + 0.3
    stop = start + HAMMER_SECONDS
    with ThreadPoolExecutor(len(started)) as pool:
        replies = [pool.submit(child.communicate, f"{start} {stop}\n", 120) for child in started]
        got = dramatiq_hammer.hammer(url, kind, 3, start, stop)
        outputs = [reply.result()[0] for reply in replies]
    for child, output in zip(started, outputs, strict=True):
        assert child.returncode == 0, output
        got += [(begin, end) for begin, end in json.loads(output)]
    return got, (start, stop)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["window", "bucket", "sum"])
def test_a_limit_holds_across_threads_and_processes(
    kind: str, tmp_path: Path, children: Children
) -> None:
    # Each limiter's period is an hour, so all slots of the run count against one limit
    # (a bucket's hour may turn while the processes hammer: then two buckets are allowed their
    # limit each; the hours counted are the hammering's, not the test's, which starts earlier)
    url = (tmp_path / "store").as_uri()
    got, (start, stop) = _hammer_everywhere(url, kind, children)
    hours = int(stop // 3600) - int(start // 3600) + 1
    allowed = dramatiq_hammer.LIMIT * (hours if kind == "bucket" else 1)
    # Never more than the limit, and no slot lost on the way (many more tries than slots)
    assert len(got) == allowed, f"{len(got)} slots got, the limit is {allowed}"


@pytest.mark.slow
def test_a_concurrent_limit_holds_across_threads_and_processes(
    tmp_path: Path, children: Children
) -> None:
    url = (tmp_path / "store").as_uri()
    held, _ = _hammer_everywhere(url, "concurrent", children)
    assert len(held) >= 10, "too few slots got to show anything"
    # Sweep over the moments slots were taken and given back: never more than 2 held at once
    events = sorted([(begin, 1) for begin, _ in held] + [(end, -1) for _, end in held])
    at_once = most = 0
    for _, change in events:
        at_once += change
        most = max(most, at_once)
    assert most <= dramatiq_hammer.CONCURRENT_LIMIT, f"{most} slots held at once"
    backend = ObjqRateLimiterBackend(url=url)
    assert backend.incr("concurrent", 2, maximum=2, ttl=60_000), "a slot was never given back"
