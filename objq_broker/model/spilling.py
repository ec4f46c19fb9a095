"""Spilling: moving what the head holds past a bound into runs, and merging small runs, so a
commit costs the same however deep the backlog (``docs/runs.md``). Functions over
:class:`~objq_broker.model.state.QueueState`, bound as its methods; the runs themselves are
the :class:`~objq_broker.model.backlog.Backlog`'s."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from objq_broker.model.records import Job
from objq_broker.model.runs import MAX_RUN_JOBS, order_key

if TYPE_CHECKING:
    from objq_broker.model.state import QueueState


def spill(
    state: QueueState, bound: int, key_for: Callable[[int], str], *, run_jobs: int = MAX_RUN_JOBS
) -> None:
    """Move the ready jobs of each queue that has more than ``bound`` of them in the head
    (of a queue whose jobs name groups, those of its largest groups) into new runs of at
    most ``run_jobs`` jobs (keyed ``key_for(n)``), to be written before the head
    (:attr:`~objq_broker.model.backlog.Backlog.new_runs`); delayed jobs, dead letters and
    idempotency keys likewise. Their bodies stay counted: the runs refer to them as the head
    did. The runs' jobs are not kept here: a claim reads them back, so a producer does not
    hold the backlog it wrote."""
    index, backlog = state.index, state.backlog
    for queue in index.queues():
        # Only jobs already known ready: promoting here would also expire leases, which
        # is ``expire``'s to do (and to report).
        ready = index.ready_past(queue, bound)
        if ready:
            jobs = backlog.with_tail(queue, ready, run_jobs)
            backlog.write_out(queue, "ready", jobs, key_for, run_jobs)
            for job in jobs:
                index.forget(job)
            index.drop_forgotten(queue)
            index.spilled(queue, ready)
            index.runs_front(queue, backlog.best(queue))
            backlog.keep_newest(queue, jobs)
            state.dirty = True
        delayed = index.take_delayed(queue, bound)
        if delayed:
            backlog.write_out(queue, "timed", delayed, key_for, run_jobs)
            state.dirty = True
    _spill_dead(state, bound, key_for, run_jobs)
    if backlog.spill_keys(bound, key_for, run_jobs):
        state.dirty = True


def _spill_dead(
    state: QueueState, bound: int, key_for: Callable[[int], str], run_jobs: int
) -> None:
    if len(state.dead) <= bound:
        return  # no queue can be past the bound: skip the scan on every commit
    by_queue: dict[str, list[Job]] = {}
    for job in state.dead.values():
        by_queue.setdefault(job.queue, []).append(job)
    for queue, jobs in by_queue.items():
        if len(jobs) > bound:
            jobs.sort(key=lambda job: order_key("dead", job))
            state.backlog.write_out(queue, "dead", jobs, key_for, run_jobs)
            for job in jobs:
                del state.dead[job.id]
            state.dirty = True


def merge_runs(
    state: QueueState, key_for: Callable[[int], str], run_jobs: int, at_least: int
) -> int:
    """Merge the state's small runs (:meth:`~objq_broker.model.backlog.Backlog.merge`)."""
    merged = state.backlog.merge(key_for, run_jobs, at_least)
    if merged:
        state.dirty = True
    return merged
