"""The live jobs of one namespace (those in the head), indexed for claims.

Claims are O(log n): each queue keeps a heap of ready jobs ordered by (priority, seq) and a
heap of timed jobs (delayed, backing off, or leased) ordered by ``visible_at``. Heap entries
are invalidated lazily: ``_entry[job_id]`` holds the one entry that is current for a job.
:class:`QueueIndex` is the only code that touches these heaps.

Encoding is incremental: each job's JSON is kept from the last encode and made again only for
the jobs changed since. Every change to a job passes through the index (a push, a forget, or
:meth:`QueueIndex.changed`), which marks it.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

import msgspec

from objq_broker.model.records import Job, OrderKey

#: A ready heap's entry: jobs come out by priority, then in the order they were enqueued.
ReadyEntry = tuple[int, int, str]  # (priority, seq, job id)
#: A timed heap's entry: jobs come out as they become visible (delay, backoff or lease end).
TimedEntry = tuple[float, int, str]  # (visible_at, seq, job id)
_job_encoder = msgspec.json.Encoder()


class QueueIndex:
    """The job table of the head and, per queue, its members and its ready and timed heaps.

    >>> index = QueueIndex([], ["emails"])
    >>> job = Job("j1", "emails", "hi", seq=1, enqueued_at=0.0, visible_at=0.0, max_attempts=5)
    >>> index.add(job)
    >>> index.schedule(job, now=0.0)
    >>> index.best_ready("emails"), index.pop_ready("emails").id
    ((0, 1), 'j1')
    """

    def __init__(self, jobs: Iterable[Job], queues: Iterable[str]) -> None:
        #: The live jobs, by id.
        self.jobs: dict[str, Job] = {job.id: job for job in jobs}
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
        self._raw: dict[str, msgspec.Raw] = {}
        self._stale: set[str] = set()
        #: Delayed (unleased) jobs pushed on each queue's timed heap, and (delayed jobs found,
        #: pushes) as of the last time :meth:`take_delayed` scanned it: a bound on those held.
        self._timed_pushes: dict[str, int] = {}
        self._timed_scanned: dict[str, tuple[int, int]] = {}
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

    def push_ready(self, job: Job) -> None:
        """Make ``job`` claimable now."""
        self.readied += 1
        self.readied_in[job.queue] = self.readied_in.get(job.queue, 0) + 1
        self._stale.add(job.id)
        entry: ReadyEntry = (job.priority, job.seq, job.id)
        self._entry[job.id] = entry
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
        members = self._members.get(job.queue)
        if members is not None:
            members.discard(job.id)

    def drop_queue(self, queue: str) -> None:
        """Forget ``queue``'s heaps and members (its jobs were forgotten one by one)."""
        self._members.pop(queue, None)
        self._ready.pop(queue, None)
        self._timed.pop(queue, None)

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

    def earliest_timed(self) -> float | None:
        """The earliest time on any timed heap, superseded entries included (a bound)."""
        times = [heap[0][0] for heap in self._timed.values() if heap]
        return min(times) if times else None

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
        """The ready jobs of ``queue`` in claim order when there are more than ``bound`` of
        them (none otherwise), to be written out: :meth:`forget` them, then
        :meth:`clear_ready`."""
        heap = self._ready.get(queue, [])
        if len(heap) <= bound:
            return []  # superseded entries only add to a heap: it cannot hold more live ones
        live = [entry for entry in heap if self._entry.get(entry[2]) == entry]
        if len(live) <= bound:
            return []
        return [self.jobs[entry[2]] for entry in sorted(live)]

    def clear_ready(self, queue: str) -> None:
        """Empty ``queue``'s ready heap, whose jobs were all forgotten."""
        self._ready.get(queue, []).clear()

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
        live = [e for e in heap if self._entry.get(e[2]) == e and self.jobs[e[2]].lease is None]
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

    def encoded_jobs(self) -> list[msgspec.Raw]:
        """The encoded JSON of every live job, re-encoding only those changed since the last
        call: a commit of a few ops on a deep queue costs a copy, not a full encode."""
        raw, jobs = self._raw, self.jobs
        for job_id in self._stale:
            job = jobs.get(job_id)
            if job is None:
                raw.pop(job_id, None)
            else:
                raw[job_id] = msgspec.Raw(_job_encoder.encode(job))
        self._stale.clear()
        # ``raw`` holds exactly the live jobs (in its own order; the order of jobs in the
        # document carries no meaning).
        return list(raw.values())
