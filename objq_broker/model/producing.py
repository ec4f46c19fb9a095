"""Enqueueing in the model: new jobs, jobs of staged bodies objects and staged runs (Spark's
bulk writes), and the idempotency keys that make a repeated enqueue return the first job.
Functions over :class:`~objq_broker.model.state.QueueState`, bound as its methods."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from objq_broker.errors import ConfigurationError, PayloadInvalid
from objq_broker.model.bodies import INLINE_MAX_BYTES
from objq_broker.model.records import Job, KeyRecord, RunRef, decode_body
from objq_broker.model.runs import rebased
from objq_broker.model.values import (
    STAGED_WRITE_KEY,
    NewJob,
    StagedBodies,
    StagedRun,
    check_queue_name,
    finished_job,
    key_slot,
    snapshot,
)

if TYPE_CHECKING:
    from objq_broker.model.state import QueueState


def enqueue(state: QueueState, new: Iterable[NewJob], now: float) -> list[Job]:
    """Add jobs (declaring their queues); a live idempotency key returns the earlier job."""
    items = list(new)
    seen: set[str] = set()
    for item in items:
        check_queue_name(item.queue)
        if item.id in state.jobs or item.id in state.dead or item.id in seen:
            raise ConfigurationError(f"job id {item.id!r} already exists")
        seen.add(item.id)
        if item.max_attempts is not None and item.max_attempts < 1:
            raise ConfigurationError(
                f"job {item.id}: max_attempts must be >= 1, found {item.max_attempts}"
            )
        if item.b64:
            try:
                decode_body(item.id, item.body)
            except PayloadInvalid as exc:  # a poison job: refuse it before it exists
                raise ConfigurationError(str(exc)) from None
    created: list[Job] = []
    for item in items:
        state.declare(item.queue)
        existing = existing_for_key(state, item, now)
        if existing is not None:
            created.append(existing)
            continue
        config = state.doc.queues[item.queue]
        state.doc.seq += 1
        job = Job(
            id=item.id,
            queue=item.queue,
            body=item.body,
            b64=item.b64,
            seq=state.doc.seq,
            priority=item.priority,
            enqueued_at=now,
            visible_at=now + max(item.delay_seconds, 0.0),
            max_attempts=item.max_attempts or config.max_attempts,
            key=item.key,
            group=item.group,
        )
        state.doc.grouped = state.doc.grouped or item.group is not None
        state.index.add(job)
        state.index.schedule(job, now)
        if len(job.body) > INLINE_MAX_BYTES:
            state.new_bodies.append(job)
        if item.key is not None:
            expires = now + config.idempotency_seconds
            state.doc.keys[key_slot(item.queue, item.key)] = KeyRecord(job.id, expires)
            state.note_expiry(expires)
        state.dirty = True
        created.append(snapshot(job))
    return created


def key_record(state: QueueState, queue: str, key: str) -> KeyRecord | None:
    """The latest record of idempotency key ``key`` of ``queue``, in the head or in its
    key runs (read first: :func:`~objq_broker.model.ops.runs_needed`)."""
    slot = key_slot(queue, key)
    record = state.doc.keys.get(slot)
    if record is not None:
        return record
    for ref in reversed(state.doc.key_runs.get(queue, [])):  # the latest first
        keys = state.key_contents.get(ref.key)
        if keys is None:
            raise KeyError(f"key run {ref.key} was not read before the enqueue that needs it")
        if slot in keys:
            return keys[slot]
    return None


def existing_for_key(state: QueueState, item: NewJob, now: float) -> Job | None:
    """The job a live idempotency key of ``item`` stands for (as it is now, or as it was
    asked for once it has left the state); None when ``item`` is new."""
    if item.key is None:
        return None
    record = key_record(state, item.queue, item.key)
    if record is None or record.expires_at <= now:
        return None
    live = state.jobs.get(record.job_id) or state.dead.get(record.job_id)
    if live is not None:
        return snapshot(live)
    # The first job finished, or waits in a run (not read for this: it would cost the
    # backlog): report it by id, as it was asked for.
    config = state.doc.queues[item.queue]
    enqueued_at = record.expires_at - config.idempotency_seconds
    return finished_job(item, now, config, job_id=record.job_id, enqueued_at=enqueued_at)


def enqueue_staged(
    state: QueueState,
    queue: str,
    staged: list[StagedBodies],
    ids: list[str],
    now: float,
    *,
    write_id: str,
    priority: int = 0,
    delay_seconds: float = 0.0,
    max_attempts: int | None = None,
) -> int | None:
    """Add one job per entry of bodies objects already stored, in one transition.

    Each job refers to its entry (``<key>#<index>``) and the state counts the references,
    so the objects are deleted once their last job has finished. ``write_id`` makes the
    transition idempotent: within the queue's idempotency window a second call with the
    same id adds nothing and returns None (a retried commit); otherwise it returns how many
    jobs were added. ``ids`` holds one new job id per entry, in order."""
    check_queue_name(queue)
    if _written(state, queue, write_id, now):
        return None
    _check_staged(state, queue, staged, ids, max_attempts)
    state.declare(queue)
    config = state.doc.queues[queue]
    attempts = max_attempts or config.max_attempts
    position = 0
    for item in staged:
        for index in range(item.count):
            state.doc.seq += 1
            wait = item.delays[index] if item.delays is not None else delay_seconds
            job = Job(
                id=ids[position],
                queue=queue,
                body="",
                seq=state.doc.seq,
                priority=item.priorities[index] if item.priorities is not None else priority,
                enqueued_at=now,
                visible_at=now + max(wait, 0.0),
                max_attempts=attempts,
                ref=f"{item.key}#{index}",
            )
            position += 1
            state.index.add(job)
            state.index.schedule(job, now)
        state.doc.bodies[item.key] = item.count
    _note_written(state, queue, write_id, now, ids[0] if ids else "")
    return position


def enqueue_runs(
    state: QueueState, queue: str, runs: list[StagedRun], now: float, *, write_id: str
) -> int | None:
    """Add the jobs of runs already stored (with the bodies objects they refer to), in
    one transition that adds a reference per run: a Spark write's jobs never pass through
    the head. Each run takes its place after every job enqueued before it, in the order
    given. Idempotent by ``write_id`` as :meth:`enqueue_staged`."""
    check_queue_name(queue)
    if _written(state, queue, write_id, now):
        return None
    _check_staged_runs(state, queue, runs)
    state.declare(queue)
    refs: list[RunRef] = []
    for run in runs:
        refs.append(rebased(run.ref(), state.doc.seq + 1))
        state.doc.seq += run.count
        state.doc.bodies[run.bodies] = state.doc.bodies.get(run.bodies, 0) + run.count
        if run.groups:
            state.index.run_groups(queue, run.groups)
            state.doc.grouped = True
    state.backlog.add_runs(queue, refs)
    _note_written(state, queue, write_id, now, runs[0].key if runs else "")
    return sum(run.count for run in runs)


def _written(state: QueueState, queue: str, write_id: str, now: float) -> bool:
    """Whether the staged write ``write_id`` was committed within the idempotency window."""
    record = key_record(state, queue, f"{STAGED_WRITE_KEY}{write_id}")
    return record is not None and record.expires_at > now


def _note_written(state: QueueState, queue: str, write_id: str, now: float, first: str) -> None:
    expires = now + state.doc.queues[queue].idempotency_seconds
    state.doc.keys[key_slot(queue, f"{STAGED_WRITE_KEY}{write_id}")] = KeyRecord(first, expires)
    state.note_expiry(expires)
    state.dirty = True


def _check_staged_runs(state: QueueState, queue: str, runs: list[StagedRun]) -> None:
    """Refuse runs a staged write cannot add, before anything changes."""
    where = f"staged runs for {queue!r}"
    keys = [run.key for run in runs]
    taken = set(keys) & state.doc.run_keys()
    if len(set(keys)) != len(keys) or taken:
        raise ConfigurationError(
            f"{where}: expected runs not referred to yet, found {sorted(taken) or keys}"
        )
    fresh = {run.bodies for run in runs}
    if fresh & state.doc.bodies.keys():
        raise ConfigurationError(
            f"{where}: jobs already refer to {sorted(fresh & state.doc.bodies.keys())}"
        )
    for run in runs:
        if run.key in state.unreadable_runs:
            raise ConfigurationError(
                f"{where}: run {run.key}: {state.unreadable_runs[run.key]}; nothing of the "
                "write was added"
            )
        if run.last < run.next:
            raise ConfigurationError(
                f"{where}: run {run.key}'s last job {run.last} sorts before its first {run.next}"
            )
        if run.groups and (run.kind != "ready" or sum(run.groups.values()) > run.count):
            raise ConfigurationError(
                f"{where}: run {run.key}: expected group counts of a ready run, at most its "
                f"{run.count} jobs in all; found {sum(run.groups.values())} in a {run.kind} run"
            )


def _check_staged(
    state: QueueState,
    queue: str,
    staged: list[StagedBodies],
    ids: list[str],
    max_attempts: int | None,
) -> None:
    """Refuse a staged enqueue before it changes anything."""
    where = f"staged enqueue to {queue!r}"
    total = sum(item.count for item in staged)
    if len(ids) != total:
        raise ConfigurationError(f"{where}: {total} staged entries but {len(ids)} job ids")
    if max_attempts is not None and max_attempts < 1:
        raise ConfigurationError(f"{where}: max_attempts must be >= 1, found {max_attempts}")
    keys = [item.key for item in staged]
    if len(set(keys)) != len(keys):
        raise ConfigurationError(f"{where}: a bodies object is listed twice in {keys}")
    for item in staged:
        _check_staged_object(state, item, where)
    if len(set(ids)) != len(ids):
        raise ConfigurationError(f"{where}: the job ids are not unique")
    taken = [i for i in ids if i in state.jobs or i in state.dead]
    if taken:
        raise ConfigurationError(f"{where}: job ids {taken[:5]} already exist")


def _check_staged_object(state: QueueState, item: StagedBodies, where: str) -> None:
    if item.count < 1:
        raise ConfigurationError(f"{where}: {item.key} has {item.count} entries")
    if item.key in state.doc.bodies:
        raise ConfigurationError(f"{where}: jobs already refer to {item.key}")
    for extra, name in ((item.priorities, "priorities"), (item.delays, "delays")):
        if extra is not None and len(extra) != item.count:
            raise ConfigurationError(
                f"{where}: {item.key} has {item.count} entries but {len(extra)} {name}"
            )
