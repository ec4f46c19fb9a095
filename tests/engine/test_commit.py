"""The group-commit engine: batching, conflicts, storage faults, corrupt state, archive."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from concurrent.futures import InvalidStateError
from pathlib import Path

import pytest

from objq_broker import Queue, builders
from objq_broker.engine import STATE_KEY, Engine
from objq_broker.engine.archive import iter_archive
from objq_broker.engine.batch import Waiter
from objq_broker.errors import (
    LeaseLost,
    QueueNotFound,
    StateCorrupt,
    StorageError,
    StorageUnavailable,
)
from objq_broker.model.encoding import decode_state
from objq_broker.model.ops import Declare
from objq_broker.storage import MemoryStore, open_store
from objq_broker.storage.faulty import FaultyStore


def test_concurrent_enqueues_share_commits() -> None:
    # Writes that take a millisecond, as any real store's do: the producers that come while
    # one is on its way join the next commit. (In memory, a commit a caller makes in its own
    # thread may end before any other thread runs, and every one would go alone.)
    store = FaultyStore(
        MemoryStore("batching"), latency_seconds=(0.001, 0.001), ops=frozenset({"write"})
    )
    with Queue(store=store) as queue:
        queue.declare("q")
        barrier = threading.Barrier(20)

        def produce() -> None:
            barrier.wait()
            for _ in range(50):
                queue.enqueue("q", b"x")

        threads = [threading.Thread(target=produce) for _ in range(20)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert queue.stats("q").ready == 1000
        metrics = queue.metrics()
        # Given 20 producers, When they enqueue at once, Then commits carry several ops each.
        assert metrics.state_writes < 1000
        assert metrics.max_batch_ops > 1


def test_a_batch_that_changes_nothing_writes_nothing() -> None:
    store = MemoryStore("noop")
    with Queue(store=store) as queue:
        queue.declare("q")
        writes = queue.metrics().state_writes
        for _ in range(20):
            assert queue.claim("q", 5) == []
            queue.stats("q")
        assert queue.metrics().state_writes == writes


def test_one_refused_op_fails_alone() -> None:
    with Queue(store=MemoryStore("alone")) as queue:
        queue.enqueue("q", b"a")
        [delivery] = queue.claim("q")
        queue.ack(delivery)
        stale = queue.submit(builders.ack(delivery))
        fresh = queue.submit(builders.enqueue("q", [b"b"]))
        with pytest.raises(LeaseLost):
            stale.result()
        assert len(fresh.result()) == 1
        with pytest.raises(QueueNotFound):
            queue.stats("nope")


def test_two_writers_conflict_and_lose_nothing(tmp_path: Path) -> None:
    url = tmp_path.as_uri()
    # Two direct writers (no broker): their compare-and-set conflicts are what is tested.
    first, second = Queue(url, broker="off"), Queue(url, broker="off")
    try:

        def produce(queue: Queue, tag: str) -> None:
            for n in range(100):
                queue.enqueue("q", f"{tag}{n}".encode())

        threads = [
            threading.Thread(target=produce, args=(first, "a")),
            threading.Thread(target=produce, args=(second, "b")),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        payloads = sorted(j.payload for _, j in first.jobs("q"))
        expected = sorted(
            [f"a{n}".encode() for n in range(100)] + [f"b{n}".encode() for n in range(100)]
        )
        assert payloads == expected
        assert first.metrics().conflicts + second.metrics().conflicts > 0
    finally:
        first.close()
        second.close()


def test_landed_but_failed_write_does_not_duplicate_an_enqueue() -> None:
    faulty = FaultyStore(MemoryStore("landed"), seed=1)
    with Queue(store=faulty) as queue:
        queue.declare("q")
        faulty.fail_next(1, landed=True)
        job = queue.enqueue("q", b"once")
        assert faulty.counts.landed_then_failed == 1
        jobs = queue.jobs("q")
        assert [j.id for _, j in jobs] == [job.id]


def test_landed_but_failed_write_does_not_lose_an_ack() -> None:
    faulty = FaultyStore(MemoryStore("landed-ack"), seed=2)
    with Queue(store=faulty) as queue:
        queue.enqueue("q", b"work")
        [delivery] = queue.claim("q")
        faulty.fail_next(1, landed=True)
        queue.ack(delivery)
        assert queue.stats("q").in_flight == 0
        assert queue.jobs("q") == []


def test_landed_write_reported_as_a_conflict_is_recognised() -> None:
    # Given an SDK that retried a conditional PUT which had landed (its retry gets 412)
    faulty = FaultyStore(MemoryStore("landed-412"), seed=5)
    with Queue(store=faulty) as queue:
        queue.declare("q")
        faulty.fail_next(1, landed=True, conflict=True)
        job = queue.enqueue("q", b"once")
        # Then the enqueue succeeds once, and is not applied a second time
        assert [j.id for _, j in queue.jobs("q")] == [job.id]
        [delivery] = queue.claim("q")
        faulty.fail_next(1, landed=True, conflict=True)
        queue.ack(delivery)
        assert queue.jobs("q") == []


def test_failed_write_that_did_not_land_is_retried() -> None:
    faulty = FaultyStore(MemoryStore("not-landed"), seed=3)
    with Queue(store=faulty) as queue:
        queue.declare("q")
        faulty.fail_next(3, landed=False)
        queue.enqueue("q", b"x")
        assert queue.stats("q").ready == 1
        assert faulty.counts.errors == 3


def test_storage_down_past_the_deadline_fails_the_ops_and_reports_no_success() -> None:
    faulty = FaultyStore(MemoryStore("down"), seed=4, error_rate=1.0)
    queue = Queue(store=faulty, commit_deadline_seconds=0.3)
    with pytest.raises(StorageError, match="gave up after"):
        queue.enqueue("q", b"x")
    queue.close()
    assert faulty.inner.read(STATE_KEY) is None


@pytest.mark.parametrize(
    "garbage", [b"not json at all", b'{"format": 99, "jobs": []}', b'{"format": 1, "jobs": 7}']
)
def test_corrupt_state_fails_every_op_and_is_never_overwritten(
    tmp_path: Path, garbage: bytes
) -> None:
    store = open_store(tmp_path.as_uri())
    store.put(STATE_KEY, garbage)
    with Queue(store=store) as queue:
        for call in (
            lambda: queue.enqueue("q", b"x"),
            lambda: queue.claim("q"),
            lambda: queue.stats("q"),
            lambda: queue.declare("q"),
        ):
            with pytest.raises(StateCorrupt, match=r"state\.json") as info:
                call()
            assert "will not be overwritten" in str(info.value)
    assert (tmp_path / STATE_KEY).read_bytes() == garbage


def test_finished_jobs_are_archived_before_leaving_the_state() -> None:
    store = MemoryStore("archive")
    with Queue(store=store) as queue:
        queue.enqueue("q", b"ok")
        queue.enqueue("q", b"bad", max_attempts=1)
        first, second = queue.claim("q", 2)
        queue.ack(first)
        queue.nack(second, error="boom")
    records = list(iter_archive(store))
    assert sorted((r.outcome, r.job.payload) for r in records) == [
        ("dead", b"bad"),
        ("done", b"ok"),
    ]
    assert all(r.job.finished_at is not None for r in records)
    state = decode_state(store.get(STATE_KEY), "state")
    assert [job.payload for job in state.dead] == [b"bad"]
    assert state.jobs == []


class LandsWhileOthersCommit(MemoryStore):
    """A store whose next state write, once armed, lands; then ``meanwhile`` runs (other
    writers commit); then the writer is told the write timed out."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.meanwhile: Callable[[], None] | None = None
        self.unseen = 0  # writes that landed and were reported failed

    def write(
        self, key: str, data: bytes, *, if_version: str | None = None, if_absent: bool = False
    ) -> str:
        version = super().write(key, data, if_version=if_version, if_absent=if_absent)
        if key == STATE_KEY and self.meanwhile is not None:
            meanwhile, self.meanwhile = self.meanwhile, None
            meanwhile()
            self.unseen += 1
            raise StorageUnavailable(f"{self.url}: write {key!r} timed out (it landed)")
        return version


#: Commits another writer makes while a write that landed is reported failed.
OTHERS_COMMITS = 100


@pytest.mark.parametrize("what", ["enqueue", "claim", "ack"])
def test_a_landed_write_is_recognised_however_many_commits_others_made_since(
    what: str,
) -> None:
    # A writer whose write timed out may look for its commit only after many others were made
    # (a window of the last 64 commits of all, as the state kept, was outrun)
    store = LandsWhileOthersCommit(f"landed-{what}")
    with Queue(store=store, broker="off") as queue, Queue(store=store, broker="off") as other:
        queue.enqueue("q", b"first")
        [delivery] = queue.claim("q") if what == "ack" else [None]

        def others_commit() -> None:
            for n in range(OTHERS_COMMITS):
                other.enqueue("q", f"other{n}".encode())

        # Given a write of ``queue``'s that lands while another writer commits past the window
        store.meanwhile = others_commit
        # When the writer retries after its write timed out
        if what == "enqueue":
            job = queue.enqueue("q", b"once")
            # Then the enqueue succeeds, applied once
            assert [j.id for _, j in queue.jobs("q") if j.payload == b"once"] == [job.id]
        elif what == "claim":
            [claimed] = queue.claim("q")
            # Then the claim returns the job its landed write leased, and leases nothing else
            assert claimed.payload == b"first"
            assert queue.stats("q").in_flight == 1
            queue.ack(claimed)
        else:
            assert delivery is not None
            queue.ack(delivery)  # Then the ack succeeds: its own landed write is no lost lease
            assert queue.stats("q").in_flight == 0
        assert store.unseen == 1
        # (and after an enqueue, "first" and "once" are ready too)
        assert queue.stats("q").ready == OTHERS_COMMITS + (2 if what == "enqueue" else 0)


def test_archive_can_be_turned_off() -> None:
    store = MemoryStore("no-archive")
    with Queue(store=store, archive=False) as queue:
        queue.enqueue("q", b"ok")
        [delivery] = queue.claim("q")
        queue.ack(delivery)
    assert store.list("archive/") == []


def test_state_version_is_monotonic_and_a_lone_writer_keeps_one_mark() -> None:
    store = MemoryStore("versions")
    with Queue(store=store) as queue:
        seen = []
        for n in range(70):
            queue.enqueue("q", str(n).encode())
            seen.append(decode_state(store.get(STATE_KEY), "state").version)
    assert seen == sorted(set(seen))
    assert len(decode_state(store.get(STATE_KEY), "state").writers) == 1


def test_a_state_that_kept_recent_commits_is_read_and_written_without_them() -> None:
    # Given a state as written before writers kept marks: the last commits of all instead
    store = MemoryStore("recent-commits")
    with Queue(store=store) as queue:
        queue.enqueue("q", b"before")
    stored = json.loads(store.get(STATE_KEY))
    stored["recent_commits"] = [f"{n:032x}" for n in range(64)]
    store.write(STATE_KEY, json.dumps(stored).encode())
    # When a writer commits on it
    with Queue(store=store) as queue:
        queue.enqueue("q", b"after")
        assert sorted(j.payload for _, j in queue.jobs("q")) == [b"after", b"before"]
    # Then the old field is dropped, and each writer's mark kept
    stored = json.loads(store.get(STATE_KEY))
    assert "recent_commits" not in stored
    assert len(stored["writers"]) == 2


def test_stale_leases_expire_on_the_idle_timer() -> None:
    with Queue(store=MemoryStore("idle"), idle_tick_seconds=0.05) as queue:
        queue.enqueue("q", b"x")
        [delivery] = queue.claim("q", lease=0.1)
        queue.core.wait_until(lambda: queue.stats("q").ready == 1, timeout=5)
        assert queue.stats("q").ready == 1
        with pytest.raises(LeaseLost):
            queue.ack(delivery)


def test_writer_with_an_older_epoch_is_fenced() -> None:
    store = MemoryStore("fencing")
    new = Engine(store, epoch=2)
    new.call(Declare("q"))
    new.close()
    with Queue(store=store, epoch=1) as old:
        from objq_broker.errors import WriterFenced

        with pytest.raises(WriterFenced, match="epoch 2"):
            old.enqueue("q", b"x")
        with pytest.raises(WriterFenced):
            old.enqueue("q", b"y")


def test_a_waiter_hands_its_caller_the_outcome_once() -> None:
    done: Waiter[int] = Waiter()
    threading.Thread(target=done.set_result, args=(7,)).start()
    assert done.result() == 7 and done.result() == 7
    with pytest.raises(InvalidStateError):
        done.set_result(8)
    failed: Waiter[int] = Waiter()
    failed.set_exception(KeyError("gone"))
    with pytest.raises(KeyError, match="gone"):
        failed.result()
