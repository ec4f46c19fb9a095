"""Building operations from what a caller passed: the one place where API arguments are
checked, shared by :class:`~objq_broker.queue.Queue` and :class:`~objq_broker.aio.AsyncQueue`
so the two cannot drift. Each builder returns one operation of :mod:`objq_broker.model.ops`.

Every builder checks types and ranges (with msgspec's constraints, see
:mod:`objq_broker.model.checks`) and raises :class:`~objq_broker.errors.ConfigurationError`
naming the argument before anything is submitted; it also makes the ids, lease tokens and
jitter, so the operation replays identically after an ambiguous write.
"""

from __future__ import annotations

import functools
import os
import random
import socket
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Annotated, Any, Literal, TypedDict, TypeVar, Unpack

import msgspec

from objq_broker.errors import ConfigurationError, storable_text
from objq_broker.model.checks import (
    MAX_ITEMS,
    Attempts,
    ClaimCount,
    Identifier,
    Place,
    PositiveSeconds,
    Priority,
    QueueName,
    Seconds,
    SignedSeconds,
    Where,
    WriteRate,
    checked,
    cut_text,
    narrowed,
    plain_identifier,
    shown,
)
from objq_broker.model.ids import new_id
from objq_broker.model.ops import (
    Ack,
    Claim,
    Configure,
    Declare,
    DeleteQueue,
    Enqueue,
    EnqueueRuns,
    EnqueueStaged,
    FindJob,
    Heartbeat,
    ListJobs,
    Nack,
    NoteOutcome,
    Purge,
    PurgeDead,
    Release,
    RetryDead,
    SetWriteBudget,
    Stats,
)
from objq_broker.model.records import Job, JobState, QueueConfig, RunOutcome, encode_payload
from objq_broker.model.values import NewJob, StagedBodies, StagedRun, settings_of

__all__ = ["Delay", "Delivery", "Enqueue", "JobOptions", "StagedBodies", "StagedRun"]

R = TypeVar("R")

#: A span of time as callers give it: seconds, a timedelta, or nothing.
Delay = float | int | timedelta | None

_rng = random.Random()


@dataclass(frozen=True, slots=True)
class Delivery:
    """A claimed job and the lease token that proves this holder may ack or nack it."""

    job: Job
    token: str

    @property
    def id(self) -> str:
        return self.job.id

    @property
    def payload(self) -> bytes:
        return self.job.payload

    @property
    def held(self) -> tuple[str, str]:
        return (self.job.id, self.token)


def deliveries(jobs: Iterable[Job]) -> list[Delivery]:
    """The deliveries of claimed jobs (each carries its lease token)."""
    return [Delivery(job, job.lease.token) for job in jobs if job.lease is not None]


def default_owner(framework: str | None = None) -> str:
    """``host:pid``, or ``host:pid:framework``: what ``objq workers`` shows a holder by."""
    base = f"{socket.gethostname()}:{os.getpid()}"
    return base if framework is None else f"{base}:{framework}"


def seconds(value: Delay, what: Place) -> float | None:
    """Seconds from a number or a timedelta (None stays None); bools and text are refused."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise ConfigurationError(f"{what}: expected seconds or a timedelta, found {shown(value)}")


# --- the argument bags, each checked in one conversion ---------------------------------------


class _EnqueueArgs(msgspec.Struct, frozen=True):
    queue: QueueName
    priority: Priority = 0
    delay: SignedSeconds = 0.0
    max_attempts: Attempts | None = None
    group: Identifier | None = None


class _Key(msgspec.Struct, frozen=True):
    key: Identifier | None


class _ClaimArgs(msgspec.Struct, frozen=True):
    queues: list[QueueName]
    n: ClaimCount
    owner: Identifier
    lease: PositiveSeconds | None = None


class _NackArgs(msgspec.Struct, frozen=True):
    error: str | None = None
    retry: bool = True
    delay: Seconds | None = None


class _AckArgs(msgspec.Struct, frozen=True):
    outcome: Literal["done"] | RunOutcome = "done"
    error: str | None = None


_ACK_DONE = _AckArgs()


class _NoteArgs(msgspec.Struct, frozen=True):
    job_id: Identifier
    queue: QueueName
    token: Identifier
    outcome: RunOutcome
    error: str | None = None


class _LeaseArg(msgspec.Struct, frozen=True):
    lease: PositiveSeconds | None = None


class _Names(msgspec.Struct, frozen=True):
    queue: QueueName


class _Ids(msgspec.Struct, frozen=True):
    ids: Annotated[list[Identifier], msgspec.Meta(max_length=MAX_ITEMS)] | None = None


class _JobId(msgspec.Struct, frozen=True):
    job_id: Identifier


class _Held(msgspec.Struct, frozen=True):
    job_id: Identifier
    token: Identifier


class _ListArgs(msgspec.Struct, frozen=True):
    queue: QueueName
    state: JobState | None = None
    limit: Annotated[int, msgspec.Meta(ge=0)] | None = None


def queue_name(queue: object, what: str = "queue") -> str:
    """``queue`` if it is a valid queue name, else :class:`ConfigurationError`."""
    return checked({"queue": queue}, _Names, what).queue


# --- queues ----------------------------------------------------------------------------------


def declare(queue: str, config: Mapping[str, Any]) -> Declare:
    where = f"declare {shown(queue, 80)}"
    name = queue_name(queue, where)
    settings = settings_of(name, QueueConfig(), dict(config)) if config else None
    return Declare(name, settings)


def configure(queue: str, changes: Mapping[str, Any]) -> Configure:
    name = queue_name(queue, f"configure {shown(queue, 80)}")
    settings_of(name, QueueConfig(), dict(changes))  # checked now, applied to the stored ones
    return Configure(name, dict(changes))


class _Budget(msgspec.Struct, frozen=True):
    writes_per_second: WriteRate | None


def set_write_budget(writes_per_second: float | None) -> SetWriteBudget:
    args = checked({"writes_per_second": writes_per_second}, _Budget, "write budget")
    return SetWriteBudget(args.writes_per_second)


def purge(queue: str) -> Purge:
    return Purge(queue_name(queue, "purge"))


def delete_queue(queue: str) -> DeleteQueue:
    return DeleteQueue(queue_name(queue, "delete_queue"))


# --- producing -------------------------------------------------------------------------------


class JobOptions(TypedDict, total=False):
    """What every job of an enqueue shares, as keywords of each way to enqueue."""

    #: Higher is claimed first (default 0).
    priority: int
    #: Claimable only after this long (default None: at once).
    delay: Delay
    #: Attempts before the job is dead-lettered (default None: the queue's ``max_attempts``).
    max_attempts: int | None
    #: The group (a tenant) the job belongs to: claims are fair among a queue's groups, and
    #: ``group_concurrency`` caps each (``docs/groups.md``). Default None: a group of its own.
    group: str | None


def known_keywords(options: Mapping[str, Any], accepted: Any, where: Place) -> None:
    """Refuse a keyword of ``options`` that the TypedDict ``accepted`` does not list: a
    misspelt one must not be dropped without a word."""
    if not options:
        return  # the usual call: no keywords beyond its own
    names = accepted.__optional_keys__ | accepted.__required_keys__
    unknown = sorted(set(options) - names)
    if unknown:
        raise TypeError(
            f"{where}: unexpected keyword {', '.join(map(repr, unknown))}; "
            f"expected {', '.join(sorted(names))} (or the call's own)"
        )


def _enqueue_args(queue: str, options: JobOptions, where: Place) -> _EnqueueArgs:
    """The options every job of an enqueue shares, checked in one conversion."""
    known_keywords(options, JobOptions, where)
    given: dict[str, Any] = {
        "queue": queue,
        "priority": options.get("priority", 0),
        "max_attempts": options.get("max_attempts"),
        "group": options.get("group"),
        "delay": options.get("delay"),
    }
    return _remembered(_checked_enqueue_args, where, **given)


def _remembered(check: Callable[..., R], *args: Any, **kwargs: Any) -> R:
    """``check(...)``, a checked-arguments cache (``functools.lru_cache``), asked again
    uncached when a value cannot be remembered (unhashable, and refused by the check)."""
    try:
        return check(*args, **kwargs)
    except TypeError:
        uncached: Callable[..., R] = getattr(check, "__wrapped__")  # noqa: B009
        return uncached(*args, **kwargs)


# A producer sends to few queues with few sets of options: each set is checked once. Typed,
# so that True is not taken for a priority of 1 that was checked before.
@functools.lru_cache(maxsize=1024, typed=True)
def _checked_enqueue_args(where: Place, *, delay: Delay, **given: object) -> _EnqueueArgs:
    seconds_ = seconds(delay, narrowed(where, ": delay"))
    return checked({**given, "delay": seconds_ or 0.0}, _EnqueueArgs, where)


def enqueue(
    queue: str,
    payloads: Iterable[bytes],
    *,
    keys: Sequence[str | None] | None = None,
    groups: Sequence[str | None] | None = None,
    to_declared: bool = False,
    **options: Unpack[JobOptions],
) -> Enqueue:
    """``keys`` and ``groups``: each payload's own (``groups`` instead of ``group``).
    ``to_declared``: add nothing if the queue does not exist (a routed message whose binding
    outlived its queue); otherwise the queue is declared by this first use."""
    where = Where("enqueue to {}", queue)
    args = _enqueue_args(queue, options, where)
    if groups is not None and args.group is not None:
        raise ConfigurationError(f"{where}: expected group or groups, found both")
    items: list[NewJob] = []
    for index, payload in enumerate(payloads):
        if not isinstance(payload, bytes | bytearray | memoryview):
            raise ConfigurationError(
                f"{where}: expected payload bytes, found {type(payload).__name__}"
            )
        body, b64 = encode_payload(bytes(payload))
        key = None if keys is None or index >= len(keys) else keys[index]
        if key is not None:
            checked({"key": key}, _Key, where)
        group = args.group if groups is None or index >= len(groups) else groups[index]
        if group is not None and groups is not None:
            checked({"queue": args.queue, "group": group}, _EnqueueArgs, where)
        items.append(
            NewJob(
                new_id(),
                args.queue,
                body,
                b64,
                args.priority,
                args.delay,
                args.max_attempts,
                key,
                group,
            )
        )
    for name, given in (("keys", keys), ("groups", groups)):
        if given is not None and len(given) != len(items):
            raise ConfigurationError(f"{where}: {len(items)} payloads but {len(given)} {name}")
    return Enqueue(items, to_declared)


def enqueue_staged(
    queue: str,
    staged: Sequence[StagedBodies],
    *,
    write_id: str,
    **options: Unpack[JobOptions],
) -> EnqueueStaged:
    where = f"staged enqueue to {shown(queue, 80)}"
    args = _enqueue_args(queue, options, where)
    if args.group is not None:  # refused, not dropped: the jobs would lose their tenant
        raise ConfigurationError(
            f"{where}: expected no group (jobs of staged bodies carry none yet), found "
            f"{shown(args.group, 80)}; enqueue them with enqueue_many(..., group=...)"
        )
    items = [checked(msgspec.structs.asdict(item), StagedBodies, where) for item in staged]
    total = sum(item.count for item in items)
    base = new_id()[:20]  # ids made before submitting: a replay is identical
    ids = [f"{base}{n:012x}" for n in range(total)]
    return EnqueueStaged(
        args.queue,
        items,
        ids,
        checked({"key": write_id}, _Key, f"{where}: write_id").key or "",
        args.priority,
        args.delay,
        args.max_attempts,
    )


def enqueue_runs(queue: str, runs: Sequence[StagedRun], *, write_id: str) -> EnqueueRuns:
    where = f"staged runs for {shown(queue, 80)}"
    return EnqueueRuns(
        queue_name(queue, where),
        [checked(msgspec.structs.asdict(run), StagedRun, where) for run in runs],
        checked({"key": write_id}, _Key, f"{where}: write_id").key or "",
    )


# --- consuming -------------------------------------------------------------------------------


def claim(
    queues: Sequence[str],
    n: int,
    *,
    lease: Delay = None,
    owner: str,
    strict: bool = False,
    ordered: bool = False,
) -> Claim:
    """``strict``: refuse a queue that is not declared (``QueueNotFound``). ``ordered``: take
    from the queues in the order given, not in turn."""
    args = _remembered(_checked_claim_args, tuple(queues), n=n, owner=owner, lease=lease)
    # One random base per claim: a delay-queue consumer may ask for thousands at a time.
    base = new_id()
    tokens = [f"{base}.{i}" for i in range(args.n)]
    return Claim(list(args.queues), tokens, args.owner, args.lease, strict, ordered=bool(ordered))


# A consumer claims from the same queues, with the same owner and lease, again and again:
# each set is checked once (typed, as the enqueue's).
@functools.lru_cache(maxsize=1024, typed=True)
def _checked_claim_args(queues: Sequence[str], *, n: int, owner: str, lease: Delay) -> _ClaimArgs:
    where = Where("claim from {}", list(queues), 120)
    given = {"queues": list(queues), "n": n, "owner": owner}
    return checked({**given, "lease": seconds(lease, where.then(": lease"))}, _ClaimArgs, where)


def _lease(lease: Delay, where: Place) -> float | None:
    return checked({"lease": seconds(lease, narrowed(where, ": lease"))}, _LeaseArg, where).lease


def heartbeat(held: Sequence[Delivery], *, lease: Delay = None) -> Heartbeat:
    return Heartbeat([_held(d, "heartbeat") for d in held], _lease(lease, "heartbeat"))


def heartbeat_interval(deliveries: Sequence[Delivery], every: float | None) -> float:
    """How often to extend these leases: a third of what is left of the first one."""
    if every is not None:
        return every
    lease = deliveries[0].job.lease if deliveries else None
    span = (lease.expires_at - time.time()) if lease is not None else 30.0
    return max(span / 3.0, 0.05)


def _held(delivery: Delivery, where: Place) -> tuple[str, str]:
    """The job id and lease token of ``delivery``, checked as the state holds them (a
    delivery is made from a claim, but an application may build one)."""
    job_id, token = delivery.held
    if plain_identifier(job_id) and plain_identifier(token):
        return job_id, token  # as a claim made them: nothing a conversion would refuse
    held = checked({"job_id": job_id, "token": token}, _Held, where)
    return held.job_id, held.token


def ack(delivery: Delivery, *, outcome: str = "done", error: str | None = None) -> Ack:
    where = Where("ack of {}", delivery.id)
    if outcome.__class__ is str and outcome == "done" and error is None:
        args = _ACK_DONE  # the usual ack: nothing to check
    else:
        args = checked({"outcome": outcome, "error": error}, _AckArgs, where)
    job_id, token = _held(delivery, where)
    return Ack(job_id, token, args.outcome, _storable(args.error))


def note_outcome(
    job_id: str, queue: str, outcome: str, error: str | None, token: str
) -> NoteOutcome:
    args = checked(
        {"job_id": job_id, "queue": queue, "token": token, "outcome": outcome, "error": error},
        _NoteArgs,
        "note_outcome",
    )
    return NoteOutcome(args.job_id, args.queue, args.token, args.outcome, _storable(args.error))


def nack(
    delivery: Delivery, *, error: str | None = None, retry: bool = True, delay: Delay = None
) -> Nack:
    where = Where("nack of {}", delivery.id)
    args = checked(
        {"error": error, "retry": retry, "delay": seconds(delay, where.then(": delay"))},
        _NackArgs,
        where,
    )
    job_id, token = _held(delivery, where)
    return Nack(job_id, token, _storable(args.error), args.retry, _rng.random(), args.delay)


def _storable(error: str | None) -> str | None:
    """A job's error as the state can hold it: cut to :data:`MAX_ERROR_TEXT` characters (its
    start and its end) and UTF-8-safe (:func:`~objq_broker.errors.storable_text`). An error
    message is kept whatever it holds, never a reason for its ack or nack to fail."""
    # Cut again after the escapes, which may lengthen it; cut first so a huge text is not
    # encoded whole.
    return None if error is None else cut_text(storable_text(cut_text(error)))


def release(held: Sequence[Delivery]) -> Release:
    return Release([_held(d, "release") for d in held])


# --- dead letters and reading ----------------------------------------------------------------


def _ids(ids: Sequence[str] | None, where: str) -> list[str] | None:
    given = list(ids) if isinstance(ids, list | tuple) else ids
    return checked({"ids": given}, _Ids, where).ids


def retry_dead(queue: str, ids: Sequence[str] | None) -> RetryDead:
    return RetryDead(queue_name(queue, "retry_dead"), _ids(ids, "retry_dead"))


def purge_dead(queue: str, ids: Sequence[str] | None) -> PurgeDead:
    return PurgeDead(queue_name(queue, "purge_dead"), _ids(ids, "purge_dead"))


def find_job(job_id: str) -> FindJob:
    return FindJob(checked({"job_id": job_id}, _JobId, "job").job_id)


def stats(queues: Sequence[str]) -> Stats:
    return Stats([queue_name(name, "stats") for name in queues])


def list_jobs(queue: str, state: str | None, limit: int | None) -> ListJobs:
    args = checked({"queue": queue, "state": state, "limit": limit}, _ListArgs, "jobs")
    return ListJobs(args.queue, args.state, args.limit)
