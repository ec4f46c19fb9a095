"""The queue model: pure transitions over one namespace's state.

Nothing here does I/O, reads a clock or draws a random number: the time (``now``), new job ids,
lease tokens and jitter are all passed in, so an operation replayed after a failed write does
exactly what it did the first time.

Every transition checks everything it needs *before* it changes anything, so one refused
operation (:class:`~objq_broker.errors.LeaseLost`, ...) leaves the state as it was and never
spoils the batch it came in.

:class:`QueueState` is built in layers, a module each, each using only the ones before it:

* :mod:`~objq_broker.model.indexed`: the job table, the heaps claims use, and encoding;
* :mod:`~objq_broker.model.backlog`: the backlog kept out of the head in runs;
* :mod:`~objq_broker.model.lifecycle`: declaring, configuring, expiring and deleting queues;
* :mod:`~objq_broker.model.producing`: enqueueing, staged writes and idempotency keys;
* :mod:`~objq_broker.model.leases`: claims, heartbeats, acks, nacks, dead-lettering, expiry;
* this module: dead letters, reading, and the broker's session marks.

The values they take and give (:class:`~objq_broker.model.values.NewJob`, ...) are in
:mod:`~objq_broker.model.values`.
"""

from __future__ import annotations

import hashlib

from objq_broker.errors import JobNotFound
from objq_broker.model.leases import LeasesState
from objq_broker.model.records import Job, JobState, QueueConfig, SessionMark
from objq_broker.model.runs import order_key
from objq_broker.model.values import NewJob, QueueStats, finished_job, snapshot, with_id
from objq_broker.model.workers import Worker, workers


class QueueState(LeasesState):
    """One namespace's jobs, dead letters, queue settings and idempotency keys, indexed.

    >>> state = QueueState()
    >>> _ = state.enqueue([NewJob(id="j1", queue="emails", body="hi")], now=0.0)
    >>> [job.id for job in state.claim("emails", ["token-1"], "worker-1", now=1.0)]
    ['j1']
    """

    def dead_letters(self, queue: str) -> list[Job]:
        """Dead letters of ``queue`` by death time, those in dead runs (read first) included."""
        self.config(queue)
        found = [snapshot(job) for job in self.dead.values() if job.queue == queue]
        found += [snapshot(job) for job in self.dead_run_jobs(queue)]
        return sorted(found, key=lambda job: order_key("dead", job))

    def _dead_ids(self, queue: str, ids: list[str] | None) -> list[str]:
        """The dead letters of ``queue`` that ``ids`` name (all when None), brought into the
        head if they are in dead runs; nothing changes when one of them is not found."""
        self.config(queue)
        in_runs = {job.id for job in self.dead_run_jobs(queue)}
        if ids is None:
            self._unspill_dead(queue)
            return [i for i, job in self.dead.items() if job.queue == queue]
        missing = [
            i
            for i in ids
            if i not in in_runs and (i not in self.dead or self.dead[i].queue != queue)
        ]
        if missing:
            raise JobNotFound(f"queue {queue!r}: no dead letters with ids {missing}")
        if in_runs.intersection(ids):
            self._unspill_dead(queue)
        return list(dict.fromkeys(ids))

    def retry_dead(self, queue: str, ids: list[str] | None, now: float) -> list[str]:
        """Put dead letters back at the end of their queue with a fresh attempt count."""
        chosen = self._dead_ids(queue, ids)
        for job_id in chosen:
            job = self.dead.pop(job_id)
            self.doc.seq += 1
            job.seq = self.doc.seq
            job.attempts = 0
            job.visible_at = now
            job.finished_at = None
            self.jobs[job.id] = job
            self._members.setdefault(queue, set()).add(job.id)
            self._push_ready(job)
        if chosen:
            self.dirty = True
        return chosen

    def purge_dead(self, queue: str, ids: list[str] | None) -> int:
        chosen = self._dead_ids(queue, ids)
        for job_id in chosen:
            self._drop_body(self.dead.pop(job_id))
        if chosen:
            self.dirty = True
        return len(chosen)

    def stats(self, queue: str, now: float) -> QueueStats:
        self.config(queue)
        ready = delayed = in_flight = 0
        oldest: float | None = None
        for job_id in self._members.get(queue, ()):
            job = self.jobs[job_id]
            state = job.state_at(now)
            if state == "in-flight":
                in_flight += 1
            elif state == "delayed":
                delayed += 1
            else:
                ready += 1
                oldest = job.enqueued_at if oldest is None else min(oldest, job.enqueued_at)
        runs = self._runs.get(queue)
        if runs is not None and len(runs):
            ready += len(runs)
            first = runs.oldest()
            if first is not None:
                oldest = first if oldest is None else min(oldest, first)
        for ref in self.doc.runs.get(queue, []):
            if ref.kind != "timed" or not ref.remaining:
                continue
            due = self._due_in(ref, now)
            ready += len(due)
            delayed += ref.remaining - len(due)
            if due:
                first = min(job.enqueued_at for job in due)
                oldest = first if oldest is None else min(oldest, first)
        dead = sum(1 for job in self.dead.values() if job.queue == queue)
        dead += sum(ref.remaining for _, ref in self.dead_runs_of(queue))
        age = None if oldest is None else max(now - oldest, 0.0)
        return QueueStats(queue, ready, delayed, in_flight, dead, age)

    def workers(self, now: float) -> list[Worker]:
        """The lease holders at work and those gone lately (:mod:`objq_broker.model.workers`)."""
        return workers(self.jobs.values(), self.doc.gone, now)

    def find(self, job_id: str, now: float) -> tuple[JobState, Job] | None:
        """A job's state ('ready', 'delayed', 'in-flight' or 'dead') and a copy of it."""
        job = self.jobs.get(job_id) or self._in_runs(job_id)
        if job is not None:
            return job.state_at(now), snapshot(job)
        dead = self.dead.get(job_id) or self._in_dead_runs(job_id)
        return None if dead is None else ("dead", snapshot(dead))

    def _in_runs(self, job_id: str, queue: str | None = None) -> Job | None:
        """The job ``job_id`` if it waits in a run (of ``queue``; any when None) that was read.
        Lookups that must be exact (``FindJob``, an idempotency key) have their runs read
        first (:func:`~objq_broker.model.ops.runs_needed`)."""
        if not self.doc.runs:
            return None
        return with_id(self.run_jobs(queue, read_only=True), job_id)

    def list_jobs(
        self, queue: str, now: float, state: JobState | None = None, limit: int | None = None
    ) -> list[tuple[JobState, Job]]:
        """Jobs of ``queue`` in claim order (dead letters by death time), optionally filtered."""
        self.config(queue)
        rows: list[tuple[JobState, Job]] = []
        if state != "dead":
            members = [self.jobs[i] for i in self._members.get(queue, ())]
            live = sorted(
                members + (self.run_jobs(queue) if queue in self.doc.runs else []),
                key=lambda job: (job.visible_at > now, job.priority, job.seq),
            )
            rows = [(job.state_at(now), snapshot(job)) for job in live]
            if state is not None:
                rows = [row for row in rows if row[0] == state]
        if state in (None, "dead"):
            rows += [("dead", job) for job in self.dead_letters(queue)]
        return rows if limit is None else rows[:limit]

    def session_applied(self, client: str, seq: int) -> bool:
        """Whether request ``seq`` of broker client ``client`` has already changed the state."""
        mark = self.doc.sessions.get(session_key(client))
        return mark is not None and seq <= mark.seq

    def mark_session(self, client: str, seq: int, now: float, ttl: float) -> None:
        """Remember that request ``seq`` of ``client`` changed the state; forget clients that
        sent nothing that changed it for ``ttl`` seconds."""
        sessions = self.doc.sessions
        for old in [c for c, mark in sessions.items() if mark.at < now - ttl]:
            del sessions[old]
        sessions[session_key(client)] = SessionMark(seq, now)
        self.dirty = True

    def enqueued(self, items: list[NewJob], now: float) -> list[Job]:
        """What an enqueue of ``items`` that was already applied returned: each job as it is
        now, or as it was asked for when it has already finished."""
        found: list[Job] = []
        for item in items:
            job = self.jobs.get(item.id) or self.dead.get(item.id) or self._in_runs(item.id)
            keyed = self._existing_for_key(item, now)
            if job is not None:
                found.append(snapshot(job))
            elif keyed is not None:
                found.append(keyed)
            else:
                config = self.doc.queues.get(item.queue) or QueueConfig()
                found.append(finished_job(item, now, config))
        return found

    def leased_to(self, tokens: list[str]) -> list[Job]:
        """The jobs leased under ``tokens`` (what a claim made with them took)."""
        wanted = set(tokens)
        return [
            snapshot(job)
            for job in self.jobs.values()
            if job.lease is not None and job.lease.token in wanted
        ]

    def holds(self, held: list[tuple[str, str]]) -> list[bool]:
        """Which of ``(job id, token)`` still hold their jobs."""
        alive: list[bool] = []
        for job_id, token in held:
            job = self.jobs.get(job_id)
            alive.append(job is not None and job.lease is not None and job.lease.token == token)
        return alive

    def next_wakeup(self) -> float | None:
        """The earliest ``visible_at`` among timed jobs (a lease to expire, a delay to end)."""
        times = [heap[0][0] for heap in self._timed.values() if heap]
        times += [r.next[0] for refs in self.doc.runs.values() for r in refs if r.kind == "timed"]
        return min(times) if times else None


def session_key(client: str) -> str:
    """Where the state keeps the mark of broker client ``client``: a hash of its id, never the
    id itself. The state is readable by anyone with the bucket (and the dashboard shows the
    marks): whoever could read a client's id could send sessions under it, and a session
    numbered past the client's next would make the broker answer that one as a replay."""
    return hashlib.blake2b(client.encode(), digest_size=12).hexdigest()
