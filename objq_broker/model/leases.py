"""Consuming in the model: claims and their leases, heartbeats, acks, nacks with backoff,
releases, dead-lettering, and the expiry that every commit runs (stale leases back to their
queues, due jobs to ready, retention of dead letters and keys)."""

from __future__ import annotations

import heapq
from typing import Literal

from objq_broker.errors import LeaseLost
from objq_broker.model.indexed import ReadyEntry
from objq_broker.model.producing import ProducingState
from objq_broker.model.records import Job, Lease, NackResult, QueueConfig, RunOutcome
from objq_broker.model.values import Finished, retry_delay, snapshot
from objq_broker.model.workers import forget_gone, note_gone


class LeasesState(ProducingState):
    """The layer of :class:`~objq_broker.model.state.QueueState` that hands out jobs and
    settles them."""

    def claim(
        self,
        queue: str,
        tokens: list[str],
        owner: str,
        now: float,
        lease_seconds: float | None = None,
    ) -> list[Job]:
        """Lease up to ``len(tokens)`` ready jobs of ``queue``, best (priority, seq) first."""
        config = self.doc.queues.get(queue)
        if config is None or not tokens:
            return []
        self.touch(queue, now)
        self._promote(queue, now)
        seconds = lease_seconds if lease_seconds is not None else config.lease_seconds
        heap = self._ready.get(queue, [])
        runs = self._runs.get(queue)
        claimed: list[Job] = []
        while len(claimed) < len(tokens):
            top = self._ready_top(heap)
            best = None if runs is None else runs.best()
            if runs is not None and best is not None and (top is None or best < top[:2]):
                job = runs.take(self.run_contents)
                self.jobs[job.id] = job
                self._members.setdefault(queue, set()).add(job.id)
            elif top is not None:
                heapq.heappop(heap)
                job = self.jobs[top[2]]
            else:
                break
            job.attempts += 1
            job.started_at = now
            job.lease = Lease(tokens[len(claimed)], owner, now + seconds, now)
            job.visible_at = job.lease.expires_at
            self._push_timed(job)
            claimed.append(snapshot(job))
        if claimed:
            self.dirty = True
        if runs is not None:
            self._drop_taken_runs(queue)
        return claimed

    def _promote(self, queue: str, now: float) -> None:
        """Move due jobs of ``queue`` to ready; expire the leases among them."""
        for job in self._due(queue, now):
            if job.lease is not None:
                self._expire_lease(job, now)
            else:
                self._push_ready(job)
        self._promote_runs(queue, now)

    def _ready_top(self, heap: list[ReadyEntry]) -> ReadyEntry | None:
        """The best valid entry of a ready heap, superseded ones dropped on the way."""
        while heap and self._entry.get(heap[0][2]) != heap[0]:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def _held(self, job_id: str, token: str) -> Job:
        """The job ``token`` holds, or :class:`LeaseLost` saying why it does not."""
        job = self.jobs.get(job_id)
        if job is None:
            raise LeaseLost(f"job {job_id}: no longer in the queue (acked, dead or purged)")
        if job.lease is None or job.lease.token != token:
            now_held = "nobody" if job.lease is None else f"owner {job.lease.owner!r}"
            raise LeaseLost(
                f"job {job_id}: lease {token} is stale; the job is now held by {now_held}"
            )
        return job

    def heartbeat(
        self, held: list[tuple[str, str]], now: float, lease_seconds: float | None = None
    ) -> list[bool]:
        """Extend many leases at once; the result says which were still held."""
        alive: list[bool] = []
        for job_id, token in held:
            try:
                job = self._held(job_id, token)
            except LeaseLost:
                alive.append(False)
                continue
            seconds = lease_seconds or self.doc.queues[job.queue].lease_seconds
            assert job.lease is not None
            job.lease = Lease(job.lease.token, job.lease.owner, now + seconds, now)
            job.visible_at = job.lease.expires_at
            self._push_timed(job)
            self.touch(job.queue, now)
            self.dirty = True
            alive.append(True)
        return alive

    def ack(
        self,
        job_id: str,
        token: str,
        now: float,
        outcome: Literal["done"] | RunOutcome = "done",
        error: str | None = None,
    ) -> Job:
        """Finish a held job; ``outcome`` says how its run went when it did not go well but
        the framework settles it with an ack all the same (a retry sent as a new job)."""
        job = self._held(job_id, token)
        self._forget(job)
        self._drop_body(job)
        job.lease = None
        job.finished_at = now
        if error is not None:
            job.error = error
        self.finished.append(Finished(outcome, job))
        self.dirty = True
        return snapshot(job)

    def note_outcome(
        self,
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
        if job_id in self.jobs or job_id in self.dead:
            if job_id in self.dead:
                raise LeaseLost(f"job {job_id}: dead-lettered, so no run of it can be noted")
            self._held(job_id, token)
        note = Job(job_id, queue, "", 0, now, now, 1, finished_at=now, error=error)
        self.finished.append(Finished(outcome, note))
        self.dirty = True

    def nack(
        self,
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
        job = self._held(job_id, token)
        self.dirty = True
        job.lease = None
        job.error = error
        if not retry or job.attempts >= job.max_attempts:
            self._entry.pop(job.id, None)
            self._dead_letter(job, now, error)
            return "dead"
        config = self.doc.queues[job.queue]
        if delay_seconds is None:
            delay_seconds = retry_delay(
                job.attempts, config.backoff_base_seconds, config.backoff_cap_seconds, jitter
            )
        job.visible_at = now + delay_seconds
        self._schedule(job, now)
        return "retry"

    def _dead_letter(self, job: Job, now: float, error: str | None) -> None:
        self._forget(job)
        job.lease = None
        job.error = error
        job.finished_at = now
        self.dead[job.id] = job
        self._sweep_at = min(self._sweep_at, self._dead_expiry(job))
        self.finished.append(Finished("dead", snapshot(job)))

    def _expire_lease(self, job: Job, now: float) -> None:
        self.dirty = True
        if job.lease is not None:
            note_gone(self.doc.gone, job.lease.owner, now)
        job.lease = None
        job.visible_at = now
        if job.attempts >= job.max_attempts:
            self._dead_letter(job, now, f"lease expired on attempt {job.attempts}, the last")
        else:
            job.error = f"lease expired on attempt {job.attempts}"
            self._push_ready(job)

    def release(self, held: list[tuple[str, str]], now: float) -> list[bool]:
        """Give back unprocessed deliveries without counting an attempt."""
        released: list[bool] = []
        for job_id, token in held:
            try:
                job = self._held(job_id, token)
            except LeaseLost:
                released.append(False)
                continue
            job.lease = None
            job.attempts = max(job.attempts - 1, 0)
            job.visible_at = now
            self._push_ready(job)
            self.dirty = True
            released.append(True)
        return released

    def expire(self, now: float) -> int:
        """Delete queues unused past their expiry; return stale leases to their queues; drop
        dead letters and keys past retention."""
        if self.doc.used:
            self._expire_queues(now)
        expired = 0
        for queue in list(self._timed):
            for job in self._due(queue, now):
                if job.lease is not None:
                    self._expire_lease(job, now)
                    expired += 1
                else:
                    self._push_ready(job)
        for queue in {queue for queue, _ in self.due_runs(now)}:
            self._promote_runs(queue, now)
        if now >= self._sweep_at:  # every commit calls this: scan retention only when due
            self._sweep(now)
        if self.doc.gone and forget_gone(self.doc.gone, now):
            self.dirty = True
        if self.doc.dead_runs:
            self._expire_dead_runs(now)
        return expired

    def _dead_expiry(self, job: Job) -> float:
        ttl = self.doc.queues.get(job.queue, QueueConfig()).dead_ttl_seconds
        return (job.finished_at or 0.0) + ttl

    def _sweep(self, now: float) -> None:
        """Drop dead letters and idempotency keys past retention; note when the next is due."""
        upcoming = float("inf")
        for job_id, job in list(self.dead.items()):
            due = self._dead_expiry(job)
            if due <= now:
                self._drop_body(self.dead.pop(job_id))
                self.dirty = True
            else:
                upcoming = min(upcoming, due)
        for slot, record in list(self.doc.keys.items()):
            if record.expires_at <= now:
                del self.doc.keys[slot]
                self.dirty = True
            else:
                upcoming = min(upcoming, record.expires_at)
        for queue, refs in list(self.doc.key_runs.items()):
            left = [ref for ref in refs if ref.expires > now]
            self.unused_runs += [ref.key for ref in refs if ref.expires <= now]
            upcoming = min([upcoming, *(ref.expires for ref in left)])
            if len(left) < len(refs):
                self.dirty = True
                if left:
                    self.doc.key_runs[queue] = left
                else:
                    del self.doc.key_runs[queue]
        self._sweep_at = upcoming
