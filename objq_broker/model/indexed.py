"""The queue model's base: one namespace's jobs, indexed for claims, and their encoding.

Claims are O(log n): each queue keeps a heap of ready jobs ordered by (priority, seq) and a
heap of timed jobs (delayed, backing off, or leased) ordered by ``visible_at``. Heap entries
are invalidated lazily: ``_entry[job_id]`` holds the one entry that is current for a job.

Encoding is incremental: each job's JSON is kept from the last encode and made again only for
the jobs changed since (every change passes through an index update, which marks the job).
The layers above (:mod:`~objq_broker.model.state` lists them) only change jobs through these
indexes.
"""

from __future__ import annotations

import bisect
import heapq

import msgspec

from objq_broker.errors import QueueNotFound
from objq_broker.model.bodies import split_ref
from objq_broker.model.encoding import encode_state
from objq_broker.model.records import FORMAT_VERSION, Job, KeyRecord, QueueConfig, RunRef, StateDoc
from objq_broker.model.runs import RunMerge, run_is_due
from objq_broker.model.values import Finished

#: A ready heap's entry: jobs come out by priority, then in the order they were enqueued.
ReadyEntry = tuple[int, int, str]  # (priority, seq, job id)
#: A timed heap's entry: jobs come out as they become visible (delay, backoff or lease end).
TimedEntry = tuple[float, int, str]  # (visible_at, seq, job id)
_job_encoder = msgspec.json.Encoder()


class IndexedState:
    """The bottom layer of :class:`~objq_broker.model.state.QueueState`: the job table, the
    ready and timed heaps of each queue, queue settings, and encoding."""

    def __init__(self, doc: StateDoc | None = None) -> None:
        self.doc = doc if doc is not None else StateDoc(format=FORMAT_VERSION)
        self.jobs: dict[str, Job] = {job.id: job for job in self.doc.jobs}
        self.dead: dict[str, Job] = {job.id: job for job in self.doc.dead}
        self._ready: dict[str, list[ReadyEntry]] = {}
        self._timed: dict[str, list[TimedEntry]] = {}
        self._entry: dict[str, ReadyEntry | TimedEntry] = {}
        self._members: dict[str, set[str]] = {name: set() for name in self.doc.queues}
        #: Jobs that left the hot state since the last commit, oldest first.
        self.finished: list[Finished] = []
        #: True once a transition changed something that must be written.
        self.dirty = False
        #: Jobs made claimable since this state was built (enqueued, released, expired, due):
        #: a broker wakes waiting claimers only when it moves, not after every ack.
        self.readied = 0
        #: The same, per queue: a broker wakes as many claimers parked on a queue as it got.
        self.readied_in: dict[str, int] = {}
        #: Jobs enqueued since the last commit whose bodies are to leave the state.
        self.new_bodies: list[Job] = []
        #: Bodies objects no job refers to any more: delete them once the commit landed.
        self.unused_bodies: list[str] = []
        #: Encoded JSON of each job as of the last encode, and the ids changed since. Every
        #: change to a job passes through an index update (or ``externalize``), which marks it.
        self._raw: dict[str, msgspec.Raw] = {}
        self._stale: set[str] = set()
        #: No dead letter or idempotency key expires before this time (-inf: not yet known).
        self._sweep_at = float("-inf")
        #: Each queue's ready runs (the backlog kept out of the head, ``docs/segments.md``).
        self._runs = {queue: RunMerge(refs) for queue, refs in self.doc.runs.items()}
        #: The jobs of runs read so far, by key: the engine's cache (runs never change). A
        #: transition that needs a run finds it here; :func:`~objq_broker.model.ops.runs_needed`
        #: says which ones a batch needs.
        self.run_contents: dict[str, list[Job]] = {}
        #: The same for key runs (idempotency keys out of the head).
        self.key_contents: dict[str, dict[str, KeyRecord]] = {}
        #: Delayed (unleased) jobs pushed on each queue's timed heap, and (delayed jobs found,
        #: pushes) as of the last time :meth:`spill` scanned it: a bound on those it holds.
        self._timed_pushes: dict[str, int] = {}
        self._timed_scanned: dict[str, tuple[int, int]] = {}
        #: Runs :meth:`spill` made for this commit: written (create-only) before the head.
        self.new_runs: list[tuple[str, bytes]] = []
        #: Runs whose jobs are all gone: delete them once the commit landed.
        self.unused_runs: list[str] = []
        #: Runs a staged write names that storage does not hold or that do not decode, with
        #: why (the engine reads them before the write is applied): the write is refused.
        self.unreadable_runs: dict[str, str] = {}
        #: Queues deleted (or expired) since the last commit: their kombu bindings are
        #: removed once the commit landed.
        self.removed_queues: list[str] = []
        #: Whether noting a queue's use is worth a write of its own. The elected broker, the
        #: only writer, keeps its marks in memory until its next commit (:meth:`hold_marks`).
        self.write_touches = True
        for job in self.jobs.values():
            self._members.setdefault(job.queue, set()).add(job.id)
            self._push_timed(job)

    def _push_timed(self, job: Job) -> None:
        self._stale.add(job.id)
        entry: TimedEntry = (job.visible_at, job.seq, job.id)
        self._entry[job.id] = entry
        heapq.heappush(self._timed.setdefault(job.queue, []), entry)
        if job.lease is None:  # a delayed job; a lease is cleared only by pushing the job again
            self._timed_pushes[job.queue] = self._timed_pushes.get(job.queue, 0) + 1

    def _push_ready(self, job: Job) -> None:
        self.readied += 1
        self.readied_in[job.queue] = self.readied_in.get(job.queue, 0) + 1
        self._stale.add(job.id)
        entry: ReadyEntry = (job.priority, job.seq, job.id)
        self._entry[job.id] = entry
        heapq.heappush(self._ready.setdefault(job.queue, []), entry)

    def _schedule(self, job: Job, now: float) -> None:
        if job.lease is None and job.visible_at <= now:
            self._push_ready(job)
        else:
            self._push_timed(job)

    def _forget(self, job: Job) -> None:
        self._stale.add(job.id)
        self._entry.pop(job.id, None)
        self.jobs.pop(job.id, None)
        members = self._members.get(job.queue)
        if members is not None:
            members.discard(job.id)

    def next_visible(self, queue: str) -> float | None:
        """When the next timed job of ``queue`` (delayed, backing off or leased) becomes
        claimable; None if it has none. Superseded entries at the top are dropped on the way,
        so a parked claimer is never woken again and again for a job that moved."""
        heap = self._timed.get(queue)
        while heap and self._entry.get(heap[0][2]) != heap[0]:
            heapq.heappop(heap)
        times = [heap[0][0]] if heap else []
        times += [ref.next[0] for ref in self.doc.runs.get(queue, []) if ref.kind == "timed"]
        return min(times, default=None)

    def _due(self, queue: str, now: float) -> list[Job]:
        """Pop every timed job of ``queue`` whose ``visible_at`` has come."""
        heap = self._timed.get(queue)
        due: list[Job] = []
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            if self._entry.get(entry[2]) == entry:
                # Consume the entry: a heartbeat at the same instant may have pushed a twin.
                del self._entry[entry[2]]
                due.append(self.jobs[entry[2]])
        return due

    def _due_in(self, ref: RunRef, now: float) -> list[Job]:
        """The jobs of the timed run ``ref`` due at ``now`` and not yet promoted."""
        if ref.next[0] > now:
            return []
        jobs = self._contents(ref)
        end = bisect.bisect_right(jobs, now, lo=ref.taken, key=lambda job: job.visible_at)
        return jobs[ref.taken : end]

    def due_runs(self, now: float) -> list[tuple[str, RunRef]]:
        """The timed runs (queue, ref) whose next job is due at ``now``."""
        runs = self.doc.runs.items()
        return [(queue, r) for queue, refs in runs for r in refs if run_is_due(r, now)]

    def _contents(self, ref: RunRef) -> list[Job]:
        """The jobs of ``ref``, which must have been read first
        (:func:`~objq_broker.model.ops.runs_needed` says which)."""
        jobs = self.run_contents.get(ref.key)
        if jobs is None:
            raise KeyError(f"run {ref.key} was not read before the operation that needs it")
        return jobs

    def config(self, queue: str) -> QueueConfig:
        found = self.doc.queues.get(queue)
        if found is None:
            raise QueueNotFound(self.not_declared(queue))
        return found

    def not_declared(self, queue: str) -> str:
        """Why ``queue`` cannot be used: it is not declared (and how to declare it)."""
        return (
            f"queue {queue!r} is not declared; declared: {self.queue_names()}; "
            f"declare it first (objq declare {queue}, or Queue.declare({queue!r}))"
        )

    def queue_names(self) -> list[str]:
        return sorted(self.doc.queues)

    def _drop_body(self, job: Job) -> None:
        """``job`` left the state for good: its bodies object loses one reference."""
        if job.ref is None:
            return
        key, _ = split_ref(job.ref)
        left = self.doc.bodies.get(key, 0) - 1
        if left > 0:
            self.doc.bodies[key] = left
        else:
            self.doc.bodies.pop(key, None)
            self.unused_bodies.append(key)

    def new_bodies_content(self) -> list[tuple[str, str]]:
        """``(job id, body)`` of what :meth:`externalize` would move now (to recognise a
        bodies object an earlier try of the same commit already wrote)."""
        return [
            (job.id, job.body)
            for job in self.new_bodies
            if job.ref is None and (job.id in self.jobs or job.id in self.dead)
        ]

    def keep_bodies_inline(self) -> None:
        """Leave the large bodies enqueued since the last commit inside the state (it is
        small enough): nothing to move out."""
        self.new_bodies.clear()

    def externalize(self, key: str) -> list[tuple[str, bool]]:
        """Move the large bodies enqueued since the last commit into bodies object ``key``;
        returns its entries (to be written before the state that refers to them)."""
        entries: list[tuple[str, bool]] = []
        for job in self.new_bodies:
            if job.ref is not None or (job.id not in self.jobs and job.id not in self.dead):
                continue  # finished within this very batch: its record keeps the body
            job.ref = f"{key}#{len(entries)}"
            entries.append((job.body, job.b64))
            job.body = ""
            self._stale.add(job.id)
        self.new_bodies.clear()
        if entries:
            self.doc.bodies[key] = len(entries)
        return entries

    def to_doc(self) -> StateDoc:
        self.doc.format = self.doc.needed_format()
        self.doc.jobs = list(self.jobs.values())
        self.doc.dead = list(self.dead.values())
        return self.doc

    def encode(self) -> bytes:
        """The stored form of :meth:`to_doc`, re-encoding only the jobs that changed: a commit
        of a few ops on a deep queue costs a copy of the state, not a full encode."""
        raw, jobs = self._raw, self.jobs
        for job_id in self._stale:
            job = jobs.get(job_id)
            if job is None:
                raw.pop(job_id, None)
            else:
                raw[job_id] = msgspec.Raw(_job_encoder.encode(job))
        self._stale.clear()
        doc = self.doc
        doc.format = doc.needed_format()
        # msgspec encodes what a field holds: Raw fragments splice in as they are, so a deep
        # queue costs a copy, not a Python loop. ``raw`` holds exactly the live jobs (in its own
        # order; the order of jobs in the document carries no meaning).
        doc.jobs = list(raw.values())  # type: ignore[arg-type]
        doc.dead = [msgspec.Raw(_job_encoder.encode(job)) for job in self.dead.values()]  # type: ignore[misc]
        try:
            return encode_state(doc)
        finally:
            doc.jobs, doc.dead = [], []  # to_doc() builds them when asked
