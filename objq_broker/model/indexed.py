"""The live jobs of one namespace (those in the head), indexed for claims.

Claims are O(log n): each queue keeps a heap of ready jobs ordered by (priority, seq) and a
heap of timed jobs (delayed, backing off, or leased) ordered by ``visible_at``. Heap entries
are invalidated lazily: ``_entry[job_id]`` holds the one entry that is current for a job.
:class:`QueueIndex` is the only code that touches these heaps.

A queue whose jobs name groups (``docs/groups.md``) also keeps a :class:`GroupLines`: one
ready heap per group (its *line*), and a heap of the groups whose turn it may be, ordered by
(priority, jobs in flight, seq) of each group's best ready job. A claim pops a group there and
the best job of its line: O(log n + log g) for n jobs and g groups.

Encoding is incremental: each job's JSON is kept from the last encode and made again only for
the jobs changed since. Every change to a job passes through the index (a push, a forget, or
:meth:`QueueIndex.changed`), which marks it.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from typing import Literal

import msgspec

from objq_broker.model.encoding import refused_null
from objq_broker.model.records import Job, OrderKey, QueueConfig

#: A ready heap's entry: jobs come out by priority, then in the order they were enqueued.
ReadyEntry = tuple[int, int, str]  # (priority, seq, job id)
#: A timed heap's entry: jobs come out as they become visible (delay, backoff or lease end).
TimedEntry = tuple[float, int, str]  # (visible_at, seq, job id)
#: A group's place among its queue's groups: (priority, leased jobs or 0, seq, group) of its
#: best ready job; lowest first.
GroupEntry = tuple[int, int, int, str]
#: A group waiting for its jobs in runs: (priority, seq) of its best ready job in the head.
ParkedEntry = tuple[int, int, str]
#: What a job of a group holds of its group's share: a lease, or a backoff after an attempt.
Holding = Literal["leased", "backing"]
_job_encoder = msgspec.json.Encoder()


class GroupLines:
    """The ready jobs of one queue's groups, each group in its own line, and whose turn it is.

    A group is *placed* in one of two heaps, or in neither: the ready groups (by priority,
    then how many jobs it has leased when the queue is fair, then seq), or the parked ones,
    whose jobs in runs come first (by the order key of their best job in the head, woken
    once the runs' front passes it). A group with no ready job, or at its cap
    (``group_concurrency``), is in neither. Heap entries are invalidated lazily, as the
    index's: ``_place[group]`` holds the one current entry of each placed group.
    """

    def __init__(
        self,
        current: dict[str, ReadyEntry | TimedEntry],
        group_runs: dict[str, dict[str, int]],
        queue: str,
    ) -> None:
        self._current = current
        self._group_runs = group_runs
        self._queue = queue
        #: Each group's ready jobs in the head, best first (entries of the index's kind).
        self.lines: dict[str, list[ReadyEntry]] = {}
        #: Entries in the lines, superseded ones included (a bound on the ready jobs).
        self.entries = 0
        #: Jobs of each group leased, and leased or backing off after an attempt.
        self.leased: dict[str, int] = {}
        self.busy: dict[str, int] = {}
        #: The order key of the first job of the queue's ready runs; None: no runs.
        self.front: OrderKey | None = None
        self.cap: int | None = None
        self.fair = True
        self._ready: list[GroupEntry] = []
        self._parked: list[ParkedEntry] = []
        self._place: dict[str, GroupEntry | ParkedEntry] = {}

    @property
    def in_runs(self) -> dict[str, int]:
        """How many jobs of each group wait in the queue's ready runs (the state's counts)."""
        return self._group_runs.get(self._queue, {})

    def groups(self) -> int:
        """How many groups the lines hold state for (ready jobs or jobs in flight)."""
        return len(self.lines.keys() | self.busy.keys())

    def push(self, group: str, entry: ReadyEntry) -> None:
        heapq.heappush(self.lines.setdefault(group, []), entry)
        self.entries += 1
        self.place(group)

    def held(self, group: str, holding: Holding | None, change: int) -> None:
        """One job of ``group`` starts (``change`` 1) or stops (-1) ``holding``."""
        if holding is None:
            return
        counts = [self.busy] if holding == "backing" else [self.busy, self.leased]
        for count in counts:
            left = count.get(group, 0) + change
            if left > 0:
                count[group] = left
            else:
                count.pop(group, None)

    def at_cap(self, group: str) -> bool:
        return self.cap is not None and self.busy.get(group, 0) >= self.cap

    def place(self, group: str) -> None:
        """Put ``group`` where it belongs now (after its line, counts or runs changed)."""
        line = self.lines.get(group)
        while line and self._current.get(line[0][2]) != line[0]:
            heapq.heappop(line)
            self.entries -= 1
        if not line:
            self.lines.pop(group, None)
            self._place.pop(group, None)
            return
        if self.at_cap(group):
            self._place.pop(group, None)
            return
        priority, seq, _ = line[0]
        entry: GroupEntry | ParkedEntry
        if self.in_runs.get(group) and self.front is not None and (priority, seq) > self.front:
            entry = (priority, seq, group)
            if self._place.get(group) != entry:
                heapq.heappush(self._parked, entry)
        else:
            entry = (priority, self.leased.get(group, 0) if self.fair else 0, seq, group)
            if self._place.get(group) != entry:
                heapq.heappush(self._ready, entry)
        self._place[group] = entry

    def best(self) -> GroupEntry | None:
        """The group whose turn it is, parked groups the runs' front has passed woken first."""
        parked = self._parked
        while parked:
            top = parked[0]
            if self._place.get(top[2]) != top:
                heapq.heappop(parked)
            elif self.front is None or top[:2] < self.front or not self.in_runs.get(top[2]):
                heapq.heappop(parked)
                del self._place[top[2]]
                self.place(top[2])
            else:
                break
        ready = self._ready
        while ready and self._place.get(ready[0][3]) != ready[0]:
            heapq.heappop(ready)
        return ready[0] if ready else None

    def pop(self, group: str) -> str:
        """Take the best job of ``group``'s line (the group :meth:`best` gave): its id."""
        heapq.heappop(self._ready)
        del self._place[group]
        self.entries -= 1
        return heapq.heappop(self.lines[group])[2]

    def rebuild(self) -> None:
        """Place every group again (its queue's settings changed the order or the caps)."""
        self._ready.clear()
        self._parked.clear()
        self._place.clear()
        for group in list(self.lines):
            self.place(group)


class QueueIndex:
    """The job table of the head and, per queue, its members and its ready and timed heaps.

    >>> index = QueueIndex([], ["emails"])
    >>> job = Job("j1", "emails", "hi", seq=1, enqueued_at=0.0, visible_at=0.0, max_attempts=5)
    >>> index.add(job)
    >>> index.schedule(job, now=0.0)
    >>> index.best_ready("emails"), index.pop_ready("emails").id
    ((0, 1), 'j1')
    """

    def __init__(
        self,
        jobs: Iterable[Job],
        queues: Iterable[str] | dict[str, QueueConfig],
        group_runs: dict[str, dict[str, int]] | None = None,
    ) -> None:
        #: The live jobs, by id.
        self.jobs: dict[str, Job] = {job.id: job for job in jobs}
        #: The group lines of each queue whose jobs name groups or that has group settings.
        self._lines: dict[str, GroupLines] = {}
        #: Per queue, the jobs of each group in its ready runs (the state's own dict).
        self._group_runs: dict[str, dict[str, int]] = {} if group_runs is None else group_runs
        #: What each job of a group holds of its group's share.
        self._holding: dict[str, Holding] = {}
        #: Where a claim over several queues is in its rotation: each queue's pass.
        self._passes: dict[str, float] = {}
        #: The pass the last queue served started from: where an idle queue starts again.
        self._now = 0.0
        self._ready: dict[str, list[ReadyEntry]] = {}
        self._timed: dict[str, list[TimedEntry]] = {}
        self._entry: dict[str, ReadyEntry | TimedEntry] = {}
        self._members: dict[str, set[str]] = {name: set() for name in queues}
        #: Jobs made claimable since this index was built (enqueued, released, expired, due):
        #: a broker wakes waiting claimers only when it moves, not after every ack.
        self.readied = 0
        #: The same, per queue: a broker wakes as many claimers parked on a queue as it got.
        self.readied_in: dict[str, int] = {}
        #: Encoded JSON of each job as of the last encode, and the ids changed since.
        self._raw: dict[str, bytes] = {}
        self._stale: set[str] = set()
        #: The jobs whose JSON holds a field written as a refused null (``model.encoding``).
        self._unclean: set[str] = set()
        #: Delayed (unleased) jobs pushed on each queue's timed heap, and (delayed jobs found,
        #: pushes) as of the last time :meth:`take_delayed` scanned it: a bound on those held.
        self._timed_pushes: dict[str, int] = {}
        self._timed_scanned: dict[str, tuple[int, int]] = {}
        if isinstance(queues, dict):
            for queue, config in queues.items():
                if config.has_group_rules():
                    self.set_rules(queue, config)
        # A queue whose grouped jobs are all in runs claims by groups too: a job that leaves
        # its runs must leave its group's count (``loaded``).
        for queue in self._group_runs:
            self._lines_of(queue)
        for job in self.jobs.values():
            self._members.setdefault(job.queue, set()).add(job.id)
            self.push_timed(job)

    def add_queue(self, queue: str) -> None:
        """Index ``queue`` (declared, with no job yet): a spill looks at it from now on."""
        self._members.setdefault(queue, set())

    def queues(self) -> list[str]:
        """Every queue the index has members for (declared, or holding jobs)."""
        return list(self._members)

    def timed_queues(self) -> list[str]:
        """Every queue that has had a timed heap."""
        return list(self._timed)

    def jobs_of(self, queue: str) -> list[Job]:
        """The live jobs of ``queue``, in no particular order."""
        return [self.jobs[job_id] for job_id in self._members.get(queue, ())]

    def add(self, job: Job) -> None:
        """Put ``job`` in the table; a push (:meth:`schedule`) then gives it its place."""
        self.jobs[job.id] = job
        self._members.setdefault(job.queue, set()).add(job.id)

    def push_timed(self, job: Job) -> None:
        """Wait for ``job`` until its ``visible_at`` (a delay, a backoff or a lease)."""
        self._stale.add(job.id)
        entry: TimedEntry = (job.visible_at, job.seq, job.id)
        self._entry[job.id] = entry
        heapq.heappush(self._timed.setdefault(job.queue, []), entry)
        if job.lease is None:  # a delayed job; a lease is cleared only by pushing the job again
            self._timed_pushes[job.queue] = self._timed_pushes.get(job.queue, 0) + 1
        if job.group is not None:
            leased = job.lease is not None
            self._hold(job, "leased" if leased else "backing" if job.attempts else None)

    def push_ready(self, job: Job) -> None:
        """Make ``job`` claimable now."""
        self.readied += 1
        self.readied_in[job.queue] = self.readied_in.get(job.queue, 0) + 1
        self._stale.add(job.id)
        entry: ReadyEntry = (job.priority, job.seq, job.id)
        self._entry[job.id] = entry
        if job.group is not None:
            self._hold(job, None)
            self._lines_of(job.queue).push(job.group, entry)
        else:
            heapq.heappush(self._ready.setdefault(job.queue, []), entry)

    def schedule(self, job: Job, now: float) -> None:
        """Push an unleased ``job`` where it belongs at ``now``: ready, or timed."""
        if job.lease is None and job.visible_at <= now:
            self.push_ready(job)
        else:
            self.push_timed(job)

    def changed(self, job: Job) -> None:
        """``job`` changed in place (not its place in a heap): encode it again."""
        self._stale.add(job.id)

    def forget(self, job: Job) -> None:
        """``job`` leaves the head; its heap entries are dropped when they surface."""
        self._stale.add(job.id)
        self._entry.pop(job.id, None)
        self.jobs.pop(job.id, None)
        if job.group is not None:
            self._hold(job, None)
        members = self._members.get(job.queue)
        if members is not None:
            members.discard(job.id)

    def drop_queue(self, queue: str) -> None:
        """Forget ``queue``'s heaps and members (its jobs were forgotten one by one)."""
        self._members.pop(queue, None)
        self._ready.pop(queue, None)
        self._timed.pop(queue, None)
        self._lines.pop(queue, None)

    def best_ready(self, queue: str) -> OrderKey | None:
        """The (priority, seq) of the best ready job of ``queue``; superseded entries at the
        top are dropped on the way."""
        heap = self._ready.get(queue)
        while heap and self._entry.get(heap[0][2]) != heap[0]:
            heapq.heappop(heap)
        return heap[0][:2] if heap else None

    def pop_ready(self, queue: str) -> Job:
        """Take the best ready job of ``queue`` (the caller checked :meth:`best_ready`)."""
        entry = heapq.heappop(self._ready[queue])
        return self.jobs[entry[2]]

    def next_visible(self, queue: str) -> float | None:
        """When the next timed job of ``queue`` becomes claimable; None if it has none.
        Superseded entries at the top are dropped on the way, so a parked claimer is never
        woken again and again for a job that moved."""
        heap = self._timed.get(queue)
        while heap and self._entry.get(heap[0][2]) != heap[0]:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def pop_due(self, queue: str, now: float) -> list[Job]:
        """Take every timed job of ``queue`` whose ``visible_at`` has come."""
        heap = self._timed.get(queue)
        due: list[Job] = []
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            if self._entry.get(entry[2]) == entry:
                # Consume the entry: a heartbeat at the same instant may have pushed a twin.
                del self._entry[entry[2]]
                due.append(self.jobs[entry[2]])
        return due

    def ready_past(self, queue: str, bound: int) -> list[Job]:
        """The ready jobs of ``queue`` to write out, in claim order, when there are more
        than ``bound`` of them (none otherwise): :meth:`forget` them, then
        :meth:`drop_forgotten`. All of them, unless the queue's jobs name groups: then the
        groups with the most ready jobs, whole, until at most half of ``bound`` is left, so
        quiet groups keep their jobs in the head and their turn (a job in runs waits for the
        runs' order, behind a large group's backlog)."""
        heap = self._ready.get(queue, [])
        lines = self._lines.get(queue)
        if len(heap) + (0 if lines is None else lines.entries) <= bound:
            return []  # superseded entries only add to a heap: it cannot hold more live ones
        if lines is not None:
            heap = heap + [entry for line in lines.lines.values() for entry in line]
        live = [entry for entry in heap if self._entry.get(entry[2]) == entry]
        if len(live) <= bound:
            return []
        if lines is not None:
            live = self._largest_groups(live, len(live) - bound // 2)
        return [self.jobs[entry[2]] for entry in sorted(live)]

    def _largest_groups(self, live: list[ReadyEntry], at_least: int) -> list[ReadyEntry]:
        """The entries of the groups with the most of ``live`` (jobs of no group count as
        one group), whole, until they are ``at_least``."""
        by_group: dict[str | None, list[ReadyEntry]] = {}
        for entry in live:
            by_group.setdefault(self.jobs[entry[2]].group, []).append(entry)
        chosen: list[ReadyEntry] = []
        for entries in sorted(by_group.values(), key=len, reverse=True):
            if len(chosen) >= at_least:
                break
            chosen += entries
        return chosen

    def drop_forgotten(self, queue: str) -> None:
        """Drop the entries of ``queue``'s ready heaps whose jobs were forgotten (written out
        into runs), and place its groups again."""
        heap = self._ready.get(queue)
        if heap is not None:
            heap[:] = [entry for entry in heap if self._entry.get(entry[2]) == entry]
            heapq.heapify(heap)
        lines = self._lines.get(queue)
        if lines is not None:
            for group, line in list(lines.lines.items()):
                kept = [entry for entry in line if self._entry.get(entry[2]) == entry]
                lines.entries -= len(line) - len(kept)
                line[:] = kept
                heapq.heapify(line)
                lines.place(group)

    def take_delayed(self, queue: str, bound: int) -> list[Job]:
        """The delayed and backing-off jobs of ``queue`` (not leased ones: their leases
        change in the head) in (visible_at, seq) order when there are more than ``bound`` of
        them, forgotten (to be written out); none otherwise."""
        # The heap keeps the entries of acked jobs until their lease time passes (a busy
        # queue: thousands), so it is scanned only when enough delayed jobs were pushed since
        # the last scan to take those it found then past the bound.
        pushes = self._timed_pushes.get(queue, 0)
        found, pushes_then = self._timed_scanned.get(queue, (0, 0))
        if found + pushes - pushes_then <= bound:
            return []
        heap = self._timed.get(queue, [])
        live = [
            e
            for e in heap
            if self._entry.get(e[2]) == e
            and self.jobs[e[2]].lease is None
            and self._holding.get(e[2]) is None
        ]
        taken: list[Job] = []
        if len(live) > bound:
            taken = [self.jobs[e[2]] for e in sorted(live)]
            for job in taken:
                self.forget(job)
            heap[:] = [e for e in heap if self._entry.get(e[2]) == e]
            heapq.heapify(heap)
            live = []
        self._timed_scanned[queue] = (len(live), pushes)
        return taken

    # --- groups (docs/groups.md) -------------------------------------------------------

    def _lines_of(self, queue: str) -> GroupLines:
        lines = self._lines.get(queue)
        if lines is None:
            lines = GroupLines(self._entry, self._group_runs, queue)
            self._lines[queue] = lines
        return lines

    def _hold(self, job: Job, holding: Holding | None) -> None:
        """``job`` (of a group) now holds ``holding`` of its group's share; the group moves."""
        assert job.group is not None
        old = self._holding.pop(job.id, None)
        # A backing-off job holds its group's turn only under a cap; it is never spilled then.
        if holding == "backing" and self._rules_cap(job.queue) is None:
            holding = None
        if holding is not None:
            self._holding[job.id] = holding
        if old == holding:
            return
        lines = self._lines_of(job.queue)
        lines.held(job.group, old, -1)
        lines.held(job.group, holding, 1)
        lines.place(job.group)

    def _rules_cap(self, queue: str) -> int | None:
        lines = self._lines.get(queue)
        return None if lines is None else lines.cap

    def grouped(self, queue: str) -> bool:
        """Whether ``queue`` has group lines: its claims then go through :meth:`best_group`."""
        return queue in self._lines

    def set_rules(self, queue: str, config: QueueConfig) -> None:
        """``queue``'s group settings (its cap, whether it is fair) are ``config``'s."""
        lines = self._lines_of(queue)
        lines.cap, lines.fair = config.group_cap, config.fair
        lines.rebuild()

    def runs_front(self, queue: str, front: OrderKey | None) -> None:
        """The first job of ``queue``'s ready runs sorts at ``front`` (None: no runs left)."""
        lines = self._lines.get(queue)
        if lines is None:
            return
        lines.front = front
        if front is None:
            self._group_runs.pop(queue, None)  # nothing is left in runs, whatever they said

    def spilled(self, queue: str, jobs: Iterable[Job]) -> None:
        """``jobs`` of ``queue`` were written to its ready runs: their groups count them."""
        counts: dict[str, int] = {}
        for job in jobs:
            if job.group is not None:
                counts[job.group] = counts.get(job.group, 0) + 1
        if counts:
            self.run_groups(queue, counts)

    def run_groups(self, queue: str, counts: Mapping[str, int]) -> None:
        """``queue``'s ready runs hold ``counts`` more jobs of these groups."""
        self._lines_of(queue)  # its claims go by groups from now on, counting what leaves
        held = self._group_runs.setdefault(queue, {})
        for group, count in counts.items():
            held[group] = held.get(group, 0) + count

    def loaded(self, job: Job) -> None:
        """``job`` left its queue's ready runs for the head: its group counts it no more."""
        if job.group is None:
            return
        counts = self._group_runs.get(job.queue)
        if counts is None or job.group not in counts:
            return
        counts[job.group] -= 1
        if counts[job.group] <= 0:
            del counts[job.group]
            if not counts:
                del self._group_runs[job.queue]
            lines = self._lines.get(job.queue)
            if lines is not None:
                lines.place(job.group)

    def best_group(self, queue: str) -> GroupEntry | None:
        """The (priority, share, seq, group) of the group whose turn it is in ``queue``."""
        lines = self._lines.get(queue)
        return None if lines is None else lines.best()

    def pop_group(self, queue: str, group: str) -> Job:
        """Take the best ready job of ``group`` (the caller checked :meth:`best_group`)."""
        return self.jobs[self._lines[queue].pop(group)]

    def share(self, queue: str, group: str | None) -> int:
        """How many jobs ``group`` has leased, as its queue's order counts it (0: not fair)."""
        lines = self._lines.get(queue)
        if group is None or lines is None or not lines.fair:
            return 0
        return lines.leased.get(group, 0)

    def at_cap(self, queue: str, group: str | None) -> bool:
        """Whether ``group`` of ``queue`` holds as many jobs as its cap allows."""
        lines = self._lines.get(queue)
        return group is not None and lines is not None and lines.at_cap(group)

    def held_by_groups(self, queue: str) -> tuple[dict[str, int], dict[str, int]]:
        """Per group of ``queue``: jobs leased, and jobs leased or backing off (under a cap)."""
        lines = self._lines.get(queue)
        return ({}, {}) if lines is None else (dict(lines.leased), dict(lines.busy))

    def group_count(self, queue: str) -> int:
        """How many groups of ``queue`` the index keeps state for."""
        lines = self._lines.get(queue)
        return 0 if lines is None else lines.groups()

    def rotation(self, queues: list[str]) -> list[str]:
        """``queues`` in the order a claim over them should try them: the one least served
        for its weight first (stride scheduling: each job a claim takes from a queue moves
        its pass on by 1 / weight; a queue idle for a while starts again from the pass of the
        last queue served, so it gets its turn but no burst)."""
        passes = self._passes
        order = sorted(range(len(queues)), key=lambda i: (passes.get(queues[i], self._now), i))
        return [queues[i] for i in order]

    def served(self, queue: str, weight: int) -> None:
        """A claim took a job of ``queue``, whose weight is ``weight``: its turn comes later."""
        start = max(self._passes.get(queue, self._now), self._now)
        self._now = start
        self._passes[queue] = start + 1.0 / weight

    def encoded_jobs(self) -> tuple[list[bytes], bool]:
        """The encoded JSON of every live job, re-encoding only those changed since the last
        call: a commit of a few ops on a deep queue costs a copy, not a full encode. And
        whether none of them holds a field written as a refused null: each is searched once,
        when it is encoded, not at every commit that keeps it."""
        raw, jobs, unclean = self._raw, self.jobs, self._unclean
        for job_id in self._stale:
            job = jobs.get(job_id)
            if job is None:
                raw.pop(job_id, None)
                unclean.discard(job_id)
                continue
            encoded = raw[job_id] = _job_encoder.encode(job)
            if refused_null(encoded) is None:
                unclean.discard(job_id)
            else:
                unclean.add(job_id)
        self._stale.clear()
        # ``raw`` holds exactly the live jobs (in its own order; the order of jobs in the
        # document carries no meaning).
        return list(raw.values()), not unclean
