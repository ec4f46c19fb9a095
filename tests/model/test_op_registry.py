"""Every operation is declared once, by its class: the union a broker decodes sessions with is
built from the classes, and a session of every kind of operation survives the wire."""

from __future__ import annotations

import importlib
import pkgutil
import typing
from typing import Any

import msgspec
import pytest

from objq_broker.broker import wire
from objq_broker.errors import RequestRefused
from objq_broker.model import ops
from objq_broker.model.records import BrokerRecord, QueueConfig
from objq_broker.model.values import NewJob, StagedBodies, StagedRun

#: The operations a broker client may not send: its request itself, the broker record's, and
#: the stand-in for an operation the engine refused.
NEVER_SENT: set[type[ops.Op[Any]]] = {ops.Session, ops.TakeBroker, ops.ResignBroker, ops.Refused}

#: One operation of each kind a broker client may send, every field set where it has one.
EXAMPLES: list[ops.Op[Any]] = [
    ops.Declare("q", QueueConfig(max_attempts=3, expires_seconds=60.0)),
    ops.Configure("q", {"max_attempts": 4, "expires_seconds": None}),
    ops.Purge("q"),
    ops.DeleteQueue("q"),
    ops.Enqueue([NewJob(id="j1", queue="q", body="aGk=", b64=True, key="k1")], to_declared=True),
    ops.EnqueueStaged(
        "q",
        [StagedBodies("staging/w1/one.json", 2, priorities=(1, 2), delays=(0.0, 5.0))],
        ["j2", "j3"],
        "w1",
        priority=1,
        delay_seconds=2.0,
        max_attempts=3,
    ),
    ops.EnqueueRuns(
        "q",
        [StagedRun("staging/w2/run.json", "staging/w2/b.json", "ready", 1, (0, 0), (0, 0), 0.0)],
        "w2",
    ),
    ops.Claim(["q", "r"], ["t1", "t2"], "host:1", 30.0, strict=True),
    ops.Heartbeat([("j1", "t1")], 30.0),
    ops.Ack("j1", "t1", "failed", "boom"),
    ops.NoteOutcome("j1", "q", "t1", "retried", "again"),
    ops.Nack("j1", "t1", "boom", retry=False, jitter=0.5, delay_seconds=3.0),
    ops.Release([("j1", "t1")]),
    ops.Expire(),
    ops.Nothing(),
    ops.RetryDead("q", ["j1"]),
    ops.PurgeDead("q"),
    ops.QueueNames(),
    ops.GetConfig("q"),
    ops.Stats(["q", "r"]),
    ops.FindJob("j1"),
    ops.ListJobs("q", "dead", 10),
    ops.DeadLetters("q"),
    ops.SetWriteBudget(2.5),
    ops.WriteBudget(),
    ops.Workers(),
]


def declared_operations() -> set[type[ops.Op[Any]]]:
    """Every concrete operation class of every module of :mod:`objq_broker.model.ops`, found
    by walking the package, not from the register the union is built from."""
    found: set[type[ops.Op[Any]]] = set()
    for info in pkgutil.iter_modules(ops.__path__):
        module = importlib.import_module(f"{ops.__name__}.{info.name}")
        for klass in vars(module).values():
            if not (isinstance(klass, type) and issubclass(klass, ops.Op)):
                continue
            generic = getattr(klass, "__parameters__", ())  # in its result: a base, as Read
            if klass.__module__ == module.__name__ and not generic:
                found.add(klass)
    return found


def test_every_operation_but_those_never_sent_is_in_the_union_once_by_name() -> None:
    members = typing.get_args(ops.ANY_OP)
    declared = declared_operations()

    assert NEVER_SENT.issubset(declared)
    missing = sorted(klass.__name__ for klass in declared - NEVER_SENT - set(members))
    assert not missing, f"operations missing from ANY_OP: {missing}"
    assert set(members) == declared - NEVER_SENT
    assert [klass.__name__ for klass in members] == sorted(klass.__name__ for klass in members)
    for klass in members:
        assert klass.sent and wire.result_type(klass) is not None
    for klass in NEVER_SENT:
        assert not klass.sent


def test_no_operation_both_produces_and_shrinks() -> None:
    for klass in declared_operations():
        assert not (klass.produces and klass.shrinks), klass.__name__


def test_a_session_of_every_kind_of_operation_round_trips_on_the_wire() -> None:
    assert {type(op) for op in EXAMPLES} == set(typing.get_args(ops.ANY_OP)), (
        "add an example of each operation a client may send"
    )
    session = ops.Session("client-1", 7, EXAMPLES)

    decoded = wire.decode_request(wire.encode_request(session))

    assert decoded == session
    assert [type(op) for op in decoded.ops] == [type(op) for op in EXAMPLES]


@pytest.mark.parametrize(
    "op",
    [ops.TakeBroker(BrokerRecord("b1", "tcp://127.0.0.1:1", 1, 0.0), None), ops.ResignBroker(1)],
    ids=lambda op: type(op).__name__,
)
def test_a_session_holding_an_operation_never_sent_is_refused(op: ops.Op[Any]) -> None:
    sent = msgspec.json.encode(ops.Session("client-1", 1, [op]))
    with pytest.raises(RequestRefused, match=type(op).__name__):
        wire.decode_request(sent)
