"""QueueState transitions, one behaviour per test, with fixed times, ids and tokens."""

from __future__ import annotations

import heapq
import json
from collections.abc import Callable
from typing import Any, NoReturn

import pytest

from objq_broker.errors import (
    ConfigurationError,
    JobNotFound,
    LeaseLost,
    QueueNotFound,
    StateCorrupt,
)
from objq_broker.model import (
    backlog,
    indexed,
    leases,
    lifecycle,
    producing,
    reading,
    spilling,
)
from objq_broker.model import state as state_module
from objq_broker.model.encoding import decode_state, encode_state
from objq_broker.model.records import Job, QueueConfig, encode_payload
from objq_broker.model.state import QueueState
from objq_broker.model.values import NewJob, check_queue_name, retry_delay

T0 = 1_000.0
#: Short settings, so that the times in these tests read easily.
CONFIG = QueueConfig(
    max_attempts=3,
    backoff_base_seconds=2.0,
    backoff_cap_seconds=10.0,
    lease_seconds=30.0,
    dead_ttl_seconds=100.0,
    idempotency_seconds=60.0,
)


def fresh(config: QueueConfig = CONFIG) -> QueueState:
    state = QueueState()
    state.declare("q", config)
    return state


def put(state: QueueState, *ids: str, now: float = T0, **options: Any) -> list[Job]:
    return state.enqueue(
        [NewJob(id=i, queue="q", body=f"body of {i}", **options) for i in ids], now
    )


def claim_one(state: QueueState, token: str, now: float, owner: str = "w") -> Job:
    [job] = state.claim("q", [token], owner, now)
    return job


def encoded(state: QueueState) -> bytes:
    return encode_state(state.to_doc())


def roundtrip(state: QueueState) -> QueueState:
    return QueueState(decode_state(encoded(state), "test state"))


# --- leases --------------------------------------------------------------------------------


def test_stale_ack_after_redelivery_raises_lease_lost_and_new_holder_acks() -> None:
    # Given a job delivered to w1, whose lease ran out and which was delivered again to w2
    state = fresh()
    put(state, "j1")
    first = claim_one(state, "t1", T0, owner="w1")
    second = claim_one(state, "t2", T0 + 31, owner="w2")
    assert (first.id, second.id) == ("j1", "j1")
    assert second.attempts == 2

    # When w1 acks (or nacks) late, Then it is refused, naming the job and the new holder
    with pytest.raises(LeaseLost, match=r"j1.*t1.*'w2'"):
        state.ack("j1", "t1", T0 + 32)
    with pytest.raises(LeaseLost, match="j1"):
        state.nack("j1", "t1", T0 + 32, error="late", retry=True, jitter=0.0)

    # And w2 still holds it and can ack it
    assert state.heartbeat([("j1", "t2")], T0 + 33) == [True]
    done = state.ack("j1", "t2", T0 + 34)
    assert (done.id, done.finished_at, done.attempts) == ("j1", T0 + 34, 2)
    assert [(f.outcome, f.job.id) for f in state.finished] == [("done", "j1")]
    with pytest.raises(LeaseLost, match="no longer in the queue"):
        state.ack("j1", "t2", T0 + 35)


def test_stale_heartbeat_and_release_say_false_and_leave_the_new_holder_alone() -> None:
    state = fresh()
    put(state, "j1")
    claim_one(state, "t1", T0)
    claim_one(state, "t2", T0 + 31)
    before = encoded(state)

    assert state.heartbeat([("j1", "t1")], T0 + 40, lease_seconds=500) == [False]
    assert state.release([("j1", "t1")], T0 + 40) == [False]

    assert encoded(state) == before
    found = state.find("j1", T0 + 40)
    assert found is not None
    assert found[0] == "in-flight"
    assert found[1].lease is not None
    assert (found[1].lease.token, found[1].lease.expires_at) == ("t2", T0 + 61)


def test_a_lease_past_its_expiry_still_counts_until_someone_notices() -> None:
    # The model expires leases lazily (on a claim of that queue, or expire()): until then the
    # holder's token works, so a slow worker that finishes before anyone else claims wins.
    state = fresh()
    put(state, "j1")
    claim_one(state, "t1", T0)
    assert state.stats("q", T0 + 45).in_flight == 1
    assert state.heartbeat([("j1", "t1")], T0 + 45) == [True]
    assert state.claim("q", ["t2"], "w", T0 + 46) == []
    assert state.ack("j1", "t1", T0 + 47).id == "j1"


def _refusals() -> dict[str, Callable[[QueueState], object]]:
    return {
        "stale ack": lambda s: s.ack("j1", "t1", T0 + 40),
        "stale nack": lambda s: s.nack("j1", "t1", T0 + 40, error="x", retry=False, jitter=0.0),
        "unknown job ack": lambda s: s.ack("nope", "t2", T0 + 40),
        "retry unknown dead letter": lambda s: s.retry_dead("q", ["dead1", "nope"], T0 + 40),
        "purge unknown dead letter": lambda s: s.purge_dead("q", ["nope"]),
        "dead letters of undeclared queue": lambda s: s.retry_dead("zz", None, T0 + 40),
        "purge undeclared queue": lambda s: s.purge("zz"),
        "enqueue an existing id": lambda s: put(s, "new", "j3", now=T0 + 40),
        "enqueue a dead letter's id": lambda s: put(s, "new", "dead1", now=T0 + 40),
        "enqueue max_attempts 0": lambda s: put(s, "new", max_attempts=0, now=T0 + 40),
        "enqueue to a bad queue name": lambda s: s.enqueue(
            [NewJob("new", "q", "x"), NewJob("new2", "a/b", "x")], T0 + 40
        ),
        "configure an unknown setting": lambda s: s.configure("q", {"lease_secs": 5}),
        "configure a negative setting": lambda s: s.configure("q", {"lease_seconds": -1}),
    }


@pytest.mark.parametrize("name", list(_refusals()))
def test_a_refused_operation_leaves_the_state_unchanged(name: str) -> None:
    # Given a state with a re-delivered job (j1, now held by t2), a waiting job and a dead letter
    state = fresh()
    put(state, "j1", "dead1", "j3")
    claim_one(state, "t1", T0)
    claim_one(state, "td", T0)
    state.nack("dead1", "td", T0, error="x", retry=False, jitter=0.0)
    assert claim_one(state, "t2", T0 + 31).id == "j1"
    state.finished.clear()  # as the engine does once it has written the state
    state.dirty = False
    before = encoded(state)

    # When the operation is refused
    with pytest.raises((LeaseLost, JobNotFound, QueueNotFound, ConfigurationError)):
        _refusals()[name](state)

    # Then nothing changed, nothing is to be written, and nothing finished
    assert encoded(state) == before
    assert not state.dirty
    assert state.finished == []
    # And the indexes were not disturbed either: the next claim order is the same
    assert [j.id for j in state.claim("q", ["a", "b", "c"], "w", T0 + 40)] == ["j3"]


def test_retry_dead_of_an_unknown_id_raises_job_not_found_and_changes_nothing() -> None:
    # Given one dead letter
    state = fresh()
    put(state, "j1")
    claim_one(state, "t1", T0)
    state.nack("j1", "t1", T0, error="x", retry=False, jitter=0.0)
    before = encoded(state)

    # When it is retried together with an id that is no dead letter, Then nothing is retried
    with pytest.raises(JobNotFound, match=r"'q'.*\['nope'\]"):
        state.retry_dead("q", ["j1", "nope"], T0 + 1)

    assert encoded(state) == before
    assert [j.id for j in state.dead_letters("q")] == ["j1"]
    assert state.stats("q", T0 + 1).ready == 0


# --- claim cost ----------------------------------------------------------------------------


class CountingHeapq:
    """Stands in for ``heapq`` inside the state's index and counts heap operations."""

    def __init__(self) -> None:
        self.pushes = 0
        self.pops = 0

    def heappush(self, heap: list[Any], item: Any) -> None:
        self.pushes += 1
        heapq.heappush(heap, item)

    def heappop(self, heap: list[Any]) -> Any:
        self.pops += 1
        return heapq.heappop(heap)


class WatchedJobs(dict[str, Job]):
    """The state's job table, counting lookups and refusing to be scanned."""

    lookups = 0

    def __getitem__(self, key: str) -> Job:
        self.lookups += 1
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self.lookups += 1
        return super().get(key, default)

    def __iter__(self) -> NoReturn:
        raise AssertionError("claim iterated over every job")

    def keys(self) -> NoReturn:
        raise AssertionError("claim iterated over every job")

    def values(self) -> NoReturn:
        raise AssertionError("claim iterated over every job")

    def items(self) -> NoReturn:
        raise AssertionError("claim iterated over every job")


def _watch(state: QueueState, monkeypatch: pytest.MonkeyPatch) -> tuple[CountingHeapq, WatchedJobs]:
    counting = CountingHeapq()
    monkeypatch.setattr(indexed, "heapq", counting)  # the one module that touches the heaps
    watched = WatchedJobs(state.jobs)
    state.index.jobs = watched

    def no_state_at(self: Job, now: float) -> str:
        raise AssertionError("claim asked a job for its state: a scan")

    monkeypatch.setattr(Job, "state_at", no_state_at)
    return counting, watched


def test_only_the_index_touches_the_heaps() -> None:
    # The counts below patch one module: a heap operation anywhere else would go uncounted.
    modules = (backlog, leases, lifecycle, producing, reading, spilling, state_module)
    assert [module.__name__ for module in modules if hasattr(module, "heapq")] == []


def test_claiming_one_of_50000_ready_jobs_touches_a_few_entries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given 50,000 ready jobs, the best of them in the middle
    state = fresh()
    state.enqueue(
        [NewJob(f"j{i}", "q", "x", priority=-1 if i == 31_337 else 0) for i in range(50_000)],
        T0,
    )
    counting, watched = _watch(state, monkeypatch)

    # When one job is claimed
    [job] = state.claim("q", ["t1"], "w", T0)

    # Then it is the best one, found with a pop, a push and a lookup or two, and no scan
    assert job.id == "j31337"
    assert counting.pops <= 2 and counting.pushes <= 2 and watched.lookups <= 2


def test_claiming_past_50000_leased_jobs_does_not_look_at_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given 50,000 jobs in flight and one ready
    state = fresh()
    put(state, *(f"j{i}" for i in range(50_000)))
    assert len(state.claim("q", [f"t{i}" for i in range(50_000)], "w", T0)) == 50_000
    put(state, "last", now=T0 + 1)
    counting, watched = _watch(state, monkeypatch)

    [job] = state.claim("q", ["t"], "w", T0 + 2)

    assert job.id == "last"
    assert counting.pops <= 2 and counting.pushes <= 2 and watched.lookups <= 2


# --- idempotency ---------------------------------------------------------------------------


def test_idempotency_key_within_the_window_returns_the_same_job() -> None:
    state = fresh()
    [first] = put(state, "j1", key="order-7")

    # Within the window, even once the first job is done, the key answers with it
    [again] = put(state, "j2", key="order-7", now=T0 + 30)
    claim_one(state, "t1", T0 + 31)
    state.ack("j1", "t1", T0 + 32)
    [after_ack] = put(state, "j3", key="order-7", now=T0 + 59)

    assert first.id == again.id == after_ack.id == "j1"
    assert state.find("j2", T0 + 59) is None and state.find("j3", T0 + 59) is None
    assert state.stats("q", T0 + 59).ready == 0
    assert state.doc.seq == 1


def test_idempotency_key_after_the_window_makes_a_new_job() -> None:
    state = fresh()
    put(state, "j1", key="order-7")

    [late] = put(state, "j2", key="order-7", now=T0 + 60)
    [later] = put(state, "j3", key="order-7", now=T0 + 61)

    assert (late.id, later.id) == ("j2", "j2")
    assert state.stats("q", T0 + 61).ready == 2


def test_idempotency_keys_belong_to_one_queue() -> None:
    state = fresh()
    [a] = state.enqueue([NewJob("j1", "q", "x", key="k")], T0)
    [b] = state.enqueue([NewJob("j2", "other", "x", key="k")], T0)
    assert (a.id, b.id) == ("j1", "j2")


def test_a_reused_key_in_one_batch_makes_one_job() -> None:
    state = fresh()
    jobs = put(state, "j1", "j2", key="k")
    assert [job.id for job in jobs] == ["j1", "j1"]
    assert state.stats("q", T0).ready == 1


# --- retries and dead letters --------------------------------------------------------------


def test_nack_retries_after_the_backoff_then_dead_letters_after_max_attempts() -> None:
    state = fresh()
    put(state, "j1")
    now = T0
    for attempt in (1, 2):
        job = claim_one(state, f"t{attempt}", now)
        assert job.attempts == attempt
        assert state.nack("j1", f"t{attempt}", now, error="boom", retry=True, jitter=0.5) == "retry"
        # Equal jitter: half of base * 2**(attempt-1) is fixed, half drawn
        wait = retry_delay(attempt, 2.0, 10.0, 0.5)
        assert wait == {1: 1.5, 2: 3.0}[attempt]
        found = state.find("j1", now)
        assert found is not None
        assert (found[0], found[1].visible_at) == ("delayed", now + wait)
        assert state.claim("q", ["early"], "w", now + wait - 0.001) == []
        now += wait

    claim_one(state, "t3", now)
    assert state.nack("j1", "t3", now, error="boom", retry=True, jitter=0.5) == "dead"

    [dead] = state.dead_letters("q")
    assert (dead.id, dead.attempts, dead.error, dead.finished_at) == ("j1", 3, "boom", now)
    assert [(f.outcome, f.job.id) for f in state.finished] == [("dead", "j1")]
    assert state.stats("q", now).dead == 1


def test_retry_delay_is_capped() -> None:
    assert retry_delay(1, 2.0, 10.0, 0.0) == 1.0
    assert retry_delay(3, 2.0, 10.0, 0.0) == 4.0
    assert retry_delay(10, 2.0, 10.0, 0.0) == 5.0
    assert retry_delay(10, 2.0, 10.0, 0.999) == pytest.approx(9.995)


def test_repeated_lease_expiry_dead_letters_on_the_last_attempt() -> None:
    # Given a job whose worker dies three times (max_attempts=3, lease 30 s)
    state = fresh()
    put(state, "j1")
    claim_one(state, "t1", T0)
    claim_one(state, "t2", T0 + 30)  # the first lease expired: attempts 1 kept, 2 counted
    claim_one(state, "t3", T0 + 60)
    assert state.stats("q", T0 + 60).in_flight == 1

    # When the last lease runs out
    assert state.expire(T0 + 90) == 1

    # Then the job is a dead letter that says why
    [dead] = state.dead_letters("q")
    assert dead.attempts == 3
    assert dead.error == "lease expired on attempt 3, the last"
    assert state.claim("q", ["t4"], "w", T0 + 91) == []
    with pytest.raises(LeaseLost):
        state.ack("j1", "t3", T0 + 91)


def test_dead_letters_are_dropped_after_their_retention() -> None:
    state = fresh()
    put(state, "old", "young")
    for job_id, now in (("old", T0), ("young", T0 + 50)):
        claim_one(state, "t-" + job_id, now)
        state.nack(job_id, "t-" + job_id, now, error="x", retry=False, jitter=0.0)

    state.expire(T0 + 99)
    assert [job.id for job in state.dead_letters("q")] == ["old", "young"]
    state.expire(T0 + 100)
    assert [job.id for job in state.dead_letters("q")] == ["young"]
    state.expire(T0 + 150)
    assert state.dead_letters("q") == []


def test_retry_dead_puts_dead_letters_at_the_back_with_fresh_attempts() -> None:
    state = fresh()
    put(state, "j1", "j2")
    claim_one(state, "t1", T0)
    state.nack("j1", "t1", T0, error="x", retry=False, jitter=0.0)

    assert state.retry_dead("q", ["j1", "j1"], T0 + 1) == ["j1"]

    assert state.dead_letters("q") == []
    [first, second] = state.claim("q", ["a", "b"], "w", T0 + 1)
    assert (first.id, second.id) == ("j2", "j1")
    assert second.attempts == 1


def test_release_does_not_count_an_attempt_and_puts_the_job_back_in_front() -> None:
    state = fresh()
    put(state, "j1", "j2", "j3")
    assert claim_one(state, "t1", T0).attempts == 1

    assert state.release([("j1", "t1")], T0 + 1) == [True]

    found = state.find("j1", T0 + 1)
    assert found is not None
    assert (found[0], found[1].attempts) == ("ready", 0)
    again = claim_one(state, "t2", T0 + 2)
    assert (again.id, again.attempts) == ("j1", 1)
    assert state.release([("j1", "t1")], T0 + 3) == [False]


# --- the stored form -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "found"),
    [
        (b"\x00\x01 not json at all", "not a JSON object"),
        (b"", "0 bytes that are not a JSON object"),
        (b"[1, 2, 3]", "not a JSON object"),
        (b'{"format": 99, "jobs": []}', "found format 99"),
        (b'{"format": 99, "jobs": {"a": "future layout"}}', "found format 99"),
        (b'{"format": 1, "jobs": "nope"}', "invalid fields"),
    ],
)
def test_decode_state_refuses_what_it_cannot_read(data: bytes, found: str) -> None:
    where = "state s3://bucket/ns/state.json"
    with pytest.raises(StateCorrupt) as caught:
        decode_state(data, where)
    message = str(caught.value)
    assert message.startswith(where + ": expected an objq state of format 1")
    assert found in message


def test_decode_state_says_which_field_is_invalid() -> None:
    with pytest.raises(StateCorrupt, match=r"\$\.jobs"):
        decode_state(b'{"format": 1, "jobs": "nope"}', "here")


def test_non_utf8_payload_round_trips_through_base64() -> None:
    payload = b"\xff\xfe\x00\x80 binary"
    body, b64 = encode_payload(payload)
    assert b64
    state = fresh()
    state.enqueue([NewJob("bin", "q", body, b64=b64), NewJob("txt", "q", "h\u00e9llo")], T0)

    decoded = roundtrip(state)

    [binary, text] = decoded.claim("q", ["t1", "t2"], "w", T0)
    assert binary.payload == payload
    assert text.payload == "h\u00e9llo".encode()
    stored = json.loads(encoded(state))
    assert [(job["id"], job.get("b64", False)) for job in stored["jobs"]] == [
        ("bin", True),
        ("txt", False),
    ]
    assert stored["jobs"][1]["body"] == "h\u00e9llo"


def test_text_payload_stays_readable() -> None:
    assert encode_payload("caf\u00e9".encode()) == ("caf\u00e9", False)


@pytest.mark.parametrize("name", ["", "a/b", "/", "x" * 256, "tab\there", "line\nbreak", None, 7])
def test_bad_queue_names_raise_configuration_error(name: object) -> None:
    with pytest.raises(ConfigurationError, match="queue name"):
        check_queue_name(name)


# Only text: the transitions are typed to take it, and the compiled build (setup.py) refuses
# anything else where they are called, as a TypeError. What a user gives is checked before it
# reaches them (tests/api/test_queue.py: test_bad_arguments_are_refused_clearly).
@pytest.mark.parametrize("name", ["", "a/b", "/", "x" * 256, "tab\there", "line\nbreak"])
def test_a_bad_queue_name_changes_nothing_in_the_state(name: str) -> None:
    state = fresh()
    before = encoded(state)
    with pytest.raises(ConfigurationError, match=r"without '/'"):
        state.declare(name, CONFIG)
    with pytest.raises(ConfigurationError):
        state.enqueue([NewJob("ok", "q", "x"), NewJob("bad", name, "x")], T0)
    assert encoded(state) == before


def test_a_long_queue_name_is_accepted() -> None:
    assert check_queue_name("x" * 255) == "x" * 255


# --- bugs found while writing these tests: they fail until state.py / records.py are fixed ---


def test_two_heartbeats_at_one_instant_then_expiry_on_the_last_attempt() -> None:
    # Given a job on its last attempt, heartbeated twice at one ``now`` (the engine runs a
    # whole batch at one clock reading, so two extends of one delivery share it)
    state = fresh()
    put(state, "j1", max_attempts=1)
    claim_one(state, "t1", T0)
    assert state.heartbeat([("j1", "t1"), ("j1", "t1")], T0 + 5) == [True, True]

    # When the lease runs out and expiry dead-letters the job
    assert state.expire(T0 + 35) == 1
    assert [job.id for job in state.dead_letters("q")] == ["j1"]

    # Then the dead letter is not also ready to be claimed (it was: KeyError in claim)
    put(state, "j2", now=T0 + 36)
    assert [job.id for job in state.claim("q", ["t2", "t3"], "w", T0 + 36)] == ["j2"]


def test_one_heartbeat_at_the_claim_instant_then_expiry_on_the_last_attempt() -> None:
    # Given a job on its last attempt, heartbeated at the instant it was claimed (so the
    # heartbeat's timed entry equals the claim's), When a claim notices the lease ran out
    state = fresh()
    put(state, "j1", max_attempts=1)
    claim_one(state, "t1", T0)
    assert state.heartbeat([("j1", "t1")], T0) == [True]

    # Then the job is dead, not claimed (it was: KeyError in claim)
    assert state.claim("q", ["t2"], "w", T0 + 30) == []

    assert state.stats("q", T0 + 30).dead == 1


def test_duplicate_ids_in_one_enqueue_batch_are_refused() -> None:
    state = fresh()
    before = encoded(state)

    # When one batch carries two different jobs under one id
    with pytest.raises(ConfigurationError, match="dup"):
        state.enqueue([NewJob("dup", "q", "first"), NewJob("dup", "q", "second")], T0)

    # Then neither is silently dropped: the batch is refused as a whole
    assert encoded(state) == before


def test_a_json_object_that_is_not_a_state_is_refused() -> None:
    # Any JSON object decodes as an empty state today ("format" defaults to 1), so a foreign
    # object at the state key would be taken for an empty namespace and overwritten.
    with pytest.raises(StateCorrupt, match="format None"):
        decode_state(b'{"hello": "world"}', "state memory://x/state.json")


def test_the_stored_state_names_its_format() -> None:
    # StateDoc has omit_defaults=True, so format 1 (the default) is never written: the stored
    # document cannot be told apart from any other JSON object, nor from a future format.
    state = fresh()
    put(state, "j1")
    assert json.loads(encoded(state)).get("format") == 1
