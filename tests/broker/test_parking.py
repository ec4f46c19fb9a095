"""Claims wait at the broker: one new job wakes one parked claimer, delayed jobs and expired
leases wake them when due, nobody polls while they wait, and a claim sent again after a lost
answer is answered, never applied twice. Real engines; real libzmq links between queues of one
store."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from objq_broker import Queue, builders
from objq_broker.broker import wire
from objq_broker.broker.elected import ElectedCommitter
from objq_broker.broker.parking import LANE_STRIDE, ClaimPark
from objq_broker.engine import Engine
from objq_broker.errors import ConfigurationError
from objq_broker.model.ops import Session
from objq_broker.storage import MemoryStore
from tests.support.waiting import wait_for

CLAIMERS = 4


@pytest.fixture
def fleet() -> Iterator[tuple[Queue, list[Queue]]]:
    """A broker (the first queue to commit) and ``CLAIMERS`` queues that follow it."""
    store = MemoryStore()
    leader = Queue(store=store, broker="auto")
    leader.declare("q")
    followers = [Queue(store=store, broker="auto") for _ in range(CLAIMERS)]
    for follower in followers:
        follower.stats("q")  # found the broker
    yield leader, followers
    for queue in [*followers, leader]:
        queue.close()


def committer(queue: Queue) -> ElectedCommitter:
    assert isinstance(queue.committer, ElectedCommitter)
    return queue.committer


def start_claimers(
    followers: list[Queue], timeout: float, got: list[tuple[int, str]]
) -> list[threading.Thread]:
    def claim(index: int, queue: Queue) -> None:
        for delivery in queue.claim("q", timeout=timeout):
            got.append((index, delivery.job.id))
            queue.ack(delivery)

    threads = [
        threading.Thread(target=claim, args=(i, q), daemon=True) for i, q in enumerate(followers)
    ]
    for thread in threads:
        thread.start()
    return threads


def test_one_job_wakes_one_parked_claimer_and_nobody_polls(
    fleet: tuple[Queue, list[Queue]],
) -> None:
    leader, followers = fleet
    broker = committer(leader)
    assert broker.role == "leader" and broker.leader_engine is not None
    got: list[tuple[int, str]] = []
    threads = start_claimers(followers, 20.0, got)
    wait_for(lambda: broker.parked_claims == CLAIMERS, 10, "every claimer parked")
    before = dataclasses.replace(broker.leader_engine.metrics)  # a copy: it counts on
    time.sleep(1.0)
    after = broker.leader_engine.metrics
    assert after.ops == before.ops, "claims were sent again while everyone waited"
    assert (after.state_reads, after.state_writes) == (before.state_reads, before.state_writes)

    ops_before = broker.leader_engine.metrics.ops
    first = leader.enqueue("q", b"one")
    wait_for(lambda: len(got) == 1, 5, "the job reached a parked claimer")
    time.sleep(0.5)
    assert [job for _, job in got] == [first.id]
    assert broker.parked_claims == CLAIMERS - 1, "the others stay parked"
    # The enqueue, the woken claim (and its ack): not one claim per waiting claimer.
    assert broker.leader_engine.metrics.ops - ops_before <= 3

    rest = [leader.enqueue("q", f"job {i}".encode()).id for i in range(CLAIMERS - 1)]
    for thread in threads:
        thread.join(10)
    assert sorted(job for _, job in got) == sorted([first.id, *rest])
    assert len({index for index, _ in got}) == CLAIMERS, "each claimer took one job"
    assert leader.stats("q").ready == 0


def test_a_parked_claim_wakes_when_a_delayed_job_comes_due(
    fleet: tuple[Queue, list[Queue]],
) -> None:
    leader, followers = fleet
    leader.enqueue("q", b"later", delay=0.8)
    started = time.monotonic()
    found = followers[0].claim("q", timeout=10)
    waited = time.monotonic() - started
    assert [d.payload for d in found] == [b"later"]
    assert 0.6 < waited < 3.0, f"took {waited:.2f} s for a job due in 0.8 s"


def test_a_parked_claim_takes_a_job_whose_lease_ran_out(fleet: tuple[Queue, list[Queue]]) -> None:
    leader, followers = fleet
    leader.enqueue("q", b"dropped")
    (held,) = followers[0].claim("q", lease=0.8)
    started = time.monotonic()
    found = followers[1].claim("q", timeout=10)
    assert time.monotonic() - started < 3.0
    assert [(d.job.id, d.job.attempts) for d in found] == [(held.job.id, 2)]


@pytest.fixture
def engine() -> Iterator[Engine]:
    engine = Engine(MemoryStore())
    engine.submit(builders.declare("q", {})).result()
    yield engine
    engine.close()


def claim_session(client: str, n: int = 1) -> Session:
    return Session(client, LANE_STRIDE, [builders.claim(["q"], n, owner="test")])


def test_a_claim_sent_again_is_answered_not_applied_again(engine: Engine) -> None:
    first, second = engine.submit(builders.enqueue("q", [b"a", b"b"])).result()
    park = ClaimPark(engine)
    session = claim_session("lane-1")
    ((ok, taken),) = park.claim(session, 0.0)
    assert ok and [job.id for job in taken] == [first.id]
    # The answer was lost; the client sends the same session (to the next broker).
    ((ok, again),) = park.claim(session, 0.0)
    assert ok and [job.id for job in again] == [first.id]
    assert engine.submit(builders.stats(["q"])).result()[0].ready == 1  # b is still there
    assert second.id not in {job.id for job in again}


def answered(results: list[Any]) -> list[tuple[str, list[str]]]:
    """Each claimer's lane with the ids of the jobs its claim took."""
    found = []
    for lane, ((ok, jobs),) in results:
        assert ok
        found.append((lane, [job.id for job in jobs]))
    return found


def park_claims(park: ClaimPark, sessions: list[Session], timeout: float) -> list[Any]:
    """Claimers parked one after the other (each standing before the next parks); returns
    the list their outcomes land in, in the order they come back, with their lane."""
    results: list[Any] = []
    for index, session in enumerate(sessions, 1):

        def claim(session: Session = session) -> None:
            results.append((session.client, park.claim(session, timeout)))

        threading.Thread(target=claim, daemon=True).start()

        def standing(index: int = index) -> bool:
            return park.standing == index

        wait_for(standing, 5, f"claimer {index} standing")
    return results


def test_a_parked_claim_is_answered_by_the_commit_that_readies_its_job(engine: Engine) -> None:
    park = ClaimPark(engine)
    results = park_claims(park, [claim_session("lane-1"), claim_session("lane-2")], 30.0)
    writes, reads = engine.metrics.state_writes, engine.metrics.state_reads
    (job,) = engine.submit(builders.enqueue("q", [b"a"])).result()
    # The enqueue's own commit answered the first claimer: no write of its own for the claim.
    wait_for(lambda: len(results) == 1, 5, "the first claimer answered")
    assert answered(results) == [("lane-1", [job.id])]
    assert (engine.metrics.state_writes, engine.metrics.state_reads) == (writes + 1, reads)
    assert engine.submit(builders.stats(["q"])).result()[0].in_flight == 1
    assert len(park) == 1 and park.standing == 1, "the second claimer stays parked"

    (later,) = engine.submit(builders.enqueue("q", [b"b"])).result()
    wait_for(lambda: len(results) == 2, 5, "the second claimer answered")
    assert answered(results)[1] == ("lane-2", [later.id])
    assert engine.metrics.state_writes == writes + 2
    park.close()


def test_a_commit_readying_k_jobs_answers_the_first_k_standing_claimers(engine: Engine) -> None:
    park = ClaimPark(engine)
    results = park_claims(park, [claim_session(f"lane-{i}") for i in (1, 2, 3)], 30.0)
    writes = engine.metrics.state_writes
    jobs = engine.submit(builders.enqueue("q", [b"a", b"b"])).result()
    wait_for(lambda: len(results) == 2, 5, "two claimers answered")
    time.sleep(0.2)
    assert sorted(answered(results)) == [("lane-1", [jobs[0].id]), ("lane-2", [jobs[1].id])]
    assert engine.metrics.state_writes == writes + 1
    assert len(park) == 1 and park.standing == 1
    park.close()


def test_a_standing_try_taken_by_a_commit_is_answered_from_its_mark_when_sent_again(
    engine: Engine,
) -> None:
    park = ClaimPark(engine)
    session = claim_session("lane-1")
    results = park_claims(park, [session], 30.0)
    (job,) = engine.submit(builders.enqueue("q", [b"a"])).result()
    wait_for(lambda: len(results) == 1, 5, "the claimer answered")
    # The answer was lost on its way; the same request comes again (to the next broker): its
    # second try, the standing one, took the job, and the first is answered from that mark.
    ((ok, again),) = park.claim(session, 30.0)
    assert ok and [j.id for j in again] == [job.id]
    engine.submit(builders.enqueue("q", [b"b"])).result()
    assert engine.submit(builders.stats(["q"])).result()[0].ready == 1  # b is still there
    park.close()


def test_a_full_park_answers_at_once_and_close_wakes_the_parked(engine: Engine) -> None:
    park = ClaimPark(engine, max_parked=1)
    results: list[Any] = []
    parked = threading.Thread(
        target=lambda: results.append(park.claim(claim_session("lane-1"), 30.0))
    )
    parked.start()
    wait_for(lambda: len(park) == 1, 5, "the first claim parked")
    started = time.monotonic()
    assert park.claim(claim_session("lane-2"), 30.0) == [(True, [])]
    assert time.monotonic() - started < 1.0, "no room: it must not wait"
    park.close()
    parked.join(2)
    assert not parked.is_alive() and results == [[(True, [])]]


def test_a_waiting_claim_must_hold_one_claim() -> None:
    bad = wire._encoder.encode(
        wire.WaitingClaim(Session("c", 1, [builders.purge("q")]), wait_seconds=1.0)
    )
    with pytest.raises(
        ConfigurationError, match=r"expected one Claim operation, found \['Purge'\]"
    ):
        wire.decode_claim(bad)
    with pytest.raises(ConfigurationError, match="wait_seconds"):
        wire.decode_claim(b'{"session": {"client": "c", "seq": 1, "ops": []}, "wait_seconds": -1}')


def test_with_no_broker_to_wait_at_a_waiting_claim_claims_nothing() -> None:
    with Queue(store=MemoryStore(), broker="client") as queue:  # no broker: commits directly
        queue.enqueue("q", b"left for the usual claim")
        waiting = committer(queue).claim_waiting(builders.claim(["q"], 1, owner="test"), 0.5)
        assert waiting is None
        assert queue.stats("q").ready == 1
        assert [d.payload for d in queue.claim("q", timeout=0.5)] == [b"left for the usual claim"]


def test_a_claim_queued_before_an_enqueue_in_one_session_takes_that_job(
    fleet: tuple[Queue, list[Queue]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a follower whose sender is held in a session, so what comes next waits for the
    # next session together: a claim, then a job sent a moment after it
    _, (follower, *_) = fleet
    committer = follower.committer
    assert isinstance(committer, ElectedCommitter)
    held, release = threading.Event(), threading.Event()
    sent: list[list[str]] = []
    commit = committer._routes.commit

    def hold_the_first(session: Session) -> Any:
        sent.append([type(op).__name__ for op in session.ops])
        if not held.is_set():
            held.set()
            release.wait(10)
        return commit(session)

    monkeypatch.setattr(committer._routes, "commit", hold_the_first)
    first = follower.submit(builders.stats(["q"]))
    assert held.wait(10)
    claim = follower.submit_claim("q", 5)
    enqueued = follower.submit(builders.enqueue("q", [b"job"]))

    # When the sender goes on
    release.set()

    # Then both went in one session, the claim after the enqueue, and the claim took the job
    first.result(10)
    (job,) = enqueued.result(10)
    assert [d.id for d in claim.result(10)] == [job.id]
    assert sent[1] == ["Enqueue", "Claim"]
