"""The values the queue model takes and gives: what an enqueue asks for, what a staged write
hands in, what a finished job and a queue's counts look like, and the checks of queue names and
settings that every transition relies on."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Literal

import msgspec

from objq_broker.errors import ConfigurationError
from objq_broker.model.backoff import backoff_seconds
from objq_broker.model.checks import (
    MAX_QUEUE_NAME,
    MAX_STAGED_ENTRIES,
    Attempts,
    Finite,
    Identifier,
    OrderPosition,
    Priority,
    QueueName,
    SignedSeconds,
    StagedKey,
    checked,
    shown,
)
from objq_broker.model.records import Job, JobState, Outcome, QueueConfig, RunRef
from objq_broker.model.runs import MAX_RUN_JOBS

#: Idempotency keys of staged writes (``enqueue_staged``) start with this, so they never meet
#: a key an application chose.
STAGED_WRITE_KEY = "objq-staged-write:"

#: The backoff of a failed job's next attempt (kept under its old name for callers).
retry_delay = backoff_seconds


class NewJob(msgspec.Struct, frozen=True):
    """What an enqueue asks for; the id is made by the caller so a replay is identical."""

    id: Identifier
    queue: QueueName
    body: str
    b64: bool = False
    priority: Priority = 0
    delay_seconds: SignedSeconds = 0.0
    max_attempts: Attempts | None = None
    key: Identifier | None = None
    #: The group (a tenant) the job belongs to (``docs/groups.md``); None: its own.
    group: Identifier | None = None


class StagedBodies(msgspec.Struct, frozen=True):
    """A bodies object written ahead of the commit that enqueues one job per entry of it.

    ``priorities`` and ``delays`` give each entry its own priority or delay (seconds); None
    means the batch's value for every entry."""

    key: StagedKey
    count: Annotated[int, msgspec.Meta(ge=1, le=MAX_STAGED_ENTRIES)]
    priorities: tuple[Priority, ...] | None = None
    delays: tuple[SignedSeconds, ...] | None = None


class StagedRun(msgspec.Struct, frozen=True):
    """A run written ahead of the commit that enqueues its jobs (by a Spark task): its jobs
    refer to entries of the bodies object ``bodies`` and are numbered from 0; ``next``,
    ``last`` and ``oldest`` are as in its :class:`RunRef`. ``groups`` counts the jobs of
    each group a ready run holds (``docs/groups.md``): a claim needs them to keep a group's
    cap and share without reading the run; a timed run's jobs enter the head when due."""

    key: StagedKey
    bodies: StagedKey
    kind: Literal["ready", "timed"]
    count: Annotated[int, msgspec.Meta(ge=1, le=MAX_RUN_JOBS)]
    next: OrderPosition
    last: OrderPosition
    oldest: Finite
    groups: dict[Identifier, Annotated[int, msgspec.Meta(ge=1)]] | None = None

    def ref(self) -> RunRef:
        return RunRef(
            key=self.key,
            kind=self.kind,
            count=self.count,
            taken=0,
            next=self.next,
            oldest=self.oldest,
            last=self.last,
        )


@dataclass(frozen=True, slots=True)
class Finished:
    """A job leaving the hot state, to be archived before the commit that drops it."""

    outcome: Outcome
    job: Job


class GroupStats(msgspec.Struct, frozen=True):
    """Counts for one group of a queue (``docs/groups.md``) at one moment."""

    group: str
    ready: int
    in_flight: int
    #: How long its oldest ready job in the head has waited (None: none there).
    oldest_ready_age_seconds: float | None


#: How many of a queue's groups its stats name, the busiest first: a bounded summary, however
#: many tenants a queue serves.
BUSIEST_GROUPS = 5


class QueueStats(msgspec.Struct, frozen=True):
    """Counts for one queue at one moment."""

    queue: str
    ready: int
    delayed: int
    in_flight: int
    dead: int
    oldest_ready_age_seconds: float | None
    #: How many groups have ready or in-flight jobs (0: none of its jobs names a group).
    groups: int = 0
    #: The groups with the most ready and in-flight jobs, at most :data:`BUSIEST_GROUPS`.
    busiest: tuple[GroupStats, ...] = ()

    def count(self, state: JobState) -> int:
        """How many of the queue's jobs are in ``state``."""
        counts = {"ready": self.ready, "delayed": self.delayed, "dead": self.dead}
        return counts.get(state, self.in_flight)


def check_queue_name(queue: object) -> str:
    if (
        not isinstance(queue, str)
        or not queue
        or len(queue) > MAX_QUEUE_NAME
        or "/" in queue
        or not queue.isprintable()
    ):
        raise ConfigurationError(
            f"queue name: expected 1-{MAX_QUEUE_NAME} printable characters without '/', "
            f"found {shown(queue)}"
        )
    return queue


def settings_of(
    queue: str, base: QueueConfig, changes: Mapping[str, object] | None = None
) -> QueueConfig:
    """``base`` with ``changes`` applied, every field checked; :class:`ConfigurationError`
    names an unknown setting or a value out of its range."""
    changes = dict(changes or {})
    allowed = QueueConfig.__struct_fields__
    unknown = sorted(set(changes) - set(allowed))
    if unknown:
        raise ConfigurationError(
            f"queue {shown(queue, 80)}: unknown setting(s) {unknown}; accepted: {sorted(allowed)}"
        )
    merged = {name: getattr(base, name) for name in allowed} | changes
    # A group setting given None goes back to unset (its default), which is not written.
    kept = {
        name: value
        for name, value in merged.items()
        if value is not msgspec.UNSET and not (value is None and name in _UNSETTABLE)
    }
    return checked(kept, QueueConfig, f"queue {shown(queue, 80)}")


#: Queue settings that are left out of the state until set (``None`` unsets them).
_UNSETTABLE = frozenset({"group_concurrency", "fairness"})


def snapshot(job: Job) -> Job:
    """A copy for callers: the state's own record keeps changing after the op returns."""
    return msgspec.structs.replace(job)


def with_id(jobs: list[Job], job_id: str) -> Job | None:
    """The job of ``jobs`` with id ``job_id``, if any."""
    return next((job for job in jobs if job.id == job_id), None)


def finished_job(
    item: NewJob,
    now: float,
    config: QueueConfig,
    *,
    job_id: str | None = None,
    enqueued_at: float | None = None,
) -> Job:
    """A job that was added and has already left the state, described by the request that
    added it (``job_id``: the job that request stood for, when it was another's key)."""
    return Job(
        id=job_id or item.id,
        queue=item.queue,
        body=item.body,
        b64=item.b64,
        seq=0,
        enqueued_at=now if enqueued_at is None else enqueued_at,
        visible_at=now,
        max_attempts=item.max_attempts or config.max_attempts,
        key=item.key,
        finished_at=now,
        group=item.group,
    )


def key_slot(queue: str, key: str) -> str:
    """Where an idempotency key of ``queue`` is recorded."""
    return f"{queue}/{key}"
