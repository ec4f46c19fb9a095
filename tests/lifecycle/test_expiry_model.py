"""Queue expiry in the pure model: kombu's ``x-expires`` semantics, with fixed times."""

from __future__ import annotations

import msgspec
import pytest

from objq_broker.errors import ConfigurationError, QueueNotFound
from objq_broker.model.encoding import decode_state, encode_state
from objq_broker.model.lifecycle import TOUCH_FRACTION
from objq_broker.model.ops import (
    Claim,
    Configure,
    Declare,
    Enqueue,
    Heartbeat,
    ResignBroker,
    TakeBroker,
)
from objq_broker.model.records import BrokerRecord, QueueConfig, StateDoc
from objq_broker.model.state import QueueState
from objq_broker.model.values import NewJob

T0 = 1_000.0
EXPIRES = 10.0


def declared(expires: float | None = EXPIRES, queue: str = "events") -> QueueState:
    state = QueueState()
    Declare(queue, QueueConfig(expires_seconds=expires)).apply(state, T0)
    return state


def put(state: QueueState, job_id: str, now: float, queue: str = "events") -> None:
    Enqueue([NewJob(id=job_id, queue=queue, body="event")]).apply(state, now)


def claim(state: QueueState, now: float, queue: str = "events", n: int = 1) -> list[str]:
    tokens = [f"t{now}.{i}" for i in range(n)]
    return [job.id for job in Claim([queue], tokens, "consumer").apply(state, now)]


def test_an_idle_queue_is_deleted_with_its_jobs_after_its_expiry() -> None:
    state = declared()
    put(state, "a", T0 + 1)
    put(state, "b", T0 + 2)

    state.expire(T0 + EXPIRES - 0.001)
    assert state.queue_names() == ["events"]

    state.expire(T0 + EXPIRES)
    assert state.queue_names() == []
    assert state.jobs == {}
    assert state.removed_queues == ["events"]  # the engine unbinds it once committed
    assert "events" not in state.to_doc().used


def test_enqueues_do_not_keep_a_queue_alive() -> None:
    # Given a queue nobody consumes, fed an event every second (a killed receiver's queue)
    state = declared()
    for second in range(1, int(EXPIRES)):
        put(state, f"e{second}", T0 + second)
        state.expire(T0 + second)
    # Then it goes at its expiry all the same, with what it gathered
    state.expire(T0 + EXPIRES)
    assert state.queue_names() == []
    assert state.jobs == {}


def test_a_live_consumer_that_polls_keeps_its_idle_queue() -> None:
    state = declared()
    now = T0
    writes = 0
    while now < T0 + 10 * EXPIRES:
        now += 0.4  # kombu's idle polling interval
        state.dirty = False
        assert claim(state, now) == []
        writes += state.dirty
        state.expire(now)
        assert state.queue_names() == ["events"]
    # An empty poll writes only when the mark is half an expiry old: about 2 per expiry.
    assert writes <= 10 / TOUCH_FRACTION + 1


def test_a_consumer_that_stops_polling_loses_its_queue_one_expiry_after_its_last_claim() -> None:
    state = declared()
    claim(state, T0 + 3)  # under half an expiry since the declare: no new mark
    claim(state, T0 + 6)  # half an expiry: marked
    state.expire(T0 + 6 + EXPIRES - 0.001)
    assert state.queue_names() == ["events"]
    state.expire(T0 + 6 + EXPIRES)
    assert state.queue_names() == []


def test_declaring_again_and_heartbeats_count_as_use() -> None:
    state = declared()
    Declare("events", QueueConfig(expires_seconds=EXPIRES)).apply(state, T0 + 8)
    state.expire(T0 + EXPIRES + 1)
    assert state.queue_names() == ["events"]

    put(state, "long", T0 + 9)
    [job] = Claim(["events"], ["tok"], "worker").apply(state, T0 + 9)
    # A long task: its holder only heartbeats, for three expiries
    for beat in range(1, 31):
        Heartbeat([(job.id, "tok")], 60.0).apply(state, T0 + 9 + beat)
        state.expire(T0 + 9 + beat)
    assert state.queue_names() == ["events"]
    assert state.holds([(job.id, "tok")]) == [True]


def test_in_flight_jobs_do_not_keep_a_queue_whose_holder_died() -> None:
    # A killed consumer's leases would last its visibility timeout; the queue goes at expiry.
    state = declared()
    put(state, "held", T0)
    claim(state, T0)
    state.expire(T0 + EXPIRES)
    assert state.queue_names() == []


def test_a_queue_without_expiry_never_expires() -> None:
    state = declared(expires=None)
    put(state, "a", T0)
    state.expire(T0 + 10**9)
    assert state.queue_names() == ["events"]
    assert len(state.jobs) == 1
    assert state.to_doc().used == {}


def test_only_the_idle_queue_goes() -> None:
    state = declared()
    Declare("tasks", None).apply(state, T0)
    Declare("replies", QueueConfig(expires_seconds=EXPIRES)).apply(state, T0)
    for step in range(1, 30):
        claim(state, T0 + step, queue="replies")
        state.expire(T0 + step)
    assert state.queue_names() == ["replies", "tasks"]


def test_configure_turns_expiry_on_from_now_and_off() -> None:
    state = declared(expires=None)
    Configure("events", {"expires_seconds": EXPIRES}).apply(state, T0 + 100)
    state.expire(T0 + 100 + EXPIRES - 1)
    assert state.queue_names() == ["events"]
    Configure("events", {"expires_seconds": None}).apply(state, T0 + 101)
    state.expire(T0 + 10**6)
    assert state.queue_names() == ["events"]


def test_expiry_must_be_positive() -> None:
    with pytest.raises(ConfigurationError, match="expires_seconds"):
        Declare("events", QueueConfig(expires_seconds=0)).apply(QueueState(), T0)


def test_the_use_mark_survives_encoding_and_an_old_state_still_decodes() -> None:
    state = declared()
    claim(state, T0 + 6)
    again = QueueState(decode_state(encode_state(state.to_doc()), "test"))
    assert again.doc.used == {"events": T0 + 6}
    again.expire(T0 + 6 + EXPIRES)
    assert again.queue_names() == []

    # A state written before expiry existed: no "used", no "expires_seconds" in its queues.
    old = msgspec.json.encode(
        {
            "format": 1,
            "version": 3,
            "queues": {"q": {"max_attempts": 5, "lease_seconds": 60.0}},
        }
    )
    doc = decode_state(old, "old state")
    assert doc.used == {}
    assert doc.queues["q"].expires_seconds is None
    assert b'"used"' not in encode_state(StateDoc(format=1))  # omitted while empty


def test_a_routed_enqueue_does_not_bring_a_removed_queue_back() -> None:
    state = declared()
    state.expire(T0 + EXPIRES)
    routed = Enqueue([NewJob(id="late", queue="events", body="event")], to_declared=True)
    assert routed.apply(state, T0 + EXPIRES + 1) == []
    assert state.queue_names() == []
    # Sent by name, a message declares its queue by first use, as before.
    assert len(Enqueue([NewJob(id="by-name", queue="events", body="x")]).apply(state, T0)) == 1
    assert state.queue_names() == ["events"]


def test_a_strict_claim_names_the_unknown_queue_and_the_known_ones() -> None:
    state = declared(expires=None, queue="emails")
    strict = Claim(["emials"], ["t"], "w", strict=True)
    with pytest.raises(QueueNotFound) as caught:
        strict.apply(state, T0)
    message = str(caught.value)
    assert "'emials' is not declared" in message
    assert "['emails']" in message
    assert "objq declare emials" in message
    assert "\n" not in message
    # Without strict (what older clients send), an unknown queue just has nothing.
    assert Claim(["emials"], ["t"], "w").apply(state, T0) == []


def test_the_only_writer_keeps_marks_in_memory_and_gives_a_full_expiry_after_taking_over() -> None:
    # A state as stored by a broker that died: the queue's mark is old
    stored = declared()
    doc = decode_state(encode_state(stored.to_doc()), "stored")
    # When a new broker takes it over long after
    state = QueueState(doc)
    state.hold_marks(T0 + 100)
    state.expire(T0 + 100)
    assert state.queue_names() == ["events"]  # a full expiry from the takeover
    # Polls keep it without making the state worth a write of its own
    for step in range(1, 40):
        state.dirty = False
        claim(state, T0 + 100 + step * 0.5)
        assert not state.dirty
        state.expire(T0 + 100 + step * 0.5)
    assert state.queue_names() == ["events"]
    # And once the polls stop, it goes an expiry after the last one
    last = T0 + 100 + 39 * 0.5
    state.expire(last + EXPIRES)
    assert state.queue_names() == []
    assert state.dirty


def test_with_a_broker_in_office_only_the_broker_expires_queues() -> None:
    # A state a broker wrote: its marks of use were as old as that commit
    state = declared()
    TakeBroker(BrokerRecord("b1", "tcp://127.0.0.1:1", epoch=0, since=T0), after=None).apply(
        state, T0
    )
    stored = encode_state(state.to_doc())
    # When a process that could not reach the broker commits around it, long after
    direct = QueueState(decode_state(stored, "stored"))
    assert direct.expire(T0 + 10 * EXPIRES) == 0
    # Then the queue stays: its consumers may be waiting at the broker, which holds newer marks
    assert direct.queue_names() == ["events"]
    # While the broker itself expires it once unused for its expiry
    broker = QueueState(decode_state(stored, "stored"))
    broker.hold_marks(T0 + 10 * EXPIRES)
    broker.expire(T0 + 10 * EXPIRES + EXPIRES / 2)
    assert broker.queue_names() == ["events"]
    broker.expire(T0 + 11 * EXPIRES)
    assert broker.queue_names() == []
    # And once the broker resigned, any writer expires it
    epoch = direct.doc.epoch
    assert ResignBroker(epoch).apply(direct, T0 + 10 * EXPIRES)
    direct.expire(T0 + 10 * EXPIRES)
    assert direct.queue_names() == []
