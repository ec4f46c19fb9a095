"""Garbage collection on every storage backend: unreferenced bodies objects, runs and staged
objects older than the margin go; what the state refers to, young objects and open Spark
writes stay; a dry run deletes nothing; and the queue still has every job afterwards."""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import pytest

from objq_broker import Queue
from objq_broker.builders import Delivery
from objq_broker.engine import Engine
from objq_broker.engine.garbage import (
    OPEN_WRITE_SECONDS,
    SWEEP_MARKER_KEY,
    Sweeper,
    collect_garbage,
    find_garbage,
)
from objq_broker.engine.janitor import Janitor
from objq_broker.engine.snapshot import Snapshot
from objq_broker.errors import ConfigurationError
from objq_broker.model.bodies import encode_bodies
from objq_broker.model.values import StagedBodies
from objq_broker.storage import MemoryStore, ObjectStore

#: Margin the tests collect with; ages are made by choosing ``now``, never by waiting an hour.
MARGIN = 3600.0
#: Past this many ready jobs (or dead letters) a queue spills into runs: small, to make some.
SPILL_AT = 2
BIG = 400  # bytes: payloads over 256 leave the state for bodies objects


def payload(n: int) -> bytes:
    return f"job {n:03d} ".encode() + b"x" * BIG


@dataclass
class Namespace:
    """A live namespace and what it must still hold after a collection."""

    queue: Queue
    held: list[Delivery]  # claimed and not yet acked: their leases and bodies must survive
    waiting: set[bytes]  # payloads ready or dead-lettered


def live_namespace(store: ObjectStore) -> Namespace:
    """Ready jobs in runs, dead letters in dead runs, jobs in flight, a staged (Spark-like)
    write committed: every kind of object a state refers to."""
    queue = Queue(store=store, broker="off", spill_at=SPILL_AT, gc_interval_seconds=None)
    queue.declare("q", max_attempts=1)
    for n in range(12):
        queue.enqueue("q", payload(n))
    dead = queue.claim("q", 4)
    for delivery in dead:
        assert queue.nack(delivery, error="boom", retry=False) == "dead"
    held = queue.claim("q", 2)
    # A Spark write: its committed object, and a losing attempt's, under one closed write
    store.put("staging/w1/0-0-aaa-0.json", encode_bodies([("staged a" + "y" * BIG, False)]))
    assert queue.enqueue_staged("q", [StagedBodies("staging/w1/0-0-aaa-0.json", 1)], write_id="w1")
    queue.flush()
    waiting = {payload(n) for n in range(12)} - {d.payload for d in held}
    waiting.add(b"staged a" + b"y" * BIG)
    snap = Snapshot.read(store)
    assert snap.referenced_runs and snap.referenced_bodies, "expected runs and bodies in use"
    assert any(key.startswith("staging/") for key in snap.referenced_bodies)
    return Namespace(queue, held, waiting)


def orphans(store: ObjectStore, tag: str) -> dict[str, str]:
    """Write objects no state refers to, of every kind; key -> kind ("" for one that is
    never garbage: an open Spark write's)."""
    version = Snapshot.read(store).version
    made = {
        f"bodies/{uuid.uuid4().hex}.json": "bodies",
        f"runs/{version:010d}-{uuid.uuid4().hex}-0.json": "runs",
        f"staging/w1/1-1-{tag}-0.json": "staging",  # a losing attempt of the closed write
        f"staging/{tag}-aborted/0-0-ccc-0.json": "staging",
        f"staging/{tag}-aborted/_closed": "staging",
        f"staging/{tag}-open/0-0-ddd-0.json": "",  # its driver may still commit it
    }
    for key in made:
        store.put(key, b"[]")
    store.put("staging/w1/_closed", b"closed\n")
    return made


def latest_write(store: ObjectStore) -> float:
    return max(meta.modified for meta in store.list_meta())


def wait_past(instant: float, seconds: float) -> None:
    """Sleep until the clock is ``seconds`` past ``instant`` (S3 keeps whole seconds)."""
    time.sleep(max(instant + seconds - time.time(), 0.0))


def drain(store: ObjectStore, namespace: Namespace) -> None:
    """Every job comes back: the held ones ack, dead letters retry, all payloads are read."""
    for delivery in namespace.held:
        namespace.queue.ack(delivery)
    namespace.queue.close()
    with Queue(store=store, broker="off", gc_interval_seconds=None) as fresh:
        fresh.retry_dead("q")
        fresh.enqueue("q", payload(999))
        got: list[bytes] = []
        while deliveries := fresh.claim("q", 50):
            got += [d.payload for d in deliveries]
            for delivery in deliveries:
                fresh.ack(delivery)
        assert sorted(got) == sorted(namespace.waiting | {payload(999)})
        assert fresh.stats("q").ready == fresh.stats("q").dead == 0


def test_old_orphans_go_referenced_and_young_objects_stay(store: ObjectStore) -> None:
    # Given a live namespace and orphans of every kind, all written a while ago
    namespace = live_namespace(store)
    old = orphans(store, "old")
    boundary = latest_write(store)
    archive = store.list("archive/")
    # And young orphans written after that
    wait_past(boundary, 2.2)
    young = orphans(store, "young")
    now = boundary + MARGIN + 0.5  # the first lot is past the margin, the young one is not
    before = set(store.list())

    # When a dry run looks
    dry = collect_garbage(store, older_than=MARGIN, dry_run=True, now=now)
    # Then it names exactly the old orphans and deletes nothing
    expected = {key for key, kind in old.items() if kind}
    assert set(dry.keys) == expected
    assert {k: t.objects for k, t in dry.garbage.items()} == {"bodies": 1, "runs": 1, "staging": 3}
    assert dry.garbage["bodies"].bytes == 2 and dry.as_dict()["deleted"] == 0
    assert dry.kept["bodies"].objects == 1 and dry.kept["runs"].objects == 1
    assert set(store.list()) == before

    # When it collects
    done = collect_garbage(store, older_than=MARGIN, now=now)
    # Then the old orphans are gone and nothing else
    assert set(done.keys) == expected and done.failed == 0 and done.as_dict()["deleted"] == 5
    assert set(store.list()) == before - expected
    for key in young:
        assert store.read(key) is not None, key
    assert store.list("archive/") == archive
    assert store.read("staging/w1/_closed") is not None  # its write still has a job in use
    # And the queue has every job, in flight, ready or dead
    drain(store, namespace)


def test_referenced_objects_survive_any_age_and_open_writes_a_week(store: ObjectStore) -> None:
    namespace = live_namespace(store)
    made = orphans(store, "old")
    far = time.time() + 10 * OPEN_WRITE_SECONDS
    # However old, what the state refers to is never garbage; an open write is, past a week
    found = find_garbage(store, older_than=MARGIN, now=far)
    referenced = Snapshot.read(store).referenced_bodies | Snapshot.read(store).referenced_runs
    assert not referenced & set(found.keys)
    assert set(found.keys) == set(made)
    within_week = find_garbage(store, older_than=MARGIN, now=time.time() + OPEN_WRITE_SECONDS / 2)
    assert "staging/old-open/0-0-ddd-0.json" not in within_week.keys
    collect_garbage(store, older_than=MARGIN, now=far)
    drain(store, namespace)


def test_a_store_without_state_is_left_alone() -> None:
    store = MemoryStore(f"gc-empty-{uuid.uuid4().hex}")
    store.put("bodies/abc.json", b"[]")
    found = collect_garbage(store, older_than=0, now=time.time() + MARGIN)
    assert not found.state_found and found.keys == []
    assert store.list() == ["bodies/abc.json"]


def test_the_background_sweep_collects_while_the_queue_works(store: ObjectStore) -> None:
    # Given an orphan older than the (short) margin of a process that sweeps often
    queue = Queue(store=store, broker="off", gc_interval_seconds=0.2, gc_older_than_seconds=3.0)
    queue.declare("q")
    queue.enqueue("q", payload(0))
    orphan = f"bodies/{uuid.uuid4().hex}.json"
    store.put(orphan, b"[]")
    wait_past(latest_write(store), 4.2)
    # When the queue keeps committing (with bodies objects of its own in flight)
    assert isinstance(queue.committer, Engine) and queue.committer.sweeper is not None
    sweeper = queue.committer.sweeper
    deadline = time.monotonic() + 30
    n = 1
    while (sweeper.sweeps == 0 or store.read(orphan) is not None) and time.monotonic() < deadline:
        queue.enqueue("q", payload(n))
        n += 1
        time.sleep(0.05)
    queue.flush()
    # Then the orphan went, and every job is still there
    assert store.read(orphan) is None and sweeper.sweeps >= 1
    assert store.read(SWEEP_MARKER_KEY) is not None
    got = []
    while deliveries := queue.claim("q", 100):
        got += [d.payload for d in deliveries]
        for delivery in deliveries:
            queue.ack(delivery)
    assert sorted(got) == sorted(payload(i) for i in range(n))
    queue.close()


def test_processes_take_turns_by_the_marker() -> None:
    # Given four processes' sweepers on one namespace, looking far more often than allowed
    store = MemoryStore(f"gc-turns-{uuid.uuid4().hex}")
    with Queue(store=store, broker="off", gc_interval_seconds=None) as queue:
        queue.declare("q")
    interval, seconds = 0.5, 2.0
    janitors = [Janitor(store) for _ in range(4)]
    sweepers = [Sweeper(store, j, interval=interval) for j in janitors]
    # When each is told after every "commit" for two seconds
    stop = time.monotonic() + seconds
    started = time.monotonic()

    def commits(sweeper: Sweeper) -> None:
        while time.monotonic() < stop:
            sweeper._next = 0.0  # due at every commit: only the marker holds them back
            sweeper.after_commit()
            time.sleep(0.01)

    threads = [threading.Thread(target=commits, args=(s,)) for s in sweepers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for janitor in janitors:
        janitor.close()
    # Then the namespace was swept at most once per interval, by one process at a time
    elapsed = time.monotonic() - started
    total = sum(s.sweeps for s in sweepers)
    assert 1 <= total <= elapsed / interval + 1, total


@pytest.mark.parametrize(
    ("option", "value"), [("gc_interval_seconds", 0), ("gc_older_than_seconds", -1)]
)
def test_bad_settings_are_refused(option: str, value: float) -> None:
    options: dict[str, Any] = {option: value}
    with pytest.raises(ConfigurationError, match=option):
        Queue(store=MemoryStore(), broker="off", **options)
