"""Consuming in the model: claims and their leases, heartbeats, acks, nacks with backoff,
releases, dead letters, and the expiry that every commit runs (stale leases back to their
queues, due jobs to ready, retention of dead letters and keys). Functions over
:class:`~objq_broker.model.state.QueueState`, bound as its methods."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from objq_broker.errors import JobNotFound, LeaseLost
from objq_broker.model.indexed import GroupEntry
from objq_broker.model.lifecycle import expire_queues
from objq_broker.model.records import Job, Lease, NackResult, RunOutcome
from objq_broker.model.runs import order_key
from objq_broker.model.values import Finished, retry_delay, snapshot
from objq_broker.model.workers import forget_gone, note_gone

if TYPE_CHECKING:
    from objq_broker.model.state import QueueState


def claim(  # noqa: PLR0917 (the state is bound as ``self``: five of the method's)
    state: QueueState,
    queue: str,
    tokens: list[str],
    owner: str,
    now: float,
    lease_seconds: float | None = None,
) -> list[Job]:
    """Lease up to ``len(tokens)`` ready jobs of ``queue``, best (priority, seq) first."""
    config = state.doc.queues.get(queue)
    if config is None or not tokens:
        return []
    state.touch(queue, now)
    _promote(state, queue, now)
    seconds = lease_seconds if lease_seconds is not None else config.lease_seconds
    index, backlog = state.index, state.backlog
    in_runs = backlog.has_runs(queue)
    if index.grouped(queue):
        claimed = _claim_fairly(
            state,
            queue,
            tokens,
            in_runs,
            lambda job, token: _lease(state, job, token, owner, now, seconds),
        )
        return _leased(state, queue, claimed, in_runs)
    claimed = []
    while len(claimed) < len(tokens):
        top = index.best_ready(queue)
        best = backlog.best(queue) if in_runs else None
        if best is not None and (top is None or best < top):
            job = backlog.take(queue)
            index.add(job)
        elif top is not None:
            job = index.pop_ready(queue)
        else:
            break
        _lease(state, job, tokens[len(claimed)], owner, now, seconds)
        claimed.append(job)
    return _leased(state, queue, claimed, in_runs)


def _lease(  # noqa: PLR0917 (one lease: the job, its token and holder, and when)
    state: QueueState, job: Job, token: str, owner: str, now: float, seconds: float
) -> None:
    job.attempts += 1
    job.started_at = now
    job.lease = Lease(token, owner, now + seconds, now)
    job.visible_at = job.lease.expires_at
    state.index.push_timed(job)


def _leased(state: QueueState, queue: str, claimed: list[Job], in_runs: bool) -> list[Job]:
    if claimed:
        state.dirty = True
    if in_runs:
        state.backlog.drop_taken(queue)
    return [snapshot(job) for job in claimed]


#: At most this many jobs a claim of a grouped queue moves from its runs into the head for
#: every job it asks for, past groups at their cap (``docs/groups.md``); the runs a claim
#: reads beforehand cover them (:meth:`QueueState.runs_to_claim`).
LOADS_PER_CLAIMED_JOB = 8


def _claim_fairly(
    state: QueueState,
    queue: str,
    tokens: list[str],
    in_runs: bool,
    lease: Callable[[Job, str], None],
) -> list[Job]:
    """Lease (``lease``) up to ``len(tokens)`` ready jobs of ``queue``, whose jobs name
    groups: by priority, then the group with the fewest jobs in flight (when the queue is
    fair), then seq; a group's own jobs in its order, none of a group at its cap.

    The queue's ready runs are one more line, in their (priority, seq) order: their first
    job competes as a job of its group. When its group is at its cap, it is moved into the
    head (it joins its group's line) and the next one competes, up to a bound per claim
    (``docs/groups.md``)."""
    index, backlog = state.index, state.backlog
    taken: list[Job] = []
    loads = LOADS_PER_CLAIMED_JOB * len(tokens)
    while len(taken) < len(tokens):
        front = backlog.best(queue) if in_runs else None
        index.runs_front(queue, front)
        group = index.best_group(queue)
        single = index.best_ready(queue)
        choices: list[tuple[tuple[int | float, int, int], str]] = []
        if group is not None:
            choices.append((group[:3], "group"))
        if single is not None:
            choices.append(((single[0], 0, single[1]), "single"))
        if front is not None:
            first = backlog.peek(queue)
            if first is not None and index.at_cap(queue, first.group) and loads > 0:
                loads -= 1
                _load(state, backlog.take(queue))
                continue
            if first is not None and not index.at_cap(queue, first.group):
                choices.append(((front[0], index.share(queue, first.group), front[1]), "run"))
        if not choices:
            break
        job = _take(state, queue, min(choices)[1], group)
        lease(job, tokens[len(taken)])
        taken.append(job)
    return taken


def _take(state: QueueState, queue: str, where: str, group: GroupEntry | None) -> Job:
    """The job a fair claim chose: the best of a group's line, the best job of no group, or
    the first of the runs (into the head)."""
    index = state.index
    if where == "group":
        assert group is not None
        return index.pop_group(queue, group[3])
    if where == "single":
        return index.pop_ready(queue)
    job = state.backlog.take(queue)
    index.add(job)
    index.loaded(job)
    return job


def _load(state: QueueState, job: Job) -> None:
    """Move ``job``, the first of its queue's ready runs, into the head, ready."""
    state.index.add(job)
    state.index.loaded(job)
    state.index.runs_front(job.queue, state.backlog.best(job.queue))
    state.index.push_ready(job)
    state.dirty = True


def _promote(state: QueueState, queue: str, now: float) -> None:
    """Move due jobs of ``queue`` to ready; expire the leases among them."""
    for job in state.index.pop_due(queue, now):
        if job.lease is not None:
            _expire_lease(state, job, now)
        else:
            state.index.push_ready(job)
    _promote_runs(state, queue, now)


def _promote_runs(state: QueueState, queue: str, now: float) -> None:
    """Move the due jobs of ``queue``'s timed runs into the head, ready (a later spill
    writes them out again as a ready run when there are many)."""
    due = state.backlog.take_due(queue, now)
    if due is None:
        return
    for job in due:
        state.index.add(job)
        state.index.push_ready(job)
    state.dirty = True


def _held(state: QueueState, job_id: str, token: str) -> Job:
    """The job ``token`` holds, or :class:`LeaseLost` saying why it does not."""
    job = state.jobs.get(job_id)
    if job is None:
        raise LeaseLost(f"job {job_id}: no longer in the queue (acked, dead or purged)")
    if job.lease is None or job.lease.token != token:
        now_held = "nobody" if job.lease is None else f"owner {job.lease.owner!r}"
        raise LeaseLost(f"job {job_id}: lease {token} is stale; the job is now held by {now_held}")
    return job


def heartbeat(
    state: QueueState,
    held: list[tuple[str, str]],
    now: float,
    lease_seconds: float | None = None,
) -> list[bool]:
    """Extend many leases at once; the result says which were still held."""

    def extend(job: Job) -> None:
        seconds = lease_seconds or state.doc.queues[job.queue].lease_seconds
        assert job.lease is not None
        job.lease = Lease(job.lease.token, job.lease.owner, now + seconds, now)
        job.visible_at = job.lease.expires_at
        state.index.push_timed(job)
        state.touch(job.queue, now)

    return _each_held(state, held, extend)


def _each_held(
    state: QueueState, held: list[tuple[str, str]], change: Callable[[Job], None]
) -> list[bool]:
    """``change`` each job its token still holds; which were (a lost lease is no error here:
    its holder only learns that it lost it)."""
    done: list[bool] = []
    for job_id, token in held:
        try:
            job = _held(state, job_id, token)
        except LeaseLost:
            done.append(False)
            continue
        change(job)
        state.dirty = True
        done.append(True)
    return done


def ack(  # noqa: PLR0917 (as claim)
    state: QueueState,
    job_id: str,
    token: str,
    now: float,
    outcome: Literal["done"] | RunOutcome = "done",
    error: str | None = None,
) -> Job:
    """Finish a held job; ``outcome`` says how its run went when it did not go well but
    the framework settles it with an ack all the same (a retry sent as a new job)."""
    job = _held(state, job_id, token)
    state.index.forget(job)
    state.drop_body(job)
    job.lease = None
    job.finished_at = now
    if error is not None:
        job.error = error
    state.finished.append(Finished(outcome, job))
    state.dirty = True
    return snapshot(job)


def note_outcome(
    state: QueueState,
    job_id: str,
    queue: str,
    token: str,
    outcome: RunOutcome,
    *,
    error: str | None,
    now: float,
) -> None:
    """Archive how the run of a job went, for a framework that acks a job before running
    it: a record of the job's id and queue only (its own record, written when it was
    acked, has the rest). The job itself is not touched, wherever it is.

    ``token`` is the lease of the delivery that ran it. A job still in the state must be
    held under it (:class:`LeaseLost` otherwise: nobody notes a run on a job another
    worker holds, waits for or gave up). A job gone from the state was acked: its note
    is kept, and readers of the archive join it to the job's own record, so a note on a
    job that never existed is never counted."""
    if job_id in state.jobs or job_id in state.dead:
        if job_id in state.dead:
            raise LeaseLost(f"job {job_id}: dead-lettered, so no run of it can be noted")
        _held(state, job_id, token)
    note = Job(job_id, queue, "", 0, now, now, 1, finished_at=now, error=error)
    state.finished.append(Finished(outcome, note))
    state.dirty = True


def nack(
    state: QueueState,
    job_id: str,
    token: str,
    now: float,
    *,
    error: str | None,
    retry: bool,
    jitter: float,
    delay_seconds: float | None = None,
) -> NackResult:
    """Retry after a backoff, or dead-letter once attempts are spent; returns which."""
    job = _held(state, job_id, token)
    state.dirty = True
    job.lease = None
    job.error = error
    if not retry or job.attempts >= job.max_attempts:
        _dead_letter(state, job, now, error)
        return "dead"
    config = state.doc.queues[job.queue]
    if delay_seconds is None:
        delay_seconds = retry_delay(
            job.attempts, config.backoff_base_seconds, config.backoff_cap_seconds, jitter
        )
    job.visible_at = now + delay_seconds
    state.index.schedule(job, now)
    return "retry"


def _dead_letter(state: QueueState, job: Job, now: float, error: str | None) -> None:
    state.index.forget(job)
    job.lease = None
    job.error = error
    job.finished_at = now
    state.dead[job.id] = job
    state.note_expiry(state.dead_expiry(job))
    state.finished.append(Finished("dead", snapshot(job)))


def _expire_lease(state: QueueState, job: Job, now: float) -> None:
    state.dirty = True
    if job.lease is not None:
        note_gone(state.doc.gone, job.lease.owner, now)
    job.lease = None
    job.visible_at = now
    if job.attempts >= job.max_attempts:
        _dead_letter(state, job, now, f"lease expired on attempt {job.attempts}, the last")
    else:
        job.error = f"lease expired on attempt {job.attempts}"
        state.index.push_ready(job)


def release(state: QueueState, held: list[tuple[str, str]], now: float) -> list[bool]:
    """Give back unprocessed deliveries without counting an attempt."""

    def give_back(job: Job) -> None:
        job.lease = None
        job.attempts = max(job.attempts - 1, 0)
        job.visible_at = now
        state.index.push_ready(job)

    return _each_held(state, held, give_back)


def expire(state: QueueState, now: float) -> int:
    """Delete queues unused past their expiry; return stale leases to their queues; drop
    dead letters and keys past retention."""
    doc, index = state.doc, state.index
    if doc.used:
        expire_queues(state, now)
    expired = 0
    for queue in index.timed_queues():
        for job in index.pop_due(queue, now):
            if job.lease is not None:
                _expire_lease(state, job, now)
                expired += 1
            else:
                index.push_ready(job)
    for queue in {queue for queue, _ in state.due_runs(now)}:
        _promote_runs(state, queue, now)
    state.sweep(now)
    if doc.gone and forget_gone(doc.gone, now):
        state.dirty = True
    if doc.dead_runs:
        _expire_dead_runs(state, now)
    return expired


def _expire_dead_runs(state: QueueState, now: float) -> None:
    expired = state.expired_dead_runs(now)
    for queue, ref in expired:
        cutoff = now - state.config(queue).dead_ttl_seconds
        for job in state.backlog.take_dead_until(ref, cutoff):
            state.drop_body(job)
        state.dirty = True
    state.backlog.drop_emptied_dead({queue for queue, _ in expired})


def dead_letters(state: QueueState, queue: str) -> list[Job]:
    """Dead letters of ``queue`` by death time, those in dead runs (read first) included."""
    state.config(queue)
    found = [snapshot(job) for job in state.dead.values() if job.queue == queue]
    found += [snapshot(job) for job in state.backlog.dead_run_jobs(queue)]
    return sorted(found, key=lambda job: order_key("dead", job))


def _dead_ids(state: QueueState, queue: str, ids: list[str] | None) -> list[str]:
    """The dead letters of ``queue`` that ``ids`` name (all when None), brought into the
    head if they are in dead runs; nothing changes when one of them is not found."""
    state.config(queue)
    dead = state.dead
    in_runs = {job.id for job in state.backlog.dead_run_jobs(queue)}
    if ids is None:
        _unspill_dead(state, queue)
        return [i for i, job in dead.items() if job.queue == queue]
    missing = [i for i in ids if i not in in_runs and (i not in dead or dead[i].queue != queue)]
    if missing:
        raise JobNotFound(f"queue {queue!r}: no dead letters with ids {missing}")
    if in_runs.intersection(ids):
        _unspill_dead(state, queue)
    return list(dict.fromkeys(ids))


def _unspill_dead(state: QueueState, queue: str) -> None:
    """Bring ``queue``'s dead runs back into the head, for a retry or purge to pick from
    (a later spill writes out what is left)."""
    jobs = state.backlog.take_dead(queue)
    if jobs is None:
        return
    for job in jobs:
        state.dead[job.id] = job
    state.dirty = True


def retry_dead(state: QueueState, queue: str, ids: list[str] | None, now: float) -> list[str]:
    """Put dead letters back at the end of their queue with a fresh attempt count."""
    chosen = _dead_ids(state, queue, ids)
    for job_id in chosen:
        job = state.dead.pop(job_id)
        state.doc.seq += 1
        job.seq = state.doc.seq
        job.attempts = 0
        job.visible_at = now
        job.finished_at = None
        state.index.add(job)
        state.index.push_ready(job)
    if chosen:
        state.dirty = True
    return chosen


def purge_dead(state: QueueState, queue: str, ids: list[str] | None) -> int:
    """Drop dead letters of ``queue`` (those ``ids`` name; all when None)."""
    chosen = _dead_ids(state, queue, ids)
    for job_id in chosen:
        state.drop_body(state.dead.pop(job_id))
    if chosen:
        state.dirty = True
    return len(chosen)
