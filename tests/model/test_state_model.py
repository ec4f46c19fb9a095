"""QueueState against a reference model, driven by Hypothesis' stateful testing.

The reference below keeps plain lists and scans them: nothing in it is indexed, cached or
lazy, so it is easy to see that it is right. The machine applies every operation to both and
compares results, errors and the whole visible state after every step.

What the model defines, and the reference therefore does:

* Order: among a queue's visible jobs, lower ``priority`` first, then ``seq`` (enqueue
  order; a retried dead letter gets a new, last ``seq``; a released or retried job keeps its).
* Leases expire lazily: a lease past its expiry still counts as in flight, and its token still
  works, until a claim on that queue or ``expire(now)`` notices it. Then the job is ready again
  (visible at that moment) or, if its attempts are spent, dead.
* Attempts: a claim counts one, a release gives it back, a lease expiry keeps it; a nack
  dead-letters once ``attempts >= max_attempts`` (or when it asks for no retry).
* A stale token (its job was acked, dead-lettered, released, nacked, or re-delivered to
  someone else) is refused: ack and nack raise ``LeaseLost``, heartbeat and release say
  ``False``, and the state does not change.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass

import msgspec
import pytest
from hypothesis import HealthCheck, Phase, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from objq_broker.errors import JobNotFound, LeaseLost, QueueNotFound, StateCorrupt
from objq_broker.model.encoding import check_encoded, decode_state, encode_state
from objq_broker.model.records import Job, QueueConfig, StateDoc
from objq_broker.model.state import QueueState
from objq_broker.model.values import NewJob, retry_delay

#: Queues declared up front, with short leases and windows so that time jumps reach them.
DECLARED = {
    "a": QueueConfig(
        max_attempts=3,
        backoff_base_seconds=1.0,
        backoff_cap_seconds=4.0,
        lease_seconds=5.0,
        dead_ttl_seconds=30.0,
        idempotency_seconds=15.0,
    ),
    "b": QueueConfig(
        max_attempts=2,
        backoff_base_seconds=2.0,
        backoff_cap_seconds=10.0,
        lease_seconds=3.0,
        dead_ttl_seconds=50.0,
        idempotency_seconds=40.0,
    ),
}
#: "c" is declared by its first enqueue, with the default settings.
QUEUES = ["a", "b", "c"]
KEYS = [None, None, "k1", "k2"]
START = 1000.0

SETTINGS = settings(
    max_examples=150,
    stateful_step_count=40,
    derandomize=True,
    database=None,
    deadline=None,
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow],
    # The explain phase re-runs a failing stateful example thousands of times (minutes); the
    # shrunk steps are explanation enough.
    phases=[Phase.explicit, Phase.generate, Phase.shrink],
)


def same_state(first: bytes, second: bytes) -> bool:
    """Two encoded states hold the same document (the order of the jobs list is free)."""

    def normal(data: bytes) -> StateDoc:
        doc = decode_state(data, "comparison")
        return msgspec.structs.replace(doc, jobs=sorted(doc.jobs, key=lambda job: job.id))

    return normal(first) == normal(second)


#: What an enqueue rule asks for: (queue, priority, delay, idempotency key, max_attempts).
Item = tuple[str, int, int, str | None, int | None]
ITEM = st.tuples(
    st.sampled_from(QUEUES),
    st.integers(-1, 2),
    st.sampled_from([0, 0, 0, 1, 3, 7]),
    st.sampled_from(KEYS),
    st.sampled_from([None, 1, 1, 2, 3]),
)


class RefLeaseLost(Exception):
    """The reference's own verdict that a token is stale."""


@dataclass
class RefJob:
    id: str
    queue: str
    priority: int
    seq: int
    enqueued_at: float
    visible_at: float
    max_attempts: int
    attempts: int = 0
    token: str | None = None
    lease_expires_at: float | None = None
    finished_at: float | None = None

    def state_at(self, now: float) -> str:
        if self.token is not None:
            return "in-flight"
        return "delayed" if self.visible_at > now else "ready"


class Reference:
    """The queue, as lists scanned from end to end."""

    def __init__(self) -> None:
        self.configs: dict[str, QueueConfig] = {}
        self.live: list[RefJob] = []
        self.dead: list[RefJob] = []
        self.keys: dict[tuple[str, str], tuple[str, float]] = {}
        self.seq = 0
        #: (outcome, job id) of jobs that left the hot state since the last check.
        self.finished: list[tuple[str, str]] = []

    # --- lookups --------------------------------------------------------------------------

    def live_job(self, job_id: str) -> RefJob | None:
        return next((job for job in self.live if job.id == job_id), None)

    def dead_job(self, job_id: str) -> RefJob | None:
        return next((job for job in self.dead if job.id == job_id), None)

    def held(self, job_id: str, token: str) -> RefJob:
        job = self.live_job(job_id)
        if job is None or job.token != token:
            raise RefLeaseLost(job_id)
        return job

    def held_pairs(self) -> list[tuple[str, str]]:
        return [(job.id, job.token) for job in self.live if job.token is not None]

    # --- transitions ----------------------------------------------------------------------

    def enqueue(self, items: list[NewJob], now: float) -> list[str]:
        ids = []
        for item in items:
            config = self.configs.setdefault(item.queue, QueueConfig())
            if item.key is not None:
                record = self.keys.get((item.queue, item.key))
                if record is not None and record[1] > now:
                    ids.append(record[0])
                    continue
            self.seq += 1
            self.live.append(
                RefJob(
                    id=item.id,
                    queue=item.queue,
                    priority=item.priority,
                    seq=self.seq,
                    enqueued_at=now,
                    visible_at=now + item.delay_seconds,
                    max_attempts=item.max_attempts or config.max_attempts,
                )
            )
            if item.key is not None:
                self.keys[(item.queue, item.key)] = (item.id, now + config.idempotency_seconds)
            ids.append(item.id)
        return ids

    def _kill(self, job: RefJob, now: float) -> None:
        self.live.remove(job)
        job.token = job.lease_expires_at = None
        job.finished_at = now
        self.dead.append(job)
        self.finished.append(("dead", job.id))

    def expire_leases(self, queues: list[str], now: float) -> int:
        """Notice the leases of ``queues`` that ran out by ``now``."""
        expired = [
            job
            for job in self.live
            if job.queue in queues
            and job.lease_expires_at is not None
            and job.lease_expires_at <= now
        ]
        for job in expired:
            if job.attempts >= job.max_attempts:
                self._kill(job, now)
            else:
                job.token = job.lease_expires_at = None
                job.visible_at = now
        return len(expired)

    def claim_order(self, queue: str, now: float) -> list[str]:
        """Who a claim at ``now`` would get, in order, without changing anything."""
        candidates = [
            job
            for job in self.live
            if job.queue == queue
            and (
                (job.token is None and job.visible_at <= now)
                or (
                    job.lease_expires_at is not None
                    and job.lease_expires_at <= now
                    and job.attempts < job.max_attempts
                )
            )
        ]
        return [job.id for job in sorted(candidates, key=lambda job: (job.priority, job.seq))]

    def claim(
        self, queue: str, tokens: list[str], now: float, lease_seconds: float | None
    ) -> list[str]:
        if queue not in self.configs:
            return []
        self.expire_leases([queue], now)
        seconds = lease_seconds if lease_seconds is not None else self.configs[queue].lease_seconds
        chosen = self.claim_order(queue, now)[: len(tokens)]
        for job_id, token in zip(chosen, tokens, strict=False):
            job = self.live_job(job_id)
            assert job is not None
            job.attempts += 1
            job.token = token
            job.lease_expires_at = job.visible_at = now + seconds
        return chosen

    def ack(self, job_id: str, token: str) -> None:
        job = self.held(job_id, token)
        self.live.remove(job)
        self.finished.append(("done", job_id))

    def nack(
        self,
        job_id: str,
        token: str,
        now: float,
        *,
        retry: bool,
        jitter: float,
        delay_seconds: float | None,
    ) -> str:
        job = self.held(job_id, token)
        if not retry or job.attempts >= job.max_attempts:
            self._kill(job, now)
            return "dead"
        config = self.configs[job.queue]
        if delay_seconds is None:
            delay_seconds = retry_delay(
                job.attempts, config.backoff_base_seconds, config.backoff_cap_seconds, jitter
            )
        job.token = job.lease_expires_at = None
        job.visible_at = now + delay_seconds
        return "retry"

    def release(self, pairs: list[tuple[str, str]], now: float) -> list[bool]:
        result = []
        for job_id, token in pairs:
            try:
                job = self.held(job_id, token)
            except RefLeaseLost:
                result.append(False)
                continue
            job.token = job.lease_expires_at = None
            job.attempts = max(job.attempts - 1, 0)
            job.visible_at = now
            result.append(True)
        return result

    def heartbeat(
        self, pairs: list[tuple[str, str]], now: float, lease_seconds: float | None
    ) -> list[bool]:
        result = []
        for job_id, token in pairs:
            try:
                job = self.held(job_id, token)
            except RefLeaseLost:
                result.append(False)
                continue
            seconds = lease_seconds or self.configs[job.queue].lease_seconds
            job.lease_expires_at = job.visible_at = now + seconds
            result.append(True)
        return result

    def expire(self, now: float) -> int:
        expired = self.expire_leases(list(self.configs), now)
        self.dead = [
            job
            for job in self.dead
            if (job.finished_at or 0.0) + self.configs[job.queue].dead_ttl_seconds > now
        ]
        self.keys = {slot: record for slot, record in self.keys.items() if record[1] > now}
        return expired

    def purge(self, queue: str) -> int:
        if queue not in self.configs:
            raise QueueNotFound(queue)
        doomed = [job for job in self.live if job.queue == queue and job.token is None]
        self.live = [job for job in self.live if job not in doomed]
        return len(doomed)

    def dead_ids(self, queue: str, ids: list[str] | None) -> list[str]:
        if queue not in self.configs:
            raise QueueNotFound(queue)
        mine = [job.id for job in self.dead if job.queue == queue]
        if ids is None:
            return mine
        if any(job_id not in mine for job_id in ids):
            raise JobNotFound(queue)
        return list(dict.fromkeys(ids))

    def retry_dead(self, chosen: list[str], now: float) -> None:
        for job_id in chosen:
            job = self.dead_job(job_id)
            assert job is not None
            self.dead.remove(job)
            self.seq += 1
            job.seq = self.seq
            job.attempts = 0
            job.visible_at = now
            job.finished_at = None
            self.live.append(job)

    def purge_dead(self, chosen: list[str]) -> None:
        self.dead = [job for job in self.dead if job.id not in chosen]

    # --- reading --------------------------------------------------------------------------

    def stats(self, queue: str, now: float) -> tuple[int, int, int, int, float | None]:
        states = Counter(job.state_at(now) for job in self.live if job.queue == queue)
        ready = [
            job.enqueued_at
            for job in self.live
            if job.queue == queue and job.state_at(now) == "ready"
        ]
        dead = sum(1 for job in self.dead if job.queue == queue)
        age = max(now - min(ready), 0.0) if ready else None
        return states["ready"], states["delayed"], states["in-flight"], dead, age


def _pairs(
    data: st.DataObject, held: list[tuple[str, str]], stale: list[tuple[str, str]]
) -> list[tuple[str, str]]:
    """One to three (job id, token) pairs: held ones, held and stale mixed, or one held pair
    twice (as when two extends of one delivery land in one engine batch, at one ``now``).

    Stale tokens pile up as a run goes on, so a plain mix would hardly ever pick a held one.
    """
    mixed = st.lists(st.sampled_from(held + stale), min_size=1, max_size=3)
    if not held:
        choices = [mixed]
    else:
        choices = [
            st.lists(st.sampled_from(held), min_size=1, max_size=3),
            mixed,
            st.sampled_from(held).map(lambda pair: [pair, pair]),
        ]
    pairs: list[tuple[str, str]] = data.draw(st.one_of(choices), label="pairs")
    return pairs


class QueueMachine(RuleBasedStateMachine):
    """Every rule applies one operation to QueueState and to the reference, and compares."""

    def __init__(self) -> None:
        super().__init__()
        self.now = START
        self.state = self.new_state()
        self.ref = Reference()
        for name, config in DECLARED.items():
            assert self.state.declare(name, config)
            self.ref.configs[name] = config
        self.state.dirty = False
        self.counter = itertools.count(1)
        #: Every (job id, token) ever delivered, so stale tokens are at hand.
        self.issued: list[tuple[str, str]] = []
        self.created: set[str] = set()
        self.done: set[str] = set()

    # --- helpers --------------------------------------------------------------------------

    def new_state(self, doc: StateDoc | None = None) -> QueueState:
        """A state over ``doc`` (a new one when None), as the engine would hand it over."""
        return QueueState(doc)

    def live_jobs(self) -> dict[str, Job]:
        """Every job the state holds that is not dead, by id."""
        return self.state.jobs

    def dead_jobs(self) -> dict[str, Job]:
        """Every dead letter the state holds, by id."""
        return self.state.dead

    def deadlines(self) -> list[float]:
        """Future instants at which something changes, soonest first."""
        ref = self.ref
        times = {job.visible_at for job in ref.live}
        times |= {
            (job.finished_at or 0.0) + ref.configs[job.queue].dead_ttl_seconds for job in ref.dead
        }
        times |= {expires_at for _, expires_at in ref.keys.values()}
        return sorted(t for t in times if t > self.now)

    def stale_pairs(self) -> list[tuple[str, str]]:
        held = set(self.ref.held_pairs())
        return [pair for pair in self.issued if pair not in held]

    def snapshot(self) -> bytes:
        return encode_state(self.state.to_doc())

    def assert_refused(self, before: bytes, was_dirty: bool) -> None:
        assert self.snapshot() == before, "a refused operation changed the state"
        assert self.state.dirty == was_dirty, "a refused operation marked the state dirty"
        assert self.state.finished == [], "a refused operation finished a job"

    def note_stale(self, job_id: str) -> None:
        job = self.ref.live_job(job_id)
        if job is None:
            event("stale token: job gone")
        elif job.token is None:
            event("stale token: job waiting")
        else:
            event("stale token: job re-delivered to someone else")

    # --- rules ----------------------------------------------------------------------------

    @rule(seconds=st.one_of(st.integers(0, 6), st.sampled_from([10, 30, 100])))
    def advance(self, seconds: int) -> None:
        self.now += seconds

    @precondition(lambda self: self.deadlines())
    @rule(data=st.data(), then_expire=st.booleans())
    def advance_to_a_deadline(self, data: st.DataObject, then_expire: bool) -> None:
        """Jump to the very instant a lease, delay, dead letter or key runs out."""
        self.now = data.draw(st.sampled_from(self.deadlines()), label="deadline")
        if then_expire:
            self.expire()

    def expire(self) -> None:
        assert self.state.expire(self.now) == self.ref.expire(self.now)

    @initialize(
        items=st.lists(ITEM, max_size=8),
        claims=st.lists(st.tuples(st.sampled_from(QUEUES), st.integers(1, 3)), max_size=3),
    )
    def start_busy(self, items: list[Item], claims: list[tuple[str, int]]) -> None:
        """Start with some jobs, some of them leased, so that every rule has work."""
        if items:
            self.enqueue(items)
        for queue, n in claims:
            self.claim_and_compare(queue, n, None)

    @rule(items=st.lists(ITEM, min_size=1, max_size=3))
    def enqueue(self, items: list[Item]) -> None:
        new = [
            NewJob(
                id=f"j{next(self.counter)}",
                queue=queue,
                body=f"body {n}",
                priority=priority,
                delay_seconds=delay,
                max_attempts=max_attempts,
                key=key,
            )
            for n, (queue, priority, delay, key, max_attempts) in enumerate(items)
        ]
        got = [job.id for job in self.state.enqueue(new, self.now)]
        expected = self.ref.enqueue(new, self.now)
        assert got == expected
        if len(set(expected)) < len(expected) or any(i in self.created for i in expected):
            event("idempotency key reused")
        self.created.update(expected)

    @rule(
        queue=st.sampled_from(QUEUES),
        n=st.integers(1, 4),
        lease=st.sampled_from([None, None, 2, 5, 8]),
    )
    def claim(self, queue: str, n: int, lease: int | None) -> None:
        self.claim_and_compare(queue, n, lease)

    def claim_and_compare(self, queue: str, n: int, lease: int | None) -> None:
        tokens = [f"t{next(self.counter)}" for _ in range(n)]
        owner = f"w{len(self.issued) % 3}"
        jobs = self.state.claim(queue, tokens, owner, self.now, lease)
        expected = self.ref.claim(queue, tokens, self.now, lease)
        assert [job.id for job in jobs] == expected
        for job, token in zip(jobs, tokens, strict=False):
            assert job.lease is not None
            assert (job.lease.token, job.lease.owner) == (token, owner)
            self.issued.append((job.id, token))
        if len(expected) > 1:
            event("claimed several")

    @precondition(lambda self: self.ref.held_pairs())
    @rule(
        data=st.data(),
        how=st.sampled_from(["ack", "nack retry", "nack retry", "nack no retry"]),
        jitter=st.floats(0.0, 1.0, exclude_max=True),
        delay=st.one_of(st.none(), st.none(), st.integers(0, 4)),
    )
    def settle_held(self, data: st.DataObject, how: str, jitter: float, delay: int | None) -> None:
        """Ack, or nack with or without a retry, a delivery that is still held."""
        job_id, token = data.draw(st.sampled_from(self.ref.held_pairs()), label="held")
        if how == "ack":
            job = self.state.ack(job_id, token, self.now)
            assert (job.id, job.finished_at) == (job_id, self.now)
            self.ref.ack(job_id, token)
            return
        retry = how == "nack retry"
        outcome = self.state.nack(
            job_id, token, self.now, error="boom", retry=retry, jitter=jitter, delay_seconds=delay
        )
        assert outcome == self.ref.nack(
            job_id, token, self.now, retry=retry, jitter=jitter, delay_seconds=delay
        )
        event(f"{how} -> {outcome}")

    @precondition(lambda self: self.stale_pairs())
    @rule(data=st.data(), nack=st.booleans())
    def ack_or_nack_stale(self, data: st.DataObject, nack: bool) -> None:
        job_id, token = data.draw(st.sampled_from(self.stale_pairs()), label="stale")
        self.note_stale(job_id)
        before, was_dirty = self.snapshot(), self.state.dirty
        self.state.dirty = False
        with pytest.raises(LeaseLost, match=job_id):
            if nack:
                self.state.nack(job_id, token, self.now, error="late", retry=True, jitter=0.5)
            else:
                self.state.ack(job_id, token, self.now)
        self.assert_refused(before, False)
        self.state.dirty = was_dirty
        with pytest.raises(RefLeaseLost):
            self.ref.held(job_id, token)

    @precondition(lambda self: self.issued)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        pairs = _pairs(data, self.ref.held_pairs(), self.stale_pairs())
        expected = self.ref.release(pairs, self.now)
        assert self.state.release(pairs, self.now) == expected
        if not any(expected):
            event("release: nothing held")

    @precondition(lambda self: self.issued)
    @rule(data=st.data(), lease=st.sampled_from([None, None, 2, 5, 8]))
    def heartbeat(self, data: st.DataObject, lease: int | None) -> None:
        pairs = _pairs(data, self.ref.held_pairs(), self.stale_pairs())
        expected = self.ref.heartbeat(pairs, self.now, lease)
        assert self.state.heartbeat(pairs, self.now, lease) == expected
        if len(set(pairs)) < len(pairs) and any(expected):
            event("heartbeat: same lease twice in one call")

    @precondition(lambda self: self.ref.held_pairs())
    @rule(data=st.data(), late=st.integers(0, 2), n=st.integers(1, 3))
    def claim_after_lease_runs_out(self, data: st.DataObject, late: int, n: int) -> None:
        """Wait until a held lease has run out, then claim from its queue: a re-delivery."""
        job_id, _ = data.draw(st.sampled_from(self.ref.held_pairs()), label="held")
        job = self.ref.live_job(job_id)
        assert job is not None and job.lease_expires_at is not None
        self.now = max(self.now, job.lease_expires_at + late)
        self.claim_and_compare(job.queue, n, None)

    @rule(purge=st.booleans(), queue=st.sampled_from(QUEUES))
    def expire_or_purge(self, purge: bool, queue: str) -> None:
        if purge:
            self.purge(queue)
        else:
            self.expire()

    @precondition(lambda self: self.ref.dead)
    @rule(
        which=st.sampled_from(["all", "some", "some", "unknown", "other queue"]),
        purge=st.booleans(),
        data=st.data(),
    )
    def dead_letters(self, which: str, purge: bool, data: st.DataObject) -> None:
        """Retry or purge dead letters: all of a queue's, some, or some that do not exist."""
        dead_queues = sorted({job.queue for job in self.ref.dead})
        queue = data.draw(st.sampled_from(dead_queues) | st.sampled_from(QUEUES), label="queue")
        self.retry_or_purge_dead(queue, which, purge, data)

    def purge(self, queue: str) -> None:
        try:
            expected = self.ref.purge(queue)
        except QueueNotFound:
            with pytest.raises(QueueNotFound):
                self.state.purge(queue)
            return
        assert self.state.purge(queue) == expected

    def retry_or_purge_dead(self, queue: str, which: str, purge: bool, data: st.DataObject) -> None:
        mine = [job.id for job in self.ref.dead if job.queue == queue]
        others = [job.id for job in self.ref.dead if job.queue != queue]
        ids: list[str] | None
        if which == "all":
            ids = None
        elif which == "some":
            ids = data.draw(st.lists(st.sampled_from(mine), max_size=3)) if mine else []
        elif which == "unknown":
            ids = [*mine[:1], "no-such-job"]
        else:
            ids = [*mine[:1], *others[:1]] if others else ["no-such-job"]
        try:
            chosen = self.ref.dead_ids(queue, ids)
        except (QueueNotFound, JobNotFound) as exc:
            before, was_dirty = self.snapshot(), self.state.dirty
            self.state.dirty = False
            with pytest.raises(type(exc)):
                if purge:
                    self.state.purge_dead(queue, ids)
                else:
                    self.state.retry_dead(queue, ids, self.now)
            self.assert_refused(before, False)
            self.state.dirty = was_dirty
            return
        if purge:
            assert self.state.purge_dead(queue, ids) == len(chosen)
            self.ref.purge_dead(chosen)
        else:
            got = self.state.retry_dead(queue, ids, self.now)
            # Which dead letter goes back first is the model's choice when all of them do.
            assert sorted(got) == sorted(chosen)
            self.ref.retry_dead(got if ids is None else chosen, self.now)
            if got:
                event("retried dead letters")

    @precondition(lambda self: self.ref.live or self.ref.dead)
    @rule(probe=st.booleans())
    def roundtrip(self, probe: bool) -> None:
        """Replace the state with its decoded encoding, after probing a decoded copy."""
        data = self.snapshot()
        # The incremental encoder (what the engine writes) must agree with a full encode.
        assert same_state(self.state.encode(), data), "a changed job kept a stale encoding"
        if probe:
            self.probe_claims(data)
        self.state = self.new_state(decode_state(data, "roundtrip"))
        assert not self.state.dirty

    def probe_claims(self, data: bytes) -> None:
        """A decoded copy encodes to the same bytes and hands out jobs in the model's order."""
        probe = self.new_state(decode_state(data, "roundtrip probe"))
        assert encode_state(probe.to_doc()) == data
        for queue in self.ref.configs:
            expected = self.ref.claim_order(queue, self.now)
            tokens = [f"probe{i}" for i in range(len(expected) + 1)]
            assert [job.id for job in probe.claim(queue, tokens, "probe", self.now)] == expected

    # --- invariants -----------------------------------------------------------------------

    @invariant()
    def same_queues_and_stats(self) -> None:
        assert self.state.queue_names() == sorted(self.ref.configs)
        for queue in self.ref.configs:
            stats = self.state.stats(queue, self.now)
            got = (
                stats.ready,
                stats.delayed,
                stats.in_flight,
                stats.dead,
                stats.oldest_ready_age_seconds,
            )
            assert got == self.ref.stats(queue, self.now), queue
        for queue in set(QUEUES) - set(self.ref.configs):
            with pytest.raises(QueueNotFound):
                self.state.stats(queue, self.now)

    @invariant()
    def every_job_in_exactly_one_place(self) -> None:
        live = {job.id: job for job in self.ref.live}
        dead = {job.id: job for job in self.ref.dead}
        assert len(live) == len(self.ref.live) and len(dead) == len(self.ref.dead)
        assert not live.keys() & dead.keys()
        jobs = self.live_jobs()
        assert set(jobs) == set(live)
        dead_jobs = self.dead_jobs()
        assert set(dead_jobs) == set(dead)
        for job_id, ref in live.items():
            job = jobs[job_id]
            assert (job.queue, job.priority, job.seq, job.max_attempts) == (
                ref.queue,
                ref.priority,
                ref.seq,
                ref.max_attempts,
            ), job_id
            assert (job.attempts, job.visible_at) == (ref.attempts, ref.visible_at), job_id
            lease = None if job.lease is None else (job.lease.token, job.lease.expires_at)
            ref_lease = None if ref.token is None else (ref.token, ref.lease_expires_at)
            assert lease == ref_lease, job_id
        for job_id, ref in dead.items():
            job = dead_jobs[job_id]
            assert job.lease is None
            assert (job.attempts, job.finished_at) == (ref.attempts, ref.finished_at), job_id
        for job_id in self.created:
            found = self.state.find(job_id, self.now)
            if job_id in live:
                expected: str | None = live[job_id].state_at(self.now)
            else:
                expected = "dead" if job_id in dead else None
            assert (None if found is None else found[0]) == expected, job_id

    @invariant()
    def incremental_encoding_matches_a_full_one(self) -> None:
        # What the engine writes (cached per-job fragments) must equal a fresh full encode.
        assert same_state(self.state.encode(), encode_state(self.state.to_doc()))

    @invariant()
    def finished_jobs_match(self) -> None:
        got = [(item.outcome, item.job.id) for item in self.state.finished]
        assert Counter(got) == Counter(self.ref.finished)
        for outcome, job_id in got:
            if outcome == "done":
                assert job_id not in self.done, f"{job_id} completed twice"
                self.done.add(job_id)
        # As the engine does once the finished jobs are archived.
        self.state.finished.clear()
        self.ref.finished.clear()


def test_queue_state_matches_reference_model() -> None:
    run_state_machine_as_test(QueueMachine, settings=SETTINGS)


def test_a_state_with_a_null_where_none_may_be_is_refused_before_it_is_written() -> None:
    # A queue that never expires writes expires_seconds as null: that may be null.
    encoded = encode_state(StateDoc(format=1, queues={"q": QueueConfig()}))
    assert b'"expires_seconds":null' in encoded
    check_encoded(encoded, "state.json")
    # A payload may hold anything that looks like a null field: inside a string it is escaped.
    check_encoded(encoded.replace(b'"queues"', b'"x":"\\"version\\":null","queues"'), "state")
    # A field that may not be null, written as null (what NaN becomes), is refused.
    bad = encoded.replace(b'"max_attempts":', b'"max_attempts":null,"was":')
    with pytest.raises(StateCorrupt, match="'max_attempts' written as null"):
        check_encoded(bad, "state.json")
