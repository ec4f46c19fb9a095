"""Operations: everything the API asks of a namespace's state, as plain data.

An operation is a frozen msgspec struct holding already-checked values; :meth:`Op.apply` runs it
against a :class:`~objq_broker.model.state.QueueState` at a given time and returns a value that
msgspec can encode. Because operations are data, not closures, they can be batched by the local
commit loop, or encoded and sent to another process that commits for many (the elected broker),
and a replay after an ambiguous write is identical: ids, tokens and jitter are fields, made by
the caller.

Three class flags tell the committer how fresh the state must be:

* ``fresh``: no older than the staleness bound (claims: a stale cache would miss new jobs);
* ``latest``: exactly as stored now (inspection);
* ``consumer``: the caller consumes, so the committer also expires stale leases when idle.

Three more say what else an operation is, so that no list of operations is kept beside them:
``sent`` (a broker client may send it; :data:`ANY_OP`, the union a :class:`Session` is
decoded with, is built from the classes that may), ``shrinks`` (it never makes the state
larger) and ``produces`` (it brings new things into the state), which tell the engine what to
refuse when a state grows too large to store. The runs of the backlog an operation reads are
its :meth:`~Op.runs_needed`.

Build operations with the functions of :mod:`objq_broker.builders`, which check every value.

The operations live in modules by what they do, on the bases in ``base``: ``queues`` (queues
and their dead letters), ``jobs`` (producing and consuming), ``reading`` (inspection and the
write budget), and ``session`` (the broker record, a broker client's request, and the runs a
batch needs read). Import them from here. A class declared in one of these modules is an
operation of the union with no other change.
"""

from __future__ import annotations

from objq_broker.model.checks import Held
from objq_broker.model.ops.base import Op, Read, Refused, T
from objq_broker.model.ops.jobs import (
    Ack,
    Claim,
    Enqueue,
    EnqueueRuns,
    EnqueueStaged,
    Expire,
    Heartbeat,
    Nack,
    NoteOutcome,
    Nothing,
    Release,
)
from objq_broker.model.ops.queues import (
    Configure,
    Declare,
    DeleteQueue,
    Purge,
    PurgeDead,
    RetryDead,
)
from objq_broker.model.ops.reading import (
    DeadLetters,
    FindJob,
    GetConfig,
    ListJobs,
    QueueNames,
    SetWriteBudget,
    Stats,
    Workers,
    WriteBudget,
)
from objq_broker.model.ops.session import (
    ANY_OP,
    Outcomes,
    ResignBroker,
    Session,
    TakeBroker,
    runs_needed,
)

__all__ = [
    "ANY_OP",
    "Ack",
    "Claim",
    "Configure",
    "DeadLetters",
    "Declare",
    "DeleteQueue",
    "Enqueue",
    "EnqueueRuns",
    "EnqueueStaged",
    "Expire",
    "FindJob",
    "GetConfig",
    "Heartbeat",
    "Held",
    "ListJobs",
    "Nack",
    "NoteOutcome",
    "Nothing",
    "Op",
    "Outcomes",
    "Purge",
    "PurgeDead",
    "QueueNames",
    "Read",
    "Refused",
    "Release",
    "ResignBroker",
    "RetryDead",
    "Session",
    "SetWriteBudget",
    "Stats",
    "T",
    "TakeBroker",
    "Workers",
    "WriteBudget",
    "runs_needed",
]
