"""The queue model: pure transitions over one namespace's state.

Nothing here does I/O, reads a clock or draws a random number: the time (``now``), new job ids,
lease tokens and jitter are all passed in, so an operation replayed after a failed write does
exactly what it did the first time.

Every transition checks everything it needs *before* it changes anything, so one refused
operation (:class:`~objq_broker.errors.LeaseLost`, ...) leaves the state as it was and never
spoils the batch it came in.

Claims are O(log n): each queue keeps a heap of ready jobs ordered by (priority, seq) and a
heap of timed jobs (delayed, backing off, or leased) ordered by ``visible_at``. Heap entries
are invalidated lazily: ``_entry[job_id]`` holds the one entry that is current for a job.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Literal

import msgspec

from objq_broker.errors import ConfigurationError, JobNotFound, LeaseLost, QueueNotFound
from objq_broker.model.backoff import backoff_seconds
from objq_broker.model.bodies import INLINE_MAX_BYTES, split_ref
from objq_broker.model.checks import (
    MAX_QUEUE_NAME,
    MAX_STAGED_ENTRIES,
    Attempts,
    Identifier,
    Priority,
    QueueName,
    SignedSeconds,
    checked,
)
from objq_broker.model.records import (
    FORMAT_VERSION,
    Job,
    JobState,
    KeyRecord,
    KeyRunRef,
    Lease,
    NackResult,
    OrderKey,
    Outcome,
    QueueConfig,
    RunKind,
    RunOutcome,
    RunRef,
    SessionMark,
    StateDoc,
    encode_state,
)
from objq_broker.model.runs import (
    MAX_RUN_JOBS,
    RunMerge,
    build_key_run,
    build_run,
    merged_jobs,
    order_key,
    rebased,
    small_runs,
    take_due,
)
from objq_broker.model.workers import Worker, forget_gone, note_gone, workers

#: A queue that expires has its last-used mark written again once the mark is this fraction
#: of its expiry old: a consumer that polls more often than every half expiry keeps its queue,
#: and costs one write per half expiry, not one per poll.
TOUCH_FRACTION = 0.5

_ReadyEntry = tuple[int, int, str]  # (priority, seq, job id)
_TimedEntry = tuple[float, int, str]  # (visible_at, seq, job id)
_job_encoder = msgspec.json.Encoder()


class NewJob(msgspec.Struct, frozen=True):
    """What an enqueue asks for; the id is made by the caller so a replay is identical."""

    id: Identifier
    queue: QueueName
    body: str
    b64: bool = False
    priority: Priority = 0
    delay_seconds: SignedSeconds = 0.0
    max_attempts: Attempts | None = None
    key: Identifier | None = None


class StagedBodies(msgspec.Struct, frozen=True):
    """A bodies object written ahead of the commit that enqueues one job per entry of it.

    ``priorities`` and ``delays`` give each entry its own priority or delay (seconds); None
    means the batch's value for every entry."""

    key: Identifier
    count: Annotated[int, msgspec.Meta(ge=1, le=MAX_STAGED_ENTRIES)]
    priorities: tuple[Priority, ...] | None = None
    delays: tuple[SignedSeconds, ...] | None = None


class StagedRun(msgspec.Struct, frozen=True):
    """A run written ahead of the commit that enqueues its jobs (by a Spark task): its jobs
    refer to entries of the bodies object ``bodies`` and are numbered from 0; ``next``,
    ``last`` and ``oldest`` are as in its :class:`RunRef`."""

    key: Identifier
    bodies: Identifier
    kind: Literal["ready", "timed"]
    count: Annotated[int, msgspec.Meta(ge=1, le=MAX_RUN_JOBS)]
    next: OrderKey
    last: OrderKey
    oldest: float

    def ref(self) -> RunRef:
        return RunRef(
            key=self.key,
            kind=self.kind,
            count=self.count,
            taken=0,
            next=self.next,
            oldest=self.oldest,
            last=self.last,
        )


#: Idempotency keys of staged writes (``enqueue_staged``) start with this, so they never meet
#: a key an application chose.
STAGED_WRITE_KEY = "objq-staged-write:"


@dataclass(frozen=True, slots=True)
class Finished:
    """A job leaving the hot state, to be archived before the commit that drops it."""

    outcome: Outcome
    job: Job


class QueueStats(msgspec.Struct, frozen=True):
    """Counts for one queue at one moment."""

    queue: str
    ready: int
    delayed: int
    in_flight: int
    dead: int
    oldest_ready_age_seconds: float | None


def check_queue_name(queue: object) -> str:
    if (
        not isinstance(queue, str)
        or not queue
        or len(queue) > MAX_QUEUE_NAME
        or "/" in queue
        or not queue.isprintable()
    ):
        raise ConfigurationError(
            f"queue name: expected 1-{MAX_QUEUE_NAME} printable characters without '/', "
            f"found {queue!r}"
        )
    return queue


def settings_of(
    queue: str, base: QueueConfig, changes: Mapping[str, object] | None = None
) -> QueueConfig:
    """``base`` with ``changes`` applied, every field checked; :class:`ConfigurationError`
    names an unknown setting or a value out of its range."""
    changes = dict(changes or {})
    allowed = QueueConfig.__struct_fields__
    unknown = sorted(set(changes) - set(allowed))
    if unknown:
        raise ConfigurationError(
            f"queue {queue!r}: unknown setting(s) {unknown}; accepted: {sorted(allowed)}"
        )
    merged = {name: getattr(base, name) for name in allowed} | changes
    return checked(merged, QueueConfig, f"queue {queue!r}")


#: The backoff of a failed job's next attempt (kept under its old name for callers).
retry_delay = backoff_seconds


def snapshot(job: Job) -> Job:
    """A copy for callers: the state's own record keeps changing after the op returns."""
    return msgspec.structs.replace(job)


class QueueState:
    """One namespace's jobs, dead letters, queue settings and idempotency keys, indexed."""

    def __init__(self, doc: StateDoc | None = None) -> None:
        self.doc = doc if doc is not None else StateDoc(format=FORMAT_VERSION)
        self.jobs: dict[str, Job] = {job.id: job for job in self.doc.jobs}
        self.dead: dict[str, Job] = {job.id: job for job in self.doc.dead}
        self._ready: dict[str, list[_ReadyEntry]] = {}
        self._timed: dict[str, list[_TimedEntry]] = {}
        self._entry: dict[str, _ReadyEntry | _TimedEntry] = {}
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
        #: Queues deleted (or expired) since the last commit: their kombu bindings are
        #: removed once the commit landed.
        self.removed_queues: list[str] = []
        #: Whether noting a queue's use is worth a write of its own. The elected broker, the
        #: only writer, keeps its marks in memory until its next commit (:meth:`hold_marks`).
        self.write_touches = True
        for job in self.jobs.values():
            self._members.setdefault(job.queue, set()).add(job.id)
            self._push_timed(job)

    # --- indexes ---------------------------------------------------------------------------

    def _push_timed(self, job: Job) -> None:
        self._stale.add(job.id)
        entry: _TimedEntry = (job.visible_at, job.seq, job.id)
        self._entry[job.id] = entry
        heapq.heappush(self._timed.setdefault(job.queue, []), entry)
        if job.lease is None:  # a delayed job; a lease is cleared only by pushing the job again
            self._timed_pushes[job.queue] = self._timed_pushes.get(job.queue, 0) + 1

    def _push_ready(self, job: Job) -> None:
        self.readied += 1
        self.readied_in[job.queue] = self.readied_in.get(job.queue, 0) + 1
        self._stale.add(job.id)
        entry: _ReadyEntry = (job.priority, job.seq, job.id)
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

    def _promote(self, queue: str, now: float) -> None:
        """Move due jobs of ``queue`` to ready; expire the leases among them."""
        for job in self._due(queue, now):
            if job.lease is not None:
                self._expire_lease(job, now)
            else:
                self._push_ready(job)
        self._promote_runs(queue, now)

    def _promote_runs(self, queue: str, now: float) -> None:
        """Move the due jobs of ``queue``'s timed runs into the head, ready (a later spill
        writes them out again as a ready run when there are many)."""
        due = [ref for ref in self.doc.runs.get(queue, []) if _due(ref, now)]
        if not due:
            return
        for ref in due:
            for job in take_due(ref, self._contents(ref), now):
                self.jobs[job.id] = job
                self._members.setdefault(queue, set()).add(job.id)
                self._push_ready(job)
        self.dirty = True
        self._drop_taken_runs(queue)

    def _due_in(self, ref: RunRef, now: float) -> list[Job]:
        """The jobs of the timed run ``ref`` due at ``now`` and not yet promoted."""
        if ref.next[0] > now:
            return []
        jobs = self._contents(ref)
        end = bisect.bisect_right(jobs, now, lo=ref.taken, key=lambda job: job.visible_at)
        return jobs[ref.taken : end]

    def due_runs(self, now: float) -> list[tuple[str, RunRef]]:
        """The timed runs (queue, ref) whose next job is due at ``now``."""
        return [(queue, r) for queue, refs in self.doc.runs.items() for r in refs if _due(r, now)]

    def _contents(self, ref: RunRef) -> list[Job]:
        """The jobs of ``ref``, which must have been read first
        (:func:`~objq_broker.model.ops.runs_needed` says which)."""
        jobs = self.run_contents.get(ref.key)
        if jobs is None:
            raise KeyError(f"run {ref.key} was not read before the operation that needs it")
        return jobs

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

    # --- queues ----------------------------------------------------------------------------

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

    def declare(
        self, queue: str, config: QueueConfig | None = None, now: float | None = None
    ) -> bool:
        """Declare ``queue`` if new (with ``config`` or the defaults); True if it was new.
        Declaring a queue again counts as using it (``now``: when)."""
        check_queue_name(queue)
        if queue in self.doc.queues:
            if now is not None:
                self.touch(queue, now)
            return False
        # Checked here too: a config built in code skips msgspec's constraints, and one bad
        # value in the state would stop every process that shares it.
        settings = QueueConfig() if config is None else settings_of(queue, config)
        self.doc.queues[queue] = settings
        self._members.setdefault(queue, set())
        if settings.expires_seconds is not None and now is not None:
            self.doc.used[queue] = now
        self.dirty = True
        return True

    def touch(self, queue: str, now: float) -> None:
        """Note that ``queue`` is in use (a claim, a heartbeat, a declare), if it expires.
        The mark is written only once it is :data:`TOUCH_FRACTION` of the expiry old."""
        config = self.doc.queues.get(queue)
        if config is None or config.expires_seconds is None:
            return
        last = self.doc.used.get(queue)
        if last is None or now - last >= config.expires_seconds * TOUCH_FRACTION:
            self.doc.used[queue] = now
            self.dirty = self.dirty or self.write_touches

    def hold_marks(self, now: float) -> None:
        """Keep the marks of use in memory from now on, written with the next commit that
        writes anyway, and count every queue as used ``now``. For the only writer (the elected
        broker): it sees every use, but the marks it read may be older than its predecessor's
        memory, so it gives each queue a full expiry from when it took the state over."""
        self.write_touches = False
        for queue in self.doc.used:
            self.doc.used[queue] = max(self.doc.used[queue], now)

    def touch_due(self, queue: str) -> float | None:
        """When a consumer of ``queue`` should next use it to keep it from expiring (a claim
        waiting at a broker is tried again then); None if the queue does not expire."""
        config = self.doc.queues.get(queue)
        last = self.doc.used.get(queue)
        if config is None or config.expires_seconds is None or last is None:
            return None
        return last + config.expires_seconds * TOUCH_FRACTION

    def expiring(self, now: float) -> list[str]:
        """The queues unused for their ``expires_seconds`` at ``now``: the next commit deletes
        them (their runs must have been read first)."""
        found: list[str] = []
        for queue, last in self.doc.used.items():
            expires = self.doc.queues[queue].expires_seconds if queue in self.doc.queues else None
            if expires is not None and now - last >= expires:
                found.append(queue)
        return found

    def _expire_queues(self, now: float) -> int:
        """Delete the queues unused for their expiry, with their jobs and dead letters."""
        for queue in [q for q in self.doc.used if q not in self.doc.queues]:
            del self.doc.used[queue]  # left by a release that did not know the mark
            self.dirty = True
        doomed = self.expiring(now)
        for queue in doomed:
            self.delete_queue(queue)
        return len(doomed)

    def configure(
        self, queue: str, changes: dict[str, float | int | None], now: float = 0.0
    ) -> QueueConfig:
        current = self.config(queue)
        updated = settings_of(queue, current, changes)
        if updated != current:
            self.doc.queues[queue] = updated
            self.dirty = True
            self._sweep_at = float("-inf")  # a new retention moves expiry times
            if updated.expires_seconds is None:
                self.doc.used.pop(queue, None)
            elif current.expires_seconds is None:
                self.doc.used[queue] = now
        return updated

    def purge(self, queue: str) -> int:
        """Delete the ready and delayed jobs of ``queue``; leased ones finish normally."""
        self.config(queue)
        doomed = [self.jobs[i] for i in self._members.get(queue, ()) if self.jobs[i].lease is None]
        for job in doomed:
            self._forget(job)
            self._drop_body(job)
        count = len(doomed) + self._drop_runs(queue)
        if count:
            self.dirty = True
        return count

    def delete_queue(self, queue: str) -> int:
        """Remove ``queue``, its jobs and its dead letters; returns how many jobs went."""
        self.config(queue)
        doomed = [self.jobs[i] for i in self._members.get(queue, ())]
        for job in doomed:
            self._forget(job)
            self._drop_body(job)
        dead = [i for i, job in self.dead.items() if job.queue == queue]
        for job_id in dead:
            self._drop_body(self.dead.pop(job_id))
        in_runs = self._drop_runs(queue) + self._drop_dead_runs(queue)
        self.unused_runs += [ref.key for ref in self.doc.key_runs.pop(queue, [])]
        del self.doc.queues[queue]
        self.doc.used.pop(queue, None)
        self.removed_queues.append(queue)
        self._members.pop(queue, None)
        self._ready.pop(queue, None)
        self._timed.pop(queue, None)
        self.dirty = True
        return len(doomed) + len(dead) + in_runs

    # --- producing -------------------------------------------------------------------------

    def enqueue(self, new: Iterable[NewJob], now: float) -> list[Job]:
        """Add jobs (declaring their queues); a live idempotency key returns the earlier job."""
        items = list(new)
        seen: set[str] = set()
        for item in items:
            check_queue_name(item.queue)
            if item.id in self.jobs or item.id in self.dead or item.id in seen:
                raise ConfigurationError(f"job id {item.id!r} already exists")
            seen.add(item.id)
            if item.max_attempts is not None and item.max_attempts < 1:
                raise ConfigurationError(
                    f"job {item.id}: max_attempts must be >= 1, found {item.max_attempts}"
                )
        created: list[Job] = []
        for item in items:
            self.declare(item.queue)
            existing = self._existing_for_key(item, now)
            if existing is not None:
                created.append(existing)
                continue
            config = self.doc.queues[item.queue]
            self.doc.seq += 1
            job = Job(
                id=item.id,
                queue=item.queue,
                body=item.body,
                b64=item.b64,
                seq=self.doc.seq,
                priority=item.priority,
                enqueued_at=now,
                visible_at=now + max(item.delay_seconds, 0.0),
                max_attempts=item.max_attempts or config.max_attempts,
                key=item.key,
            )
            self.jobs[job.id] = job
            self._members[job.queue].add(job.id)
            self._schedule(job, now)
            if len(job.body) > INLINE_MAX_BYTES:
                self.new_bodies.append(job)
            if item.key is not None:
                expires = now + config.idempotency_seconds
                self.doc.keys[key_slot(item.queue, item.key)] = KeyRecord(job.id, expires)
                self._sweep_at = min(self._sweep_at, expires)
            self.dirty = True
            created.append(snapshot(job))
        return created

    def _existing_for_key(self, item: NewJob, now: float) -> Job | None:
        if item.key is None:
            return None
        record = self.key_record(item.queue, item.key)
        if record is None or record.expires_at <= now:
            return None
        live = self.jobs.get(record.job_id) or self.dead.get(record.job_id)
        if live is not None:
            return snapshot(live)
        # The first job finished, or waits in a run (not read for this: it would cost the
        # backlog): report it by id, as it was asked for.
        config = self.doc.queues[item.queue]
        enqueued_at = record.expires_at - config.idempotency_seconds
        return _finished_job(item, now, config, job_id=record.job_id, enqueued_at=enqueued_at)

    def enqueue_staged(
        self,
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
        if self._written(queue, write_id, now):
            return None
        self._check_staged(queue, staged, ids, max_attempts)
        self.declare(queue)
        config = self.doc.queues[queue]
        attempts = max_attempts or config.max_attempts
        members = self._members[queue]
        position = 0
        for item in staged:
            for index in range(item.count):
                self.doc.seq += 1
                wait = item.delays[index] if item.delays is not None else delay_seconds
                job = Job(
                    id=ids[position],
                    queue=queue,
                    body="",
                    seq=self.doc.seq,
                    priority=item.priorities[index] if item.priorities is not None else priority,
                    enqueued_at=now,
                    visible_at=now + max(wait, 0.0),
                    max_attempts=attempts,
                    ref=f"{item.key}#{index}",
                )
                position += 1
                self.jobs[job.id] = job
                members.add(job.id)
                self._schedule(job, now)
            self.doc.bodies[item.key] = item.count
        self._note_written(queue, write_id, now, ids[0] if ids else "")
        return position

    def enqueue_runs(
        self, queue: str, runs: list[StagedRun], now: float, *, write_id: str
    ) -> int | None:
        """Add the jobs of runs already stored (with the bodies objects they refer to), in
        one transition that adds a reference per run: a Spark write's jobs never pass through
        the head. Each run takes its place after every job enqueued before it, in the order
        given. Idempotent by ``write_id`` as :meth:`enqueue_staged`."""
        check_queue_name(queue)
        if self._written(queue, write_id, now):
            return None
        self._check_staged_runs(queue, runs)
        self.declare(queue)
        refs = self.doc.runs.setdefault(queue, [])
        for run in runs:
            refs.append(rebased(run.ref(), self.doc.seq + 1))
            self.doc.seq += run.count
            self.doc.bodies[run.bodies] = self.doc.bodies.get(run.bodies, 0) + run.count
        if refs:
            self._runs[queue] = RunMerge(refs)
        else:
            del self.doc.runs[queue]
        self._note_written(queue, write_id, now, runs[0].key if runs else "")
        return sum(run.count for run in runs)

    def _written(self, queue: str, write_id: str, now: float) -> bool:
        """Whether the staged write ``write_id`` was committed within the idempotency window."""
        record = self.key_record(queue, f"{STAGED_WRITE_KEY}{write_id}")
        return record is not None and record.expires_at > now

    def _note_written(self, queue: str, write_id: str, now: float, first: str) -> None:
        expires = now + self.doc.queues[queue].idempotency_seconds
        self.doc.keys[key_slot(queue, f"{STAGED_WRITE_KEY}{write_id}")] = KeyRecord(first, expires)
        self._sweep_at = min(self._sweep_at, expires)
        self.dirty = True

    def _check_staged_runs(self, queue: str, runs: list[StagedRun]) -> None:
        """Refuse runs a staged write cannot add, before anything changes."""
        where = f"staged runs for {queue!r}"
        keys = [run.key for run in runs]
        taken = set(keys) & self.doc.run_keys()
        if len(set(keys)) != len(keys) or taken:
            raise ConfigurationError(
                f"{where}: expected runs not referred to yet, found {sorted(taken) or keys}"
            )
        fresh = {run.bodies for run in runs}
        if fresh & self.doc.bodies.keys():
            raise ConfigurationError(
                f"{where}: jobs already refer to {sorted(fresh & self.doc.bodies.keys())}"
            )
        for run in runs:
            if run.last < run.next:
                raise ConfigurationError(
                    f"{where}: run {run.key}'s last job {run.last} sorts before its first "
                    f"{run.next}"
                )

    def _check_staged(
        self, queue: str, staged: list[StagedBodies], ids: list[str], max_attempts: int | None
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
            self._check_staged_object(item, where)
        if len(set(ids)) != len(ids):
            raise ConfigurationError(f"{where}: the job ids are not unique")
        taken = [i for i in ids if i in self.jobs or i in self.dead]
        if taken:
            raise ConfigurationError(f"{where}: job ids {taken[:5]} already exist")

    def _check_staged_object(self, item: StagedBodies, where: str) -> None:
        if item.count < 1:
            raise ConfigurationError(f"{where}: {item.key} has {item.count} entries")
        if item.key in self.doc.bodies:
            raise ConfigurationError(f"{where}: jobs already refer to {item.key}")
        for extra, name in ((item.priorities, "priorities"), (item.delays, "delays")):
            if extra is not None and len(extra) != item.count:
                raise ConfigurationError(
                    f"{where}: {item.key} has {item.count} entries but {len(extra)} {name}"
                )

    # --- consuming -------------------------------------------------------------------------

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

    def _ready_top(self, heap: list[_ReadyEntry]) -> _ReadyEntry | None:
        """The best valid entry of a ready heap, superseded ones dropped on the way."""
        while heap and self._entry.get(heap[0][2]) != heap[0]:
            heapq.heappop(heap)
        return heap[0] if heap else None

    # --- runs: the backlog out of the head -------------------------------------------------

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
        return _with_id(jobs, job_id)

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

    def _drop_runs(self, queue: str) -> int:
        """Remove every run of ``queue``; returns how many jobs they still held."""
        doomed = self.run_jobs(queue)
        for job in doomed:
            self._drop_body(job)
        self.unused_runs += [ref.key for ref in self.doc.runs.pop(queue, [])]
        self._runs.pop(queue, None)
        return len(doomed)

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
        self, job_id: str, queue: str, outcome: RunOutcome, error: str | None, now: float
    ) -> None:
        """Archive how the run of a job went, for a framework that acks a job before running
        it: a record of the job's id and queue only (its own record, written when it was
        acked, has the rest). The job itself is not touched, wherever it is."""
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

    # --- dead letters ----------------------------------------------------------------------

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

    # --- reading ---------------------------------------------------------------------------

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
        return _with_id(self.run_jobs(queue, read_only=True), job_id)

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

    # --- broker sessions: a resent request is answered, not applied again ----------------

    def session_applied(self, client: str, seq: int) -> bool:
        """Whether request ``seq`` of broker client ``client`` has already changed the state."""
        mark = self.doc.sessions.get(client)
        return mark is not None and seq <= mark.seq

    def mark_session(self, client: str, seq: int, now: float, ttl: float) -> None:
        """Remember that request ``seq`` of ``client`` changed the state; forget clients that
        sent nothing that changed it for ``ttl`` seconds."""
        sessions = self.doc.sessions
        for old in [c for c, mark in sessions.items() if mark.at < now - ttl]:
            del sessions[old]
        sessions[client] = SessionMark(seq, now)
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
                found.append(_finished_job(item, now, config))
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

    # --- persisting ------------------------------------------------------------------------

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


def _left_in(runs: dict[str, list[RunRef]], queue: str | None) -> list[tuple[str, RunRef]]:
    """The runs (of ``runs``) of ``queue``, of every queue when None, with jobs left."""
    names = list(runs) if queue is None else [queue]
    return [(q, r) for q in names for r in runs.get(q, []) if r.remaining]


def _with_id(jobs: list[Job], job_id: str) -> Job | None:
    return next((job for job in jobs if job.id == job_id), None)


def _due(ref: RunRef, now: float) -> bool:
    """Whether ``ref`` is a timed run whose next job is due at ``now``."""
    return ref.kind == "timed" and ref.remaining > 0 and ref.next[0] <= now


def _finished_job(
    item: NewJob,
    now: float,
    config: QueueConfig,
    *,
    job_id: str | None = None,
    enqueued_at: float | None = None,
) -> Job:
    """A job that was added and has already left the state, described by the request that
    added it (``job_id``: the job that request stood for, when it was another's key)."""
    return Job(
        id=job_id or item.id,
        queue=item.queue,
        body=item.body,
        b64=item.b64,
        seq=0,
        enqueued_at=now if enqueued_at is None else enqueued_at,
        visible_at=now,
        max_attempts=item.max_attempts or config.max_attempts,
        key=item.key,
        finished_at=now,
    )


def key_slot(queue: str, key: str) -> str:
    """Where an idempotency key of ``queue`` is recorded."""
    return f"{queue}/{key}"
