"""The backlog out of the head: runs of jobs, dead letters and idempotency keys that a commit
wrote as objects of their own, and that the state refers to (``docs/runs.md``).

A spill (:mod:`~objq_broker.model.spilling`) moves a queue's ready and delayed jobs into runs
once the head holds more than a bound of them, so a commit costs the same however deep the
backlog; a claim takes the jobs of the runs in order and moves them into the head, and small
runs are merged. Nothing here does I/O: the engine reads the runs a batch needs
(:func:`~objq_broker.model.ops.runs_needed`) and writes the runs made here before the head."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import msgspec

from objq_broker.model.records import (
    Job,
    KeyRecord,
    KeyRunRef,
    OrderKey,
    RunKind,
    RunRef,
    StateDoc,
)
from objq_broker.model.runs import (
    RunMerge,
    build_key_run,
    build_run,
    merged_jobs,
    order_key,
    run_is_due,
    small_runs,
    take_due,
)


class Backlog:
    """The runs a state's document refers to, the contents of those read so far, and the
    runs made or emptied since the last commit. It changes only the document's ``runs``,
    ``dead_runs``, ``key_runs`` and (when it spills them) ``keys``; the jobs it takes out of
    runs, or is given to write out, go to or come from the head through its caller.

    >>> backlog = Backlog(StateDoc(format=1))
    >>> backlog.runs_of(), backlog.best("emails")
    ([], None)
    """

    def __init__(self, doc: StateDoc) -> None:
        self._doc = doc
        #: Each queue's ready runs, in claim order.
        self._merges = {queue: RunMerge(refs) for queue, refs in doc.runs.items()}
        #: The jobs of runs read so far, by key: the engine's cache (runs never change). A
        #: transition that needs a run finds it here; :func:`~objq_broker.model.ops.runs_needed`
        #: says which ones a batch needs.
        self.run_contents: dict[str, list[Job]] = {}
        #: The same for key runs (idempotency keys out of the head).
        self.key_contents: dict[str, dict[str, KeyRecord]] = {}
        #: Runs made for this commit: written (create-only) before the head.
        self.new_runs: list[tuple[str, bytes]] = []
        #: Runs whose jobs are all gone: delete them once the commit landed.
        self.unused_runs: list[str] = []
        #: Runs a staged write names that storage does not hold or that do not decode, with
        #: why (the engine reads them before the write is applied): the write is refused.
        self.unreadable_runs: dict[str, str] = {}

    def contents(self, ref: RunRef) -> list[Job]:
        """The jobs of ``ref``, which must have been read first
        (:func:`~objq_broker.model.ops.runs_needed` says which)."""
        jobs = self.run_contents.get(ref.key)
        if jobs is None:
            raise KeyError(f"run {ref.key} was not read before the operation that needs it")
        return jobs

    def runs_of(self, queue: str | None = None) -> list[tuple[str, RunRef]]:
        """The runs of ``queue`` (of every queue when None) with jobs left, as (queue, ref)."""
        return _left_in(self._doc.runs, queue)

    def dead_runs_of(self, queue: str | None = None) -> list[tuple[str, RunRef]]:
        """The dead runs of ``queue`` (every queue when None) with jobs left, as (queue, ref)."""
        return _left_in(self._doc.dead_runs, queue)

    def key_runs_of(self, queue: str) -> list[tuple[str, KeyRunRef]]:
        """The key runs of ``queue``, as (queue, ref)."""
        return [(queue, ref) for ref in self._doc.key_runs.get(queue, [])]

    def run_jobs(self, queue: str | None = None, *, read_only: bool = False) -> list[Job]:
        """The jobs left in the runs of ``queue`` (every queue when None). Every run must have
        been read, unless ``read_only`` (then those not read are skipped)."""
        return self._jobs_in(self.runs_of(queue), read_only)

    def dead_run_jobs(self, queue: str | None, *, read_only: bool = False) -> list[Job]:
        """The dead letters in the dead runs of ``queue`` (every queue when None), as
        :meth:`run_jobs` for runs."""
        return self._jobs_in(self.dead_runs_of(queue), read_only)

    def _jobs_in(self, runs: list[tuple[str, RunRef]], read_only: bool) -> list[Job]:
        found: list[Job] = []
        for _, ref in runs:
            if not read_only or ref.key in self.run_contents:
                found += self.contents(ref)[ref.taken :]
        return found

    def ready_left(self, queue: str) -> tuple[int, float | None]:
        """How many jobs are left in ``queue``'s ready runs, and the earliest ``enqueued_at``
        among them."""
        merge = self._merges.get(queue)
        if merge is None or not len(merge):
            return 0, None
        return len(merge), merge.oldest()

    def timed_starts(self, queue: str | None = None) -> list[float]:
        """When the next job of each timed run of ``queue`` (every queue when None) is due."""
        runs = self._doc.runs
        refs = [r for q in (runs if queue is None else [queue]) for r in runs.get(q, [])]
        return [ref.next[0] for ref in refs if ref.kind == "timed"]

    def due_runs(self, now: float) -> list[tuple[str, RunRef]]:
        """The timed runs (queue, ref) whose next job is due at ``now``."""
        runs = self._doc.runs.items()
        return [(queue, r) for queue, refs in runs for r in refs if run_is_due(r, now)]

    def take_due(self, queue: str, now: float) -> list[Job] | None:
        """Take the due jobs of ``queue``'s timed runs (copies, for the head); None when no
        run of it is due."""
        due = [ref for ref in self._doc.runs.get(queue, []) if run_is_due(ref, now)]
        if not due:
            return None
        taken = [job for ref in due for job in take_due(ref, self.contents(ref), now)]
        self.drop_taken(queue)
        return taken

    def runs_to_claim(self, queue: str, n: int) -> list[tuple[str, RunRef]]:
        """The runs that claiming ``n`` jobs of ``queue`` could take from."""
        merge = self._merges.get(queue)
        if merge is None:
            return []
        wanted = set(merge.needed(n))
        return [(queue, ref) for ref in merge.refs if ref.key in wanted]

    def has_runs(self, queue: str) -> bool:
        """Whether ``queue`` has ready or timed runs: a claim then drops those it empties."""
        return queue in self._merges

    def best(self, queue: str) -> OrderKey | None:
        """The (priority, seq) of the best job left in ``queue``'s ready runs."""
        merge = self._merges.get(queue)
        return None if merge is None else merge.best()

    def peek(self, queue: str) -> Job | None:
        """The best job of ``queue``'s ready runs, as it is there (not to be changed); None
        when it has none or its run was not read."""
        merge = self._merges.get(queue)
        return None if merge is None else merge.peek(self.run_contents)

    def take(self, queue: str) -> Job:
        """Take the best job of ``queue``'s ready runs (the caller checked :meth:`best`): a
        copy, for the head."""
        return self._merges[queue].take(self.run_contents)

    def drop_taken(self, queue: str) -> None:
        """Drop ``queue``'s runs that claims emptied, to be deleted once the commit lands."""
        left = self._drop_emptied(self._doc.runs, queue)
        if left:
            self._merges[queue] = RunMerge(left)
        elif left is not None:
            del self._merges[queue]

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

    def add_runs(self, queue: str, refs: list[RunRef]) -> None:
        """Refer to the runs ``refs`` (already stored, already given their place) of
        ``queue``, after those it has."""
        held = self._doc.runs.setdefault(queue, [])
        held += refs
        if held:
            self._merges[queue] = RunMerge(held)
        else:
            del self._doc.runs[queue]

    def with_tail(self, queue: str, jobs: list[Job], run_jobs: int) -> list[Job]:
        """``jobs`` merged with what is left of the queue's newest ready run, when that run is
        at hand and the two fit in one run: the run is then replaced, so a queue fed a few
        hundred jobs per commit keeps runs of thousands, and the head few references."""
        refs = self._doc.runs.get(queue, [])
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

    def write_out(
        self,
        queue: str,
        kind: RunKind,
        jobs: list[Job],
        key_for: Callable[[int], str],
        run_jobs: int,
    ) -> None:
        """Write ``jobs`` (in their run's order, taken out of the head by the caller) into
        new runs of ``kind``, to be stored before the head."""
        runs = self._doc.dead_runs if kind == "dead" else self._doc.runs
        refs = runs.setdefault(queue, [])
        for start in range(0, len(jobs), run_jobs):
            chunk = jobs[start : start + run_jobs]
            ref, data = build_run(key_for(len(self.new_runs)), queue, kind, chunk)
            refs.append(ref)
            self.new_runs.append((ref.key, data))
        if kind != "dead":
            self._merges[queue] = RunMerge(refs)

    def keep_newest(self, queue: str, jobs: list[Job]) -> None:
        """Keep the jobs of ``queue``'s newest run (the last of ``jobs``, just written out):
        the next spill merges into it (see :meth:`with_tail`)."""
        last = self._doc.runs[queue][-1]
        self.run_contents[last.key] = jobs[-last.count :]

    def spill_keys(self, bound: int, key_for: Callable[[int], str], run_jobs: int) -> bool:
        """Move the idempotency keys of each queue with more than ``bound`` in the head into
        key runs; whether any moved."""
        keys = self._doc.keys
        if len(keys) <= bound:
            return False
        by_queue: dict[str, dict[str, KeyRecord]] = {}
        for slot, record in keys.items():
            by_queue.setdefault(slot.split("/", 1)[0], {})[slot] = record
        spilled = False
        for queue, records in by_queue.items():
            if len(records) <= bound:
                continue
            slots = sorted(records, key=lambda slot: records[slot].expires_at)
            for start in range(0, len(slots), run_jobs):
                chunk = {slot: records[slot] for slot in slots[start : start + run_jobs]}
                ref, data = build_key_run(key_for(len(self.new_runs)), queue, chunk)
                self._doc.key_runs.setdefault(queue, []).append(ref)
                self.new_runs.append((ref.key, data))
                self.key_contents[ref.key] = chunk  # its producer is the likeliest to ask
            for slot in slots:
                del keys[slot]
            spilled = True
        return spilled

    def _merge_groups(
        self, run_jobs: int, at_least: int
    ) -> list[tuple[str, RunKind, list[RunRef]]]:
        """Per queue and kind of run, the small runs worth merging (:func:`small_runs`)."""
        groups: list[tuple[str, RunKind, list[RunRef]]] = []
        where: list[tuple[dict[str, list[RunRef]], tuple[RunKind, ...]]] = [
            (self._doc.runs, ("ready", "timed")),
            (self._doc.dead_runs, ("dead",)),
        ]
        for runs, kinds in where:
            for queue, refs in runs.items():
                for kind in kinds:
                    group = small_runs(refs, kind, run_jobs, at_least)
                    if group:
                        groups.append((queue, kind, group))
        return groups

    def runs_to_merge(self, run_jobs: int, at_least: int) -> list[tuple[str, RunRef]]:
        """The runs :meth:`merge` would merge, as (queue, ref): to be read beforehand (off
        the commit path: the engine reads them in the background)."""
        groups = self._merge_groups(run_jobs, at_least)
        return [(queue, ref) for queue, _, group in groups for ref in group]

    def merge(self, key_for: Callable[[int], str], run_jobs: int, at_least: int) -> int:
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
            runs = self._doc.dead_runs if kind == "dead" else self._doc.runs
            gone = {ref.key for ref in at_hand}
            runs[queue] = [ref for ref in runs[queue] if ref.key not in gone] + [new]
            self.unused_runs += sorted(gone)  # dropped from the cache once this lands
            if kind != "dead":
                self._merges[queue] = RunMerge(runs[queue])
            merged += len(gone)
        return merged

    def take_dead(self, queue: str) -> list[Job] | None:
        """Take every dead letter of ``queue``'s dead runs (copies, for the head), dropping
        the runs; None when it has none."""
        jobs = [msgspec.structs.replace(job) for job in self.dead_run_jobs(queue)]
        refs = self._doc.dead_runs.pop(queue, [])
        self.unused_runs += [ref.key for ref in refs]
        return jobs if refs else None

    def take_dead_until(self, ref: RunRef, cutoff: float) -> list[Job]:
        """Take the dead letters at the front of the dead run ``ref`` that died at ``cutoff``
        or earlier."""
        return take_due(ref, self.contents(ref), cutoff)

    def drop_emptied_dead(self, queues: Iterable[str]) -> None:
        """Drop the dead runs of ``queues`` with nothing left."""
        for queue in queues:
            self._drop_emptied(self._doc.dead_runs, queue)

    def drop_runs(self, queue: str) -> list[Job]:
        """Drop every run of ``queue``; returns the jobs they still held."""
        doomed = self.run_jobs(queue)
        self.unused_runs += [ref.key for ref in self._doc.runs.pop(queue, [])]
        self._merges.pop(queue, None)
        return doomed

    def drop_dead_runs(self, queue: str) -> list[Job]:
        """Drop every dead run of ``queue``; returns the dead letters they held."""
        doomed = self.dead_run_jobs(queue)
        self.unused_runs += [ref.key for ref in self._doc.dead_runs.pop(queue, [])]
        return doomed

    def drop_key_runs(self, queue: str) -> None:
        """Drop every key run of ``queue`` (its idempotency keys are forgotten)."""
        self.unused_runs += [ref.key for ref in self._doc.key_runs.pop(queue, [])]

    def expire_key_runs(self, now: float) -> tuple[bool, float]:
        """Drop the key runs whose keys have all expired at ``now``; returns whether any was
        dropped and when the next one expires (inf: none left)."""
        dropped, upcoming = False, float("inf")
        key_runs = self._doc.key_runs
        for queue, refs in list(key_runs.items()):
            left = [ref for ref in refs if ref.expires > now]
            self.unused_runs += [ref.key for ref in refs if ref.expires <= now]
            upcoming = min([upcoming, *(ref.expires for ref in left)])
            if len(left) < len(refs):
                dropped = True
                if left:
                    key_runs[queue] = left
                else:
                    del key_runs[queue]
        return dropped, upcoming

    def drop_run(self, key: str) -> tuple[str, str, RunRef] | None:
        """Stop referring to the run or dead run ``key``; (its queue, what it was, its ref),
        or None if no queue refers to such a run."""
        for runs, what in ((self._doc.runs, "run"), (self._doc.dead_runs, "dead run")):
            for queue, refs in list(runs.items()):
                lost = next((ref for ref in refs if ref.key == key), None)
                if lost is None:
                    continue
                refs.remove(lost)
                if not refs:
                    del runs[queue]
                if runs is self._doc.runs:
                    self._merges.pop(queue, None)
                    if refs:
                        self._merges[queue] = RunMerge(refs)
                return queue, what, lost
        return None

    def drop_key_run(self, key: str) -> bool:
        """Stop referring to the key run ``key``; whether a queue did."""
        for queue, refs in list(self._doc.key_runs.items()):
            if any(ref.key == key for ref in refs):
                left = [ref for ref in refs if ref.key != key]
                if left:
                    self._doc.key_runs[queue] = left
                else:
                    del self._doc.key_runs[queue]
                return True
        return False


def _left_in(runs: dict[str, list[RunRef]], queue: str | None) -> list[tuple[str, RunRef]]:
    """The runs (of ``runs``) of ``queue``, of every queue when None, with jobs left."""
    names = list(runs) if queue is None else [queue]
    return [(q, r) for q in names for r in runs.get(q, []) if r.remaining]
