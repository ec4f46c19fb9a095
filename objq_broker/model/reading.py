"""Reading the model: a queue's counts and jobs, a job by id, the lease holders, what a
claim or an enqueue already applied returned, and when the next timed job is due. Functions
over :class:`~objq_broker.model.state.QueueState`, bound as its methods; none changes it."""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING, Any

from objq_broker.model.producing import existing_for_key
from objq_broker.model.records import Job, JobState, QueueConfig, RunRef
from objq_broker.model.values import (
    BUSIEST_GROUPS,
    GroupStats,
    NewJob,
    QueueStats,
    finished_job,
    snapshot,
    with_id,
)
from objq_broker.model.workers import Worker
from objq_broker.model.workers import workers as holders

if TYPE_CHECKING:
    from objq_broker.model.state import QueueState


def stats(state: QueueState, queue: str, now: float) -> QueueStats:
    """How many jobs of ``queue`` are in each state at ``now`` (its runs included), and how
    long the oldest ready one has waited."""
    state.config(queue)
    ready = delayed = in_flight = 0
    oldest: float | None = None
    groups = _Groups()
    for job in state.index.jobs_of(queue):
        now_in = job.state_at(now)
        groups.count(job, now_in)
        if now_in == "in-flight":
            in_flight += 1
        elif now_in == "delayed":
            delayed += 1
        else:
            ready += 1
            oldest = job.enqueued_at if oldest is None else min(oldest, job.enqueued_at)
    for group, count in state.doc.group_runs.get(queue, {}).items():
        groups.count_in_runs(group, count)
    in_runs, first = state.backlog.ready_left(queue)
    ready += in_runs
    if first is not None:
        oldest = first if oldest is None else min(oldest, first)
    for _, ref in state.backlog.runs_of(queue):
        if ref.kind != "timed":
            continue
        due = _due_in(state, ref, now)
        ready += len(due)
        delayed += ref.remaining - len(due)
        if due:
            first = min(job.enqueued_at for job in due)
            oldest = first if oldest is None else min(oldest, first)
    dead = sum(1 for job in state.dead.values() if job.queue == queue)
    dead += sum(ref.remaining for _, ref in state.backlog.dead_runs_of(queue))
    age = None if oldest is None else max(now - oldest, 0.0)
    return QueueStats(
        queue, ready, delayed, in_flight, dead, age, len(groups.tally), groups.busiest(now)
    )


class _Groups:
    """Per group of a queue: ready jobs, in-flight jobs and the oldest ready one's time."""

    def __init__(self) -> None:
        self.tally: dict[str, list[Any]] = {}

    def count(self, job: Job, now_in: str) -> None:
        if job.group is None or now_in == "delayed":
            return
        counts = self.tally.setdefault(job.group, [0, 0, None])
        if now_in == "in-flight":
            counts[1] += 1
        else:
            counts[0] += 1
            counts[2] = job.enqueued_at if counts[2] is None else min(counts[2], job.enqueued_at)

    def count_in_runs(self, group: str, count: int) -> None:
        self.tally.setdefault(group, [0, 0, None])[0] += count

    def busiest(self, now: float) -> tuple[GroupStats, ...]:
        # Sorted, not a heap: stats are read rarely, and only the index keeps heaps.
        ranked = sorted(self.tally.items(), key=lambda item: (-item[1][0] - item[1][1], item[0]))
        top = ranked[:BUSIEST_GROUPS]
        return tuple(
            GroupStats(group, ready, busy, None if first is None else max(now - first, 0.0))
            for group, (ready, busy, first) in top
        )


def _due_in(state: QueueState, ref: RunRef, now: float) -> list[Job]:
    """The jobs of the timed run ``ref`` due at ``now`` and not yet promoted."""
    if ref.next[0] > now:
        return []
    jobs = state.backlog.contents(ref)
    end = bisect.bisect_right(jobs, now, lo=ref.taken, key=lambda job: job.visible_at)
    return jobs[ref.taken : end]


def workers(state: QueueState, now: float) -> list[Worker]:
    """The lease holders at work and those gone lately (:mod:`objq_broker.model.workers`)."""
    return holders(state.jobs.values(), state.doc.gone, now)


def find(state: QueueState, job_id: str, now: float) -> tuple[JobState, Job] | None:
    """A job's state ('ready', 'delayed', 'in-flight' or 'dead') and a copy of it."""
    job = state.jobs.get(job_id) or _in_runs(state, job_id)
    if job is not None:
        return job.state_at(now), snapshot(job)
    dead = state.dead.get(job_id) or _in_dead_runs(state, job_id)
    return None if dead is None else ("dead", snapshot(dead))


def _in_runs(state: QueueState, job_id: str) -> Job | None:
    """The job ``job_id`` if it waits in a run that was read. Lookups that must be exact
    (``FindJob``, an idempotency key) have their runs read first
    (:func:`~objq_broker.model.ops.runs_needed`)."""
    if not state.doc.runs:
        return None
    return with_id(state.backlog.run_jobs(read_only=True), job_id)


def _in_dead_runs(state: QueueState, job_id: str) -> Job | None:
    """The dead letter ``job_id`` if it is in a dead run that was read."""
    jobs = state.backlog.dead_run_jobs(None, read_only=True) if state.doc.dead_runs else []
    return with_id(jobs, job_id)


def enqueued(state: QueueState, items: list[NewJob], now: float) -> list[Job]:
    """What an enqueue of ``items`` that was already applied returned: each job as it is
    now, or as it was asked for when it has already finished."""
    found: list[Job] = []
    for item in items:
        job = state.jobs.get(item.id) or state.dead.get(item.id) or _in_runs(state, item.id)
        keyed = existing_for_key(state, item, now)
        if job is not None:
            found.append(snapshot(job))
        elif keyed is not None:
            found.append(keyed)
        else:
            config = state.doc.queues.get(item.queue) or QueueConfig()
            found.append(finished_job(item, now, config))
    return found


def leased_to(state: QueueState, tokens: list[str]) -> list[Job]:
    """The jobs leased under ``tokens`` (what a claim made with them took)."""
    wanted = set(tokens)
    return [
        snapshot(job)
        for job in state.jobs.values()
        if job.lease is not None and job.lease.token in wanted
    ]


def holds(state: QueueState, held: list[tuple[str, str]]) -> list[bool]:
    """Which of ``(job id, token)`` still hold their jobs."""
    alive: list[bool] = []
    for job_id, token in held:
        job = state.jobs.get(job_id)
        alive.append(job is not None and job.lease is not None and job.lease.token == token)
    return alive


def next_visible(state: QueueState, queue: str) -> float | None:
    """When the next timed job of ``queue`` (delayed, backing off or leased) becomes
    claimable; None if it has none."""
    head = state.index.next_visible(queue)
    times = [] if head is None else [head]
    return min([*times, *state.backlog.timed_starts(queue)], default=None)
