"""The engine with runs (the segmented state, ``docs/runs.md``), with a small bound:
ready jobs past the bound leave the head for runs written before it, claims take from runs in
priority and FIFO order, consumed runs are deleted, another process reads the runs it needs,
listing reads them, and a run missing from storage is reported, never written over."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from objq_broker import Queue, builders
from objq_broker.broker.elected import ElectedCommitter
from objq_broker.engine import Engine
from objq_broker.engine.archive import iter_archive
from objq_broker.engine.guard import STATE_KEY
from objq_broker.engine.loading import RUN_CACHE_SIZE
from objq_broker.engine.runs import MERGE_AT
from objq_broker.engine.snapshot import Snapshot
from objq_broker.errors import ConfigurationError
from objq_broker.model.encoding import decode_state
from objq_broker.model.ops import DeadLetters, Expire, FindJob
from objq_broker.model.records import TAIL_FORMAT_VERSION, Job, RunRef, StateDoc
from objq_broker.storage import MemoryStore, ObjectStore, open_store
from objq_broker.storage.faulty import FaultyStore
from tests.support.clock import ManualClock
from tests.support.releases import ENQUEUE_ONE, check_out, run_under

JOBS = 23
BOUND = 5
#: Jobs per run: small, so a test makes several (a spill of BOUND + 1 never fits a tail).
RUN_JOBS = 2 * BOUND


def enqueue_one_by_one(engine: Engine) -> list[tuple[int, str]]:
    """Enqueue ``JOBS`` single jobs of three priorities; their ids in claim order."""
    engine.submit(builders.declare("q", {})).result()
    made = []
    for n in range(JOBS):
        (job,) = engine.submit(
            builders.enqueue("q", [f"job {n}".encode()], priority=n % 3)
        ).result()
        made.append((job.priority, job.seq, job.id))
    return [(p, i) for p, _, i in sorted(made)]


def head(store: ObjectStore) -> tuple[int, int, int]:
    """(format, jobs in the head, runs referred to) of the stored state."""
    blob = store.read(STATE_KEY)
    assert blob is not None
    doc = decode_state(blob.data, "test")
    return doc.format, len(doc.jobs), sum(len(refs) for refs in doc.runs.values())


def test_runs_keep_claim_order_and_are_deleted_once_consumed(store: ObjectStore) -> None:
    engine = Engine(store, spill_at=BOUND, run_jobs=RUN_JOBS)
    try:
        order = enqueue_one_by_one(engine)
        fmt, inline, runs = head(store)
        assert fmt == 2 and runs >= JOBS // (BOUND + 1) and inline <= BOUND
        assert sorted(store.list("runs/")) and len(store.list("runs/")) == runs
        assert engine.submit(builders.stats(["q"])).result()[0].ready == JOBS

        claimed: list[Job] = []
        while len(claimed) < JOBS:
            jobs = engine.submit(builders.claim(["q"], 4, owner="test")).result()
            assert jobs, "claims stopped before the backlog was empty"
            claimed += jobs
        assert [(j.priority, j.id) for j in claimed] == order
        for delivery in builders.deliveries(claimed):
            engine.submit(builders.ack(delivery))
        engine.flush()
    finally:
        engine.close()
    # No run is left: the state holds only the acks' archive records (format 3, not 2)
    assert head(store) == (TAIL_FORMAT_VERSION, 0, 0)
    assert store.list("runs/") == [], "a consumed run was left behind"


def test_another_process_reads_the_runs_it_claims_from(tmp_path: Path) -> None:
    url = tmp_path.as_uri()
    writer, reader = (
        Engine(open_store(url), spill_at=BOUND, run_jobs=RUN_JOBS),
        Engine(open_store(url)),
    )
    try:
        order = enqueue_one_by_one(writer)
        # Listing (objq jobs, the Spark jobs table) reads the runs too, before any is taken.
        snapshot = Snapshot.read(open_store(url))
        assert snapshot.stats("q").ready == JOBS
        listed = snapshot.jobs("q")
        assert [(state, job.id) for state, job in listed] == [("ready", i) for _, i in order]
        assert sorted(job.id for _, job in snapshot.all_live()) == sorted(i for _, i in order)
        jobs = reader.submit(builders.claim(["q"], JOBS, owner="other")).result()
        assert [(j.priority, j.id) for j in jobs] == order
        # The writer's cached head is stale: its next claim conflicts, re-reads, finds nothing.
        assert writer.submit(builders.claim(["q"], 1, owner="test")).result() == []
    finally:
        writer.close()
        reader.close()


def test_a_run_missing_from_storage_is_dropped_with_a_record_and_the_rest_delivered(
    tmp_path: Path,
) -> None:
    store = open_store(tmp_path.as_uri())
    engine = Engine(store, spill_at=BOUND, run_jobs=RUN_JOBS)
    enqueue_one_by_one(engine)
    engine.close()
    lost = store.list("runs/")[0]
    state = store.read(STATE_KEY)
    assert state is not None
    held = next(
        ref.count - ref.taken
        for refs in decode_state(state.data, "test").runs.values()
        for ref in refs
        if ref.key == lost
    )
    store.delete(lost)
    fresh = Engine(store, commit_deadline_seconds=5)
    try:
        # The claim confirms the run is gone from a fresh read, then delivers the rest
        jobs = fresh.submit(builders.claim(["q"], JOBS, owner="test")).result()
        assert len(jobs) == JOBS - held
        assert fresh.submit(builders.stats(["q"])).result()[0].ready == 0
    finally:
        fresh.close()
    after = store.read(STATE_KEY)
    assert after is not None
    assert lost not in decode_state(after.data, "test").run_keys()
    records = [r for r in iter_archive(store) if r.job.id == lost]
    assert [r.outcome for r in records] == ["dead"]
    assert f"of {held} jobs lost" in (records[0].job.error or "")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_spilling_under_faults_loses_nothing_and_runs_nothing_twice(seed: int) -> None:
    """Errors before and after writes land (10% each), so runs, bodies and the head are
    written, retried and sometimes orphaned: every acknowledged job is done exactly once."""
    store = FaultyStore(MemoryStore(), seed=seed, error_rate=0.1, landed_rate=0.1)
    engine = Engine(store, spill_at=3, seed=seed)
    try:
        engine.submit(builders.declare("q", {})).result()
        acknowledged = set()
        for n in range(60):
            (job,) = engine.submit(
                builders.enqueue("q", [f"job {n}".encode()], priority=n % 2)
            ).result()
            acknowledged.add(job.id)
        done: list[str] = []
        while True:
            jobs = engine.submit(builders.claim(["q"], 7, owner="test")).result()
            if not jobs:
                break
            for delivery in builders.deliveries(jobs):
                engine.submit(builders.ack(delivery)).result()
                done.append(delivery.job.id)
        assert store.counts.landed_then_failed > 0 and store.counts.errors > 0, "no faults injected"
    finally:
        engine.close()
    assert sorted(done) == sorted(acknowledged), "a job was lost or done twice"
    blob = store.inner.read(STATE_KEY)  # past the faults: what is really stored
    assert blob is not None and not decode_state(blob.data, "test").runs


def test_runs_through_the_elected_broker() -> None:
    """The broker's engine spills and reads runs; its clients see the same order."""
    shared = MemoryStore()
    with (
        Queue(store=shared, broker="auto", spill_at=BOUND) as leader,
        Queue(store=shared, broker="auto", spill_at=BOUND) as client,
    ):
        leader.declare("q")
        ids = [client.enqueue("q", f"job {n}".encode(), priority=n % 3) for n in range(JOBS)]
        roles = [
            q.committer.role for q in (leader, client) if isinstance(q.committer, ElectedCommitter)
        ]
        assert roles[0] == "leader" and roles[1].startswith("follower")
        assert shared.list("runs/"), "the broker's engine spilled nothing"
        got = [d.job.id for d in client.claim("q", JOBS)]
        assert got == [job.id for job in sorted(ids, key=lambda j: (j.priority, j.seq))]


def test_a_format_1_state_is_upgraded_by_its_first_commit(tmp_path: Path) -> None:
    store = open_store(tmp_path.as_uri())
    old = Engine(store)  # as every release so far writes it
    order = enqueue_one_by_one(old)
    old.close()
    assert head(store) == (1, JOBS, 0)
    new = Engine(store, spill_at=BOUND, run_jobs=RUN_JOBS)
    try:
        new.submit(builders.declare("q", {})).result()  # changes nothing: nothing is written
        assert head(store) == (1, JOBS, 0)
        new.submit(builders.enqueue("q", [b"last"], priority=9)).result()
        fmt, inline, runs = head(store)
        assert fmt == 2 and inline <= BOUND and runs >= 1
        jobs = new.submit(builders.claim(["q"], JOBS, owner="test")).result()
        assert [(j.priority, j.id) for j in jobs] == order
    finally:
        new.close()


#: The last commit of the project before states with runs (format 2) existed.
BEFORE_RUNS = "c25c4cb"


def test_an_earlier_release_refuses_a_state_with_runs_and_leaves_it(tmp_path: Path) -> None:
    """The release before runs, checked out from this repository's history, run for real."""
    earlier = check_out(BEFORE_RUNS, tmp_path)
    store = open_store((tmp_path / "store").as_uri())
    engine = Engine(store, spill_at=BOUND, run_jobs=RUN_JOBS)
    enqueue_one_by_one(engine)
    engine.close()
    before = store.read(STATE_KEY)
    assert before is not None and head(store)[0] == 2
    done = run_under(earlier, ENQUEUE_ONE, (tmp_path / "store").as_uri())
    assert done.returncode != 0, done.stdout
    assert str(earlier) in done.stderr, "the earlier release was not the one run"
    assert "expected an objq state of format 1, found format 2" in done.stderr, done.stderr
    after = store.read(STATE_KEY)
    assert after is not None and after.data == before.data


def test_claims_reaching_more_runs_than_the_cache_keeps(tmp_path: Path) -> None:
    """A batch needing runs read by the last one keeps them, however many the cache holds."""
    store = open_store(tmp_path.as_uri())
    engine = Engine(store, spill_at=1, run_jobs=2)
    try:
        engine.submit(builders.declare("q", {})).result()
        made = [
            engine.submit(builders.enqueue("q", [b"x"], priority=n % 4)).result()[0]
            for n in range(120)
        ]
        assert len(store.list("runs/")) > 2 * RUN_CACHE_SIZE
        claimed: list[Job] = []
        while batch := engine.submit(builders.claim(["q"], 30, owner="test")).result():
            claimed += batch
        assert [j.id for j in claimed] == [
            j.id for j in sorted(made, key=lambda j: (j.priority, j.seq))
        ]
    finally:
        engine.close()


def test_a_run_written_by_a_process_killed_before_its_commit_is_ignored_and_swept(
    tmp_path: Path,
) -> None:
    """The producer dies between writing a run and the commit that would refer to it: its
    unacknowledged job is nowhere, every acknowledged one is claimed exactly once, and the
    next process to commit deletes the run nobody refers to."""
    url = tmp_path.as_uri()
    script = Path(__file__).with_name("kill_after_run_write.py")
    producer = subprocess.run(
        [sys.executable, str(script), url, str(BOUND)],
        check=False,
        capture_output=True,
        timeout=120,
    )
    assert producer.returncode == -9, producer.stderr.decode()
    acknowledged = producer.stdout.decode().split()
    assert len(acknowledged) > BOUND, "the producer died before its first run landed"
    store = open_store(url)
    orphans = [k for k in store.list("runs/") if k not in {r.key for r in runs_of(store)}]
    assert len(orphans) == 1, f"expected the killed commit's one run, found {orphans}"

    engine = Engine(store, spill_at=BOUND, run_jobs=RUN_JOBS)
    try:
        listed = engine.submit(builders.list_jobs("q", None, 1000)).result()
        assert sorted(job.id for _, job in listed) == sorted(acknowledged)
        claimed: list[str] = []
        while jobs := engine.submit(builders.claim(["q"], 4, owner="test")).result():
            claimed += [job.id for job in jobs]
            for delivery in builders.deliveries(jobs):
                engine.submit(builders.ack(delivery)).result()
        assert sorted(claimed) == sorted(acknowledged)
        engine.flush()  # the janitor's sweep, started by the first commit, has run
        assert store.list("runs/") == [], "the orphan run (or a consumed one) was left"
    finally:
        engine.close()


def runs_of(store: ObjectStore) -> list[RunRef]:
    blob = store.read(STATE_KEY)
    assert blob is not None
    return [ref for refs in decode_state(blob.data, "test").runs.values() for ref in refs]


def test_dead_letters_past_the_bound_leave_the_head_and_stay_exact(store: ObjectStore) -> None:
    clock = ManualClock()
    engine = Engine(store, spill_at=BOUND, run_jobs=RUN_JOBS, clock=clock)
    try:
        engine.call(builders.declare("q", {"max_attempts": 1, "dead_ttl_seconds": 100}))
        engine.call(builders.enqueue("q", [f"job {n}".encode() for n in range(JOBS)]))
        died = []
        claimed: list[Job] = engine.call(builders.claim(["q"], JOBS, owner="test"))
        for delivery in builders.deliveries(claimed):
            clock.now += 1
            assert engine.call(builders.nack(delivery, error="boom", retry=False)) == "dead"
            died.append(delivery.id)
        doc = stored_doc(store)
        assert len(doc.dead) <= BOUND and doc.dead_runs, "dead letters did not leave the head"
        assert engine.call(builders.stats(["q"]))[0].dead == JOBS

        other = Engine(
            store, spill_at=BOUND, run_jobs=RUN_JOBS, clock=clock
        )  # another process: reads the runs
        try:
            assert [job.id for job in other.call(DeadLetters("q"))] == died
            assert other.call(FindJob(died[0])) is not None
            assert Snapshot.read(store).dead_letters("q") == other.call(DeadLetters("q"))
            assert other.call(builders.retry_dead("q", [died[0]])) == [died[0]]
            stats = other.call(builders.stats(["q"]))[0]
            assert (stats.ready, stats.dead) == (1, JOBS - 1)
        finally:
            other.close()
        # Past retention the dead runs go, a few dead letters at a time as their time comes.
        clock.now += 100 - JOBS // 2
        engine.call(Expire())
        assert engine.call(builders.stats(["q"]))[0].dead == JOBS // 2
        clock.now += JOBS
        engine.call(Expire())
        assert engine.call(builders.stats(["q"]))[0].dead == 0
        engine.flush()
        assert not stored_doc(store).dead_runs
        assert store.list("runs/") == [], "a dead run past retention was left"
    finally:
        engine.close()


def test_idempotency_keys_past_the_bound_leave_the_head_and_still_hold(
    store: ObjectStore,
) -> None:
    clock = ManualClock()
    engine = Engine(store, spill_at=BOUND, run_jobs=RUN_JOBS, clock=clock)
    try:
        engine.call(builders.declare("q", {"idempotency_seconds": 50}))
        first = {}
        for n in range(JOBS):
            clock.now += 1
            (job,) = engine.call(builders.enqueue("q", [b"x"], keys=[f"k{n}"]))
            first[f"k{n}"] = job.id
        doc = stored_doc(store)
        assert len(doc.keys) <= BOUND and doc.key_runs, "keys did not leave the head"

        other = Engine(
            store, spill_at=BOUND, run_jobs=RUN_JOBS, clock=clock
        )  # reads the key runs it needs
        try:
            again = other.call(builders.enqueue("q", [b"y", b"z"], keys=["k0", "k1"]))
            assert [job.id for job in again] == [first["k0"], first["k1"]]
            assert other.call(builders.stats(["q"]))[0].ready == JOBS
        finally:
            other.close()
        # Past the window the key runs go, and a key makes a new job again.
        clock.now += 50
        (fresh,) = engine.call(builders.enqueue("q", [b"x"], keys=["k0"]))
        assert fresh.id != first["k0"]
        engine.flush()
        assert not stored_doc(store).key_runs
    finally:
        engine.close()


def stored_doc(store: ObjectStore) -> StateDoc:
    blob = store.read(STATE_KEY)
    assert blob is not None
    return decode_state(blob.data, "test")


@pytest.mark.parametrize("bound", [-1, 2.5, "1000", True])
def test_a_bound_that_is_not_a_count_is_refused(bound: object) -> None:
    with pytest.raises(
        ConfigurationError, match=r"spill_at: expected a whole number, zero or more, or None, found"
    ):
        Engine(MemoryStore(), spill_at=bound)  # type: ignore[arg-type]


def test_a_listing_whose_runs_were_consumed_meanwhile_reads_the_state_again() -> None:
    store = MemoryStore()
    engine = Engine(store, spill_at=BOUND, run_jobs=RUN_JOBS)
    try:
        order = enqueue_one_by_one(engine)
        snapshot = Snapshot.read(store)  # someone runs `objq jobs list` ...
        taken: list[Job] = engine.call(builders.claim(["q"], JOBS - 3, owner="test"))
        for delivery in builders.deliveries(taken):  # ... while a worker takes most jobs
            engine.call(builders.ack(delivery))
        engine.flush()
        referred = {ref.key for _, ref in snapshot._state.runs_of()}
        assert referred - set(store.list("runs/")), "no run the snapshot refers to was consumed"
        listed = snapshot.jobs("q")
        assert [job.id for _, job in listed] == [i for _, i in order[JOBS - 3 :]]
    finally:
        engine.close()


def test_a_producer_of_single_jobs_keeps_one_run_growing(store: ObjectStore) -> None:
    """Each spill merges into the queue's newest run while it fits: the head keeps one
    reference, the runs it replaced are deleted, and the claim order is unchanged."""
    engine = Engine(store, spill_at=BOUND)
    try:
        order = enqueue_one_by_one(engine)
        engine.flush()
        assert head(store)[2] == 1, "spills made a run each instead of merging"
        assert len(store.list("runs/")) == 1, "a replaced run was left behind"
        claimed: list[Job] = engine.call(builders.claim(["q"], JOBS, owner="test"))
        assert [(j.priority, j.id) for j in claimed] == order
    finally:
        engine.close()


def test_producers_taking_turns_have_their_small_runs_merged(store: ObjectStore) -> None:
    """Direct-mode producers taking turns each spill into a run of their own (neither has the
    other's newest run at hand). Small runs are read in the background and merged by a later
    commit: the head keeps a bounded number of references, the merged runs are deleted, and
    every job is claimed once, in order."""
    run_jobs = 8 * (BOUND + 1)  # spills of BOUND + 1 jobs are small runs
    producers = [Engine(store, spill_at=BOUND, run_jobs=run_jobs) for _ in range(2)]
    made: list[tuple[int, int, str]] = []
    try:
        producers[0].call(builders.declare("q", {}))
        for turn in range(24):
            engine = producers[turn % 2]
            bodies = [f"job {turn}-{n}".encode() for n in range(BOUND + 1)]
            jobs = engine.call(builders.enqueue("q", bodies, priority=turn % 3))
            made += [(job.priority, job.seq, job.id) for job in jobs]
            engine.flush()  # its background reads too: the next commit can merge
        merged = sum(engine.metrics.runs_merged for engine in producers)
        refs = [ref for ref in runs_of(store) if ref.kind == "ready"]
        assert merged >= 8, f"expected small runs merged, found {merged}"
        small = [ref for ref in refs if 2 * ref.remaining <= run_jobs]
        # A commit may make the MERGE_AT-th small run: the next one merges them.
        assert len(small) <= MERGE_AT, f"small runs left: {[r.remaining for r in small]}"
        assert sum(ref.remaining for ref in refs) == len(made) - head(store)[1]
        assert sorted(store.list("runs/")) == sorted(ref.key for ref in runs_of(store))
        claimer = Engine(store)
        try:
            claimed: list[Job] = claimer.call(builders.claim(["q"], len(made), owner="test"))
        finally:
            claimer.close()
        assert [(j.priority, j.id) for j in claimed] == [(p, i) for p, _, i in sorted(made)]
    finally:
        for engine in producers:
            engine.close()
