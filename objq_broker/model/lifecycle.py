"""Queue lifecycle in the model: declaring, configuring, marking use, expiring, purging and
deleting queues. Functions over :class:`~objq_broker.model.state.QueueState`, bound as its
methods."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from objq_broker.model.records import QueueConfig
from objq_broker.model.values import check_queue_name, settings_of

if TYPE_CHECKING:
    from objq_broker.model.state import QueueState

#: A queue that expires has its last-used mark written again once the mark is this fraction
#: of its expiry old: a consumer that polls more often than every half expiry keeps its queue,
#: and costs one write per half expiry, not one per poll.
TOUCH_FRACTION = 0.5


def declare(
    state: QueueState, queue: str, config: QueueConfig | None = None, now: float | None = None
) -> bool:
    """Declare ``queue`` if new (with ``config`` or the defaults); True if it was new.
    Declaring a queue again counts as using it (``now``: when)."""
    check_queue_name(queue)
    doc = state.doc
    if queue in doc.queues:
        if now is not None:
            touch(state, queue, now)
        return False
    # Checked here too: a config built in code skips msgspec's constraints, and one bad
    # value in the state would stop every process that shares it.
    settings = QueueConfig() if config is None else settings_of(queue, config)
    doc.queues[queue] = settings
    state.index.add_queue(queue)
    if settings.has_group_rules():
        doc.grouped = True
        state.index.set_rules(queue, settings)
    if settings.expires_seconds is not None and now is not None:
        doc.used[queue] = now
    state.dirty = True
    return True


def touch(state: QueueState, queue: str, now: float) -> None:
    """Note that ``queue`` is in use (a claim, a heartbeat, a declare), if it expires.
    The mark is written only once it is :data:`TOUCH_FRACTION` of the expiry old."""
    config = state.doc.queues.get(queue)
    if config is None or config.expires_seconds is None:
        return
    last = state.doc.used.get(queue)
    if last is None or now - last >= config.expires_seconds * TOUCH_FRACTION:
        state.doc.used[queue] = now
        state.dirty = state.dirty or state.write_touches


def hold_marks(state: QueueState, now: float) -> None:
    """Keep the marks of use in memory from now on, written with the next commit that
    writes anyway, and count every queue as used ``now``. For the only writer (the elected
    broker): it sees every use, but the marks it read may be older than its predecessor's
    memory, so it gives each queue a full expiry from when it took the state over."""
    state.write_touches = False
    used = state.doc.used
    for queue in used:
        used[queue] = max(used[queue], now)


def touch_due(state: QueueState, queue: str) -> float | None:
    """When a consumer of ``queue`` should next use it to keep it from expiring (a claim
    waiting at a broker is tried again then); None if the queue does not expire."""
    config = state.doc.queues.get(queue)
    last = state.doc.used.get(queue)
    if config is None or config.expires_seconds is None or last is None:
        return None
    return last + config.expires_seconds * TOUCH_FRACTION


def expiring(state: QueueState, now: float) -> list[str]:
    """The queues unused for their ``expires_seconds`` at ``now``: the next commit deletes
    them (their runs must have been read first)."""
    queues = state.doc.queues
    found: list[str] = []
    for queue, last in state.doc.used.items():
        expires = queues[queue].expires_seconds if queue in queues else None
        if expires is not None and now - last >= expires:
            found.append(queue)
    return found


def expire_queues(state: QueueState, now: float) -> int:
    """Delete the queues unused for their expiry, with their jobs and dead letters."""
    doc = state.doc
    for queue in [q for q in doc.used if q not in doc.queues]:
        del doc.used[queue]  # left by a release that did not know the mark
        state.dirty = True
    if doc.broker is not None and state.write_touches:
        # A broker keeps the marks in memory (:func:`hold_marks`) and stores them only with
        # commits it makes anyway, so those stored may be as old as its last commit. A
        # process committing around it (a client that could not reach it for a moment)
        # would delete queues whose consumers are waiting at the broker: expiry is left to
        # the broker, or to the next one, which gives every queue a full expiry.
        return 0
    doomed = expiring(state, now)
    for queue in doomed:
        delete_queue(state, queue)
    return len(doomed)


def configure(
    state: QueueState,
    queue: str,
    changes: Mapping[str, bool | float | int | None],
    now: float = 0.0,
) -> QueueConfig:
    current = state.config(queue)
    updated = settings_of(queue, current, changes)
    if updated != current:
        doc = state.doc
        doc.queues[queue] = updated
        if updated.has_group_rules():
            doc.grouped = True
        if updated.has_group_rules() or current.has_group_rules():
            state.index.set_rules(queue, updated)
        state.dirty = True
        state.retention_changed()
        if updated.expires_seconds is None:
            doc.used.pop(queue, None)
        elif current.expires_seconds is None:
            doc.used[queue] = now
    return updated


def purge(state: QueueState, queue: str) -> int:
    """Delete the ready and delayed jobs of ``queue``; leased ones finish normally."""
    state.config(queue)
    doomed = [job for job in state.index.jobs_of(queue) if job.lease is None]
    for job in doomed:
        state.index.forget(job)
        state.drop_body(job)
    in_runs = state.backlog.drop_runs(queue)
    for job in in_runs:
        state.drop_body(job)
    state.doc.group_runs.pop(queue, None)
    state.index.runs_front(queue, None)
    count = len(doomed) + len(in_runs)
    if count:
        state.dirty = True
    return count


def delete_queue(state: QueueState, queue: str) -> int:
    """Remove ``queue``, its jobs and its dead letters; returns how many jobs went."""
    state.config(queue)
    index, backlog = state.index, state.backlog
    doomed = index.jobs_of(queue)
    for job in doomed:
        index.forget(job)
        state.drop_body(job)
    dead = [i for i, job in state.dead.items() if job.queue == queue]
    for job_id in dead:
        state.drop_body(state.dead.pop(job_id))
    in_runs = [*backlog.drop_runs(queue), *backlog.drop_dead_runs(queue)]
    for job in in_runs:
        state.drop_body(job)
    backlog.drop_key_runs(queue)
    del state.doc.queues[queue]
    state.doc.used.pop(queue, None)
    state.doc.group_runs.pop(queue, None)
    state.removed_queues.append(queue)
    index.drop_queue(queue)
    state.dirty = True
    return len(doomed) + len(dead) + len(in_runs)
