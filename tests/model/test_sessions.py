"""A broker client's numbered sessions: a session sent again is answered, not applied twice;
and the broker record changes hands only from the holder that was seen."""

from __future__ import annotations

import pytest

from objq_broker.errors import BrokerTaken, LeaseLost
from objq_broker.model.ops import (
    Ack,
    Claim,
    Enqueue,
    Nothing,
    ResignBroker,
    Session,
    Stats,
    TakeBroker,
)
from objq_broker.model.records import BrokerRecord
from objq_broker.model.state import QueueState, session_key
from objq_broker.model.values import NewJob

NOW = 1000.0


def enqueue(*ids: str) -> Enqueue:
    return Enqueue([NewJob(id=i, queue="q", body=i) for i in ids])


def test_a_session_sent_again_is_answered_from_the_state_not_applied_again() -> None:
    state = QueueState()
    first = Session("c1", 1, [enqueue("a", "b"), Claim(["q"], ["t1"], "w")])
    outcomes = first.apply(state, NOW)
    assert [job.id for job in outcomes[0][1]] == ["a", "b"]
    assert [job.id for job in outcomes[1][1]] == ["a"]

    again = first.apply(state, NOW + 1)  # its broker died before answering: sent again
    assert [job.id for job in again[0][1]] == ["a", "b"]
    assert [job.id for job in again[1][1]] == ["a"]  # the same lease, not a second job
    [stats] = Stats(["q"]).apply(state, NOW + 1)
    assert (stats.ready, stats.in_flight) == (1, 1)


def test_an_ack_sent_again_after_it_landed_is_not_a_lost_lease() -> None:
    state = QueueState()
    Session("c1", 1, [enqueue("a")]).apply(state, NOW)
    [(_, [job])] = Session("c1", 2, [Claim(["q"], ["t1"], "w")]).apply(state, NOW)
    ack = Session("c1", 3, [Ack(job.id, "t1")])
    assert ack.apply(state, NOW)[0][0] is True
    [(ok, replayed)] = ack.apply(state, NOW)
    assert ok and replayed.id == "a"
    with pytest.raises(LeaseLost):  # whereas a new ack of the same lease is refused
        Ack(job.id, "t1").apply(state, NOW)


def test_a_session_that_changed_nothing_leaves_no_mark_and_runs_again() -> None:
    state = QueueState()
    empty = Session("c1", 1, [Claim(["q"], ["t1"], "w")])
    assert empty.apply(state, NOW) == [(True, [])]
    assert not state.dirty and "c1" not in state.doc.sessions
    Session("c2", 1, [enqueue("a")]).apply(state, NOW)
    [(ok, found)] = empty.apply(state, NOW)  # nothing was applied the first time: apply now
    assert ok and [job.id for job in found] == ["a"]


def test_errors_refuse_one_operation_of_a_session_not_the_others() -> None:
    state = QueueState()
    outcomes = Session("c1", 1, [Ack("missing", "t"), enqueue("a"), Nothing()]).apply(state, NOW)
    assert outcomes[0][0] is False and isinstance(outcomes[0][1], LeaseLost)
    assert outcomes[1][0] is True and outcomes[2] == (True, None)


def test_old_sessions_are_forgotten() -> None:
    state = QueueState()
    Session("old", 1, [enqueue("a")]).apply(state, NOW)
    Session("new", 1, [enqueue("b")]).apply(state, NOW + 2 * 3600)
    assert set(state.doc.sessions) == {session_key("new")}


def test_only_one_of_two_candidates_that_saw_the_same_broker_takes_over() -> None:
    state = QueueState()
    first = TakeBroker(BrokerRecord("a", "127.0.0.1:1", 0, 0.0), None).apply(state, NOW)
    assert (first.epoch, first.since) == (1, NOW)
    won = TakeBroker(BrokerRecord("b", "127.0.0.1:2", 0, 0.0), 1).apply(state, NOW)
    assert won.epoch == 2 and state.doc.epoch == 2
    with pytest.raises(
        BrokerTaken, match=r"epoch 1 was found gone; now it is epoch 2, at 127\.0\.0\.1:2"
    ):
        TakeBroker(BrokerRecord("c", "127.0.0.1:3", 0, 0.0), 1).apply(state, NOW)
    # Processes that start together: the loser found no broker, none was gone
    with pytest.raises(BrokerTaken, match=r"^there was none when this process looked; now"):
        TakeBroker(BrokerRecord("d", "127.0.0.1:4", 0, 0.0), None).apply(state, NOW)
    assert state.doc.broker == won
    assert ResignBroker(1).apply(state, NOW) is False  # not the holder: nothing changes
    assert ResignBroker(2).apply(state, NOW) is True
    after = state.doc
    assert after.broker is None and after.epoch == 2  # epochs never go back
