"""The backlog out of the head: runs of jobs, dead letters and idempotency keys that a commit
wrote as objects of their own, and that the state refers to (``docs/segments.md``).

:meth:`~BacklogState.spill` moves a queue's ready and delayed jobs into runs once the head holds
more than a bound of them, so a commit costs the same however deep the backlog; a claim takes
the jobs of the runs in order and moves them into the head, and small runs are merged. Nothing
here does I/O: the engine reads the runs a batch needs
(:func:`~objq_broker.model.ops.runs_needed`) and writes the runs made here before the head.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

import msgspec

from objq_broker.model.indexed import IndexedState
from objq_broker.model.records import Job, KeyRecord, KeyRunRef, RunKind, RunRef
from objq_broker.model.runs import (
    MAX_RUN_JOBS,
    RunMerge,
    build_key_run,
    build_run,
    merged_jobs,
    order_key,
    run_is_due,
    small_runs,
    take_due,
)
from objq_broker.model.values import Finished, key_slot, with_id


class BacklogState(IndexedState):
    """The layer of :class:`~objq_broker.model.state.QueueState` that keeps the backlog in
    runs: spilling, merging, reading and dropping them."""

    def _promote_runs(self, queue: str, now: float) -> None:
        """Move the due jobs of ``queue``'s timed runs into the head, ready (a later spill
        writes them out again as a ready run when there are many)."""
        due = [ref for ref in self.doc.runs.get(queue, []) if run_is_due(ref, now)]
        if not due:
            return
        for ref in due:
            for job in take_due(ref, self._contents(ref), now):
                self.jobs[job.id] = job
                self._members.setdefault(queue, set()).add(job.id)
                self._push_ready(job)
        self.dirty = True
        self._drop_taken_runs(queue)

    def spill(
        self, bound: int, key_for: Callable[[int], str], *, run_jobs: int = MAX_RUN_JOBS
    ) -> None:
        """Move the ready jobs of each queue that has more than ``bound`` of them in the head
        into new runs of at most ``run_jobs`` jobs (keyed ``key_for(n)``), to be written
        before the head (:attr:`new_runs`). Their bodies stay counted: the runs refer to them
        as the head did. The runs' jobs are not kept here: a claim reads them back, so a
        producer does not hold the backlog it wrote."""
        for queue in list(self._members):
            self._spill_ready(queue, bound, key_for, run_jobs)
            self._spill_timed(queue, bound, key_for, run_jobs)
        self._spill_dead(bound, key_for, run_jobs)
        self._spill_keys(bound, key_for, run_jobs)

    def _spill_dead(self, bound: int, key_for: Callable[[int], str], run_jobs: int) -> None:
        if len(self.dead) <= bound:
            return  # no queue can be past the bound: skip the scan on every commit
        by_queue: dict[str, list[Job]] = {}
        for job in self.dead.values():
            by_queue.setdefault(job.queue, []).append(job)
        for queue, jobs in by_queue.items():
            if len(jobs) > bound:
                jobs.sort(key=lambda job: order_key("dead", job))
                self._write_out(queue, "dead", jobs, key_for, run_jobs)

    def _spill_keys(self, bound: int, key_for: Callable[[int], str], run_jobs: int) -> None:
        if len(self.doc.keys) <= bound:
            return
        by_queue: dict[str, dict[str, KeyRecord]] = {}
        for slot, record in self.doc.keys.items():
            by_queue.setdefault(slot.split("/", 1)[0], {})[slot] = record
        for queue, records in by_queue.items():
            if len(records) <= bound:
                continue
            slots = sorted(records, key=lambda slot: records[slot].expires_at)
            for start in range(0, len(slots), run_jobs):
                chunk = {slot: records[slot] for slot in slots[start : start + run_jobs]}
                ref, data = build_key_run(key_for(len(self.new_runs)), queue, chunk)
                self.doc.key_runs.setdefault(queue, []).append(ref)
                self.new_runs.append((ref.key, data))
                self.key_contents[ref.key] = chunk  # its producer is the likeliest to ask
            for slot in slots:
                del self.doc.keys[slot]
            self.dirty = True

    def _spill_ready(
        self, queue: str, bound: int, key_for: Callable[[int], str], run_jobs: int
    ) -> None:
        # Only jobs already known ready: promoting here would also expire leases, which
        # is ``expire``'s to do (and to report).
        heap = self._ready.get(queue, [])
        if len(heap) <= bound:
            return  # superseded entries only add to a heap: it cannot hold more live ones
        live = [entry for entry in heap if self._entry.get(entry[2]) == entry]
        if len(live) > bound:
            jobs = self._with_tail(queue, [self.jobs[e[2]] for e in sorted(live)], run_jobs)
            self._write_out(queue, "ready", jobs, key_for, run_jobs)
            heap.clear()
            last = self.doc.runs[queue][-1]
            # Keep the newest run's jobs: the next spill merges into it (see _with_tail).
            self.run_contents[last.key] = jobs[-last.count :]

    def _with_tail(self, queue: str, jobs: list[Job], run_jobs: int) -> list[Job]:
        """``jobs`` merged with what is left of the queue's newest ready run, when that run is
        at hand and the two fit in one run: the run is then replaced, so a queue fed a few
        hundred jobs per commit keeps runs of thousands, and the head few references."""
        refs = self.doc.runs.get(queue, [])
        tail = refs[-1] if refs and refs[-1].kind == "ready" else None
        if tail is None or tail.remaining + len(jobs) > run_jobs:
            return jobs
        contents = self.run_contents.get(tail.key)
        if contents is None:
            return jobs
        refs.pop()
        self.unused_runs.append(tail.key)
        del self.run_contents[tail.key]
        left = contents[tail.taken :]
        return sorted([*left, *jobs], key=lambda job: order_key("ready", job))

    def _spill_timed(
        self, queue: str, bound: int, key_for: Callable[[int], str], run_jobs: int
    ) -> None:
        """Delayed and backing-off jobs (not leased ones: their leases change in the head)."""
        # The heap keeps the entries of acked jobs until their lease time passes (a busy
        # queue: thousands), so it is scanned only when enough delayed jobs were pushed since
        # the last scan to take those it found then past the bound.
        pushes = self._timed_pushes.get(queue, 0)
        found, pushes_then = self._timed_scanned.get(queue, (0, 0))
        if found + pushes - pushes_then <= bound:
            return
        heap = self._timed.get(queue, [])
        live = [e for e in heap if self._entry.get(e[2]) == e and self.jobs[e[2]].lease is None]
        if len(live) > bound:
            self._write_out(
                queue, "timed", [self.jobs[e[2]] for e in sorted(live)], key_for, run_jobs
            )
            heap[:] = [e for e in heap if self._entry.get(e[2]) == e]
            heapq.heapify(heap)
            live = []
        self._timed_scanned[queue] = (len(live), pushes)

    def _write_out(
        self,
        queue: str,
        kind: RunKind,
        jobs: list[Job],
        key_for: Callable[[int], str],
        run_jobs: int,
    ) -> None:
        """Move ``jobs`` (in their run's order) out of the head into runs of ``kind``."""
        runs = self.doc.dead_runs if kind == "dead" else self.doc.runs
        refs = runs.setdefault(queue, [])
        for start in range(0, len(jobs), run_jobs):
            chunk = jobs[start : start + run_jobs]
            ref, data = build_run(key_for(len(self.new_runs)), queue, kind, chunk)
            refs.append(ref)
            self.new_runs.append((ref.key, data))
        for job in jobs:
            if kind == "dead":
                del self.dead[job.id]
            else:
                self._forget(job)
        if kind != "dead":
            self._runs[queue] = RunMerge(refs)
        self.dirty = True

    def _merge_groups(
        self, run_jobs: int, at_least: int
    ) -> list[tuple[str, RunKind, list[RunRef]]]:
        """Per queue and kind of run, the small runs worth merging (:func:`small_runs`)."""
        groups: list[tuple[str, RunKind, list[RunRef]]] = []
        where: list[tuple[dict[str, list[RunRef]], tuple[RunKind, ...]]] = [
            (self.doc.runs, ("ready", "timed")),
            (self.doc.dead_runs, ("dead",)),
        ]
        for runs, kinds in where:
            for queue, refs in runs.items():
                for kind in kinds:
                    group = small_runs(refs, kind, run_jobs, at_least)
                    if group:
                        groups.append((queue, kind, group))
        return groups

    def runs_to_merge(self, run_jobs: int, at_least: int) -> list[tuple[str, RunRef]]:
        """The runs :meth:`merge_runs` would merge, as (queue, ref): to be read beforehand
        (off the commit path: the engine reads them in the background)."""
        groups = self._merge_groups(run_jobs, at_least)
        return [(queue, ref) for queue, _, group in groups for ref in group]

    def merge_runs(self, key_for: Callable[[int], str], run_jobs: int, at_least: int) -> int:
        """Replace each queue's small runs of a kind (:func:`small_runs`, those whose contents
        are at hand) by one run holding what is left of them, written before the head as a
        spill is; returns how many runs were merged. The jobs do not change, so neither do
        the claim order, the counts nor the bodies' references."""
        merged = 0
        for queue, kind, group in self._merge_groups(run_jobs, at_least):
            at_hand = [ref for ref in group if ref.key in self.run_contents]
            if len(at_hand) < max(at_least, 2):
                continue
            jobs = merged_jobs(kind, [(ref, self.run_contents[ref.key]) for ref in at_hand])
            new, data = build_run(key_for(len(self.new_runs)), queue, kind, jobs)
            self.new_runs.append((new.key, data))
            self.run_contents[new.key] = jobs  # as a spill keeps its tail: it is the newest
            runs = self.doc.dead_runs if kind == "dead" else self.doc.runs
            gone = {ref.key for ref in at_hand}
            runs[queue] = [ref for ref in runs[queue] if ref.key not in gone] + [new]
            self.unused_runs += sorted(gone)  # dropped from the cache once this lands
            if kind != "dead":
                self._runs[queue] = RunMerge(runs[queue])
            merged += len(gone)
            self.dirty = True
        return merged

    def runs_of(self, queue: str | None = None) -> list[tuple[str, RunRef]]:
        """The runs of ``queue`` (of every queue when None) with jobs left, as (queue, ref)."""
        return _left_in(self.doc.runs, queue)

    def dead_runs_of(self, queue: str | None = None) -> list[tuple[str, RunRef]]:
        """The dead runs of ``queue`` (every queue when None) with jobs left, as (queue, ref)."""
        return _left_in(self.doc.dead_runs, queue)

    def key_runs_of(self, queue: str) -> list[tuple[str, KeyRunRef]]:
        """The key runs of ``queue``, as (queue, ref)."""
        return [(queue, ref) for ref in self.doc.key_runs.get(queue, [])]

    def key_record(self, queue: str, key: str) -> KeyRecord | None:
        """The latest record of idempotency key ``key`` of ``queue``, in the head or in its
        key runs (read first: :func:`~objq_broker.model.ops.runs_needed`)."""
        slot = key_slot(queue, key)
        record = self.doc.keys.get(slot)
        if record is not None:
            return record
        for ref in reversed(self.doc.key_runs.get(queue, [])):  # the latest first
            keys = self.key_contents.get(ref.key)
            if keys is None:
                raise KeyError(f"key run {ref.key} was not read before the enqueue that needs it")
            if slot in keys:
                return keys[slot]
        return None

    def runs_to_claim(self, queue: str, n: int) -> list[tuple[str, RunRef]]:
        """The runs that claiming ``n`` jobs of ``queue`` could take from."""
        runs = self._runs.get(queue)
        if runs is None:
            return []
        wanted = set(runs.needed(n))
        return [(queue, ref) for ref in runs.refs if ref.key in wanted]

    def run_jobs(self, queue: str | None = None, *, read_only: bool = False) -> list[Job]:
        """The jobs left in the runs of ``queue`` (every queue when None). Every run must have
        been read, unless ``read_only`` (then those not read are skipped)."""
        return self._jobs_in(self.runs_of(queue), read_only)

    def _jobs_in(self, runs: list[tuple[str, RunRef]], read_only: bool) -> list[Job]:
        found: list[Job] = []
        for _, ref in runs:
            if not read_only or ref.key in self.run_contents:
                found += self._contents(ref)[ref.taken :]
        return found

    def _drop_emptied(self, runs: dict[str, list[RunRef]], queue: str) -> list[RunRef] | None:
        """Drop ``queue``'s runs (of ``runs``) with no job left, to be deleted once the commit
        lands; returns those left, or None when none was emptied."""
        refs = runs.get(queue, [])
        left = [ref for ref in refs if ref.remaining]
        if len(left) == len(refs):
            return None
        self.unused_runs += [ref.key for ref in refs if not ref.remaining]
        if left:
            runs[queue] = left
        else:
            del runs[queue]
        return left

    def _drop_taken_runs(self, queue: str) -> None:
        left = self._drop_emptied(self.doc.runs, queue)
        if left:
            self._runs[queue] = RunMerge(left)
        elif left is not None:
            del self._runs[queue]

    def _drop_dead_runs(self, queue: str) -> int:
        """Remove every dead run of ``queue``; returns how many dead letters they held."""
        doomed = self.dead_run_jobs(queue)
        for job in doomed:
            self._drop_body(job)
        self.unused_runs += [ref.key for ref in self.doc.dead_runs.pop(queue, [])]
        return len(doomed)

    def dead_run_jobs(self, queue: str | None, *, read_only: bool = False) -> list[Job]:
        """The dead letters in the dead runs of ``queue`` (every queue when None), as
        :meth:`run_jobs` for runs."""
        return self._jobs_in(self.dead_runs_of(queue), read_only)

    def _in_dead_runs(self, job_id: str) -> Job | None:
        """The dead letter ``job_id`` if it is in a dead run that was read."""
        jobs = self.dead_run_jobs(None, read_only=True) if self.doc.dead_runs else []
        return with_id(jobs, job_id)

    def _unspill_dead(self, queue: str) -> None:
        """Bring ``queue``'s dead runs back into the head, for a retry or purge to pick from
        (a later spill writes out what is left)."""
        for job in self.dead_run_jobs(queue):
            self.dead[job.id] = msgspec.structs.replace(job)
        refs = self.doc.dead_runs.pop(queue, [])
        self.unused_runs += [ref.key for ref in refs]
        if refs:
            self.dirty = True

    def expired_dead_runs(self, now: float) -> list[tuple[str, RunRef]]:
        """The dead runs (queue, ref) whose first dead letter is past its queue's retention."""
        return [
            (queue, ref)
            for queue, ref in self.dead_runs_of()
            if ref.next[0] + self.config(queue).dead_ttl_seconds <= now
        ]

    def _expire_dead_runs(self, now: float) -> None:
        expired = self.expired_dead_runs(now)
        for queue, ref in expired:
            cutoff = now - self.config(queue).dead_ttl_seconds
            for job in take_due(ref, self._contents(ref), cutoff):
                self._drop_body(job)
            self.dirty = True
        for queue in {queue for queue, _ in expired}:
            self._drop_emptied(self.doc.dead_runs, queue)

    def lose_run(self, key: str, reason: str, now: float) -> None:
        """Drop the run ``key`` that storage no longer holds, or that does not decode: the
        jobs it held cannot even be named, so an archived record (id: the run's key) names
        its queue and how many jobs it held, with ``reason``, and the queue flows on without
        them. A lost key run forgets its idempotency keys (a duplicate is then taken as new)."""
        for runs, what in ((self.doc.runs, "run"), (self.doc.dead_runs, "dead run")):
            for queue, refs in list(runs.items()):
                lost = next((ref for ref in refs if ref.key == key), None)
                if lost is None:
                    continue
                refs.remove(lost)
                if not refs:
                    del runs[queue]
                if runs is self.doc.runs:
                    self._runs.pop(queue, None)
                    if refs:
                        self._runs[queue] = RunMerge(refs)
                error = f"{what} {key} of {lost.remaining} jobs lost: {reason}"
                record = Job(key, queue, "", 0, now, now, 1, finished_at=now, error=error)
                self.finished.append(Finished("dead", record))
                self.dirty = True
                return
        for queue, key_refs in list(self.doc.key_runs.items()):
            if any(ref.key == key for ref in key_refs):
                left = [ref for ref in key_refs if ref.key != key]
                if left:
                    self.doc.key_runs[queue] = left
                else:
                    del self.doc.key_runs[queue]
                self.dirty = True
                return

    def _drop_runs(self, queue: str) -> int:
        """Remove every run of ``queue``; returns how many jobs they still held."""
        doomed = self.run_jobs(queue)
        for job in doomed:
            self._drop_body(job)
        self.unused_runs += [ref.key for ref in self.doc.runs.pop(queue, [])]
        self._runs.pop(queue, None)
        return len(doomed)


def _left_in(runs: dict[str, list[RunRef]], queue: str | None) -> list[tuple[str, RunRef]]:
    """The runs (of ``runs``) of ``queue``, of every queue when None, with jobs left."""
    names = list(runs) if queue is None else [queue]
    return [(q, r) for q in names for r in runs.get(q, []) if r.remaining]
