"""The queue model: pure transitions over one namespace's state.

Nothing here does I/O, reads a clock or draws a random number: the time (``now``), new job ids,
lease tokens and jitter are all passed in, so an operation replayed after a failed write does
exactly what it did the first time.

Every transition checks everything it needs *before* it changes anything, so one refused
operation (:class:`~objq_broker.errors.LeaseLost`, ...) leaves the state as it was and never
spoils the batch it came in.

:class:`QueueState` holds the stored document and two parts that index it:

* :class:`~objq_broker.model.indexed.QueueIndex`: the live jobs and the heaps claims use;
* :class:`~objq_broker.model.backlog.Backlog`: the backlog kept out of the head in runs.

Its transitions are functions over it, a module per concern (the methods named after them call
them; the staged writes and noted outcomes, which only their operations apply, are called by
those directly):

* :mod:`~objq_broker.model.lifecycle`: declaring, configuring, expiring and deleting queues;
* :mod:`~objq_broker.model.producing`: enqueueing, staged writes and idempotency keys;
* :mod:`~objq_broker.model.leases`: claims, heartbeats, acks, nacks, dead letters, expiry;
* :mod:`~objq_broker.model.spilling`: moving the head's excess into runs, merging runs;
* :mod:`~objq_broker.model.reading`: counts, look-ups and what a replayed op returned;
* this module: bodies, encoding, retention, and the broker's session marks.

The values they take and give (:class:`~objq_broker.model.values.NewJob`, ...) are in
:mod:`~objq_broker.model.values`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

import msgspec

from objq_broker.errors import QueueNotFound
from objq_broker.model import leases, lifecycle, producing, reading, spilling
from objq_broker.model.backlog import Backlog
from objq_broker.model.bodies import split_ref
from objq_broker.model.encoding import encode_state, refused_null
from objq_broker.model.indexed import QueueIndex
from objq_broker.model.records import (
    FORMAT_VERSION,
    MAX_WRITER_MARKS,
    WRITER_MARK_TTL_SECONDS,
    ArchiveTail,
    Job,
    JobState,
    KeyRecord,
    KeyRunRef,
    NackResult,
    QueueConfig,
    RunOutcome,
    RunRef,
    SessionMark,
    StateDoc,
    WriterMark,
)
from objq_broker.model.values import (
    Finished,
    NewJob,
    QueueStats,
    snapshot,
)
from objq_broker.model.workers import Worker

_job_encoder = msgspec.json.Encoder()


class QueueState:
    """One namespace's jobs, dead letters, queue settings and idempotency keys, indexed.

    >>> from objq_broker.model.values import NewJob
    >>> state = QueueState()
    >>> _ = state.enqueue([NewJob(id="j1", queue="emails", body="hi")], now=0.0)
    >>> [job.id for job in state.claim("emails", ["token-1"], "worker-1", now=1.0)]
    ['j1']
    """

    def __init__(self, doc: StateDoc | None = None) -> None:
        self.doc = doc if doc is not None else StateDoc(format=FORMAT_VERSION)
        #: The dead letters in the head, by id.
        self.dead: dict[str, Job] = {job.id: job for job in self.doc.dead}
        #: The live jobs in the head, indexed for claims.
        self.index = QueueIndex(self.doc.jobs, self.doc.queues, self.doc.group_runs)
        #: The runs out of the head.
        self.backlog = Backlog(self.doc)
        #: Jobs that left the hot state since the last commit, oldest first.
        self.finished: list[Finished] = []
        #: True once a transition changed something that must be written.
        self.dirty = False
        #: Jobs enqueued since the last commit whose bodies are to leave the state.
        self.new_bodies: list[Job] = []
        #: Bodies objects no job refers to any more: delete them once the commit landed.
        self.unused_bodies: list[str] = []
        #: Queues deleted (or expired) since the last commit: their kombu bindings are
        #: removed once the commit landed.
        self.removed_queues: list[str] = []
        #: Whether noting a queue's use is worth a write of its own. The elected broker, the
        #: only writer, keeps its marks in memory until its next commit (:meth:`hold_marks`).
        self.write_touches = True
        #: No dead letter or idempotency key expires before this time (-inf: not yet known).
        self._sweep_at = float("-inf")
        #: The archive tail last set, with its records as archive lines (:meth:`encode`).
        self._tail_lines: tuple[ArchiveTail, bytes] | None = None
        #: The archive tail last encoded: (tail, its lines, its field, searched clean).
        self._tail_made: tuple[ArchiveTail, bytes, bytes, bool] | None = None
        #: The part of the last :meth:`encode`'s bytes that may still hold a field written as
        #: a refused null (see ``check_encoded``): all of them, or all but the parts searched
        #: when they were made.
        self.unchecked = b""

    # The transitions, a module per concern, each function taking the state first. Methods
    # that call them rather than the functions assigned here: a compiled class (setup.py)
    # does not bind a function assigned in its body as a method. Those only an operation
    # applies (staged writes, noted outcomes) have none: the operation calls the function.

    def declare(
        self, queue: str, config: QueueConfig | None = None, now: float | None = None
    ) -> bool:
        return lifecycle.declare(self, queue, config, now)

    def touch(self, queue: str, now: float) -> None:
        return lifecycle.touch(self, queue, now)

    def hold_marks(self, now: float) -> None:
        return lifecycle.hold_marks(self, now)

    def touch_due(self, queue: str) -> float | None:
        return lifecycle.touch_due(self, queue)

    def expiring(self, now: float) -> list[str]:
        return lifecycle.expiring(self, now)

    def configure(
        self, queue: str, changes: Mapping[str, bool | float | int | None], now: float = 0.0
    ) -> QueueConfig:
        return lifecycle.configure(self, queue, changes, now)

    def purge(self, queue: str) -> int:
        return lifecycle.purge(self, queue)

    def delete_queue(self, queue: str) -> int:
        return lifecycle.delete_queue(self, queue)

    def enqueue(self, new: Iterable[NewJob], now: float) -> list[Job]:
        return producing.enqueue(self, new, now)

    def claim(
        self,
        queue: str,
        tokens: list[str],
        owner: str,
        now: float,
        lease_seconds: float | None = None,
    ) -> list[Job]:
        return leases.claim(self, queue, tokens, owner, now, lease_seconds)

    def heartbeat(
        self, held: list[tuple[str, str]], now: float, lease_seconds: float | None = None
    ) -> list[bool]:
        return leases.heartbeat(self, held, now, lease_seconds)

    def ack(
        self,
        job_id: str,
        token: str,
        now: float,
        outcome: Literal["done"] | RunOutcome = "done",
        error: str | None = None,
    ) -> Job:
        return leases.ack(self, job_id, token, now, outcome, error)

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
        return leases.nack(
            self,
            job_id,
            token,
            now,
            error=error,
            retry=retry,
            jitter=jitter,
            delay_seconds=delay_seconds,
        )

    def release(self, held: list[tuple[str, str]], now: float) -> list[bool]:
        return leases.release(self, held, now)

    def expire(self, now: float) -> int:
        return leases.expire(self, now)

    def retry_dead(self, queue: str, ids: list[str] | None, now: float) -> list[str]:
        return leases.retry_dead(self, queue, ids, now)

    def purge_dead(self, queue: str, ids: list[str] | None) -> int:
        return leases.purge_dead(self, queue, ids)

    def dead_letters(self, queue: str) -> list[Job]:
        return leases.dead_letters(self, queue)

    def spill(self, bound: int, key_for: Callable[[int], str], *, run_jobs: int = 10000) -> None:
        return spilling.spill(self, bound, key_for, run_jobs=run_jobs)

    def merge_runs(self, key_for: Callable[[int], str], run_jobs: int, at_least: int) -> int:
        return spilling.merge_runs(self, key_for, run_jobs, at_least)

    def stats(self, queue: str, now: float) -> QueueStats:
        return reading.stats(self, queue, now)

    def workers(self, now: float) -> list[Worker]:
        return reading.workers(self, now)

    def find(self, job_id: str, now: float) -> tuple[JobState, Job] | None:
        return reading.find(self, job_id, now)

    def enqueued(self, items: list[NewJob], now: float) -> list[Job]:
        return reading.enqueued(self, items, now)

    def leased_to(self, tokens: list[str]) -> list[Job]:
        return reading.leased_to(self, tokens)

    def holds(self, held: list[tuple[str, str]]) -> list[bool]:
        return reading.holds(self, held)

    def next_visible(self, queue: str) -> float | None:
        return reading.next_visible(self, queue)

    @property
    def jobs(self) -> dict[str, Job]:
        """The live jobs in the head, by id."""
        return self.index.jobs

    @property
    def readied(self) -> int:
        """Jobs made claimable since this state was built (enqueued, released, expired,
        due): a broker wakes waiting claimers only when it moves, not after every ack."""
        return self.index.readied

    @property
    def readied_in(self) -> dict[str, int]:
        """The same, per queue: a broker wakes as many claimers parked on a queue as it got."""
        return self.index.readied_in

    @property
    def run_contents(self) -> dict[str, list[Job]]:
        """The jobs of the runs read so far: the engine's cache (runs never change)."""
        return self.backlog.run_contents

    @run_contents.setter
    def run_contents(self, cache: dict[str, list[Job]]) -> None:
        self.backlog.run_contents = cache

    @property
    def key_contents(self) -> dict[str, dict[str, KeyRecord]]:
        """The keys of the key runs read so far: the engine's cache."""
        return self.backlog.key_contents

    @key_contents.setter
    def key_contents(self, cache: dict[str, dict[str, KeyRecord]]) -> None:
        self.backlog.key_contents = cache

    @property
    def new_runs(self) -> list[tuple[str, bytes]]:
        """Runs made for this commit, to be written before the head."""
        return self.backlog.new_runs

    @property
    def unused_runs(self) -> list[str]:
        """Runs whose jobs are all gone: delete them once the commit landed."""
        return self.backlog.unused_runs

    @unused_runs.setter
    def unused_runs(self, keys: list[str]) -> None:
        self.backlog.unused_runs = keys

    @property
    def unreadable_runs(self) -> dict[str, str]:
        """Runs a staged write names that cannot be read, with why (the write is refused)."""
        return self.backlog.unreadable_runs

    @unreadable_runs.setter
    def unreadable_runs(self, reasons: dict[str, str]) -> None:
        self.backlog.unreadable_runs = reasons

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

    # --- the backlog, as the engine reads it -------------------------------------------

    def runs_of(self, queue: str | None = None) -> list[tuple[str, RunRef]]:
        return self.backlog.runs_of(queue)

    def dead_runs_of(self, queue: str | None = None) -> list[tuple[str, RunRef]]:
        return self.backlog.dead_runs_of(queue)

    def key_runs_of(self, queue: str) -> list[tuple[str, KeyRunRef]]:
        return self.backlog.key_runs_of(queue)

    def run_jobs(self, queue: str | None = None, *, read_only: bool = False) -> list[Job]:
        return self.backlog.run_jobs(queue, read_only=read_only)

    def dead_run_jobs(self, queue: str | None, *, read_only: bool = False) -> list[Job]:
        return self.backlog.dead_run_jobs(queue, read_only=read_only)

    def runs_to_claim(self, queue: str, n: int) -> list[tuple[str, RunRef]]:
        if self.index.grouped(queue):  # a claim of a grouped queue may move more into the head
            n += leases.LOADS_PER_CLAIMED_JOB * n
        return self.backlog.runs_to_claim(queue, n)

    def may_spill(self, bound: int) -> bool:
        """Whether :meth:`spill` past ``bound`` could find anything to move: a queue's jobs,
        dead letters or idempotency keys past it. False is cheap and certain: the head holds
        no more than ``bound`` of any of them, all queues together."""
        return len(self.index.jobs) > bound or len(self.dead) > bound or len(self.doc.keys) > bound

    def runs_to_merge(self, run_jobs: int, at_least: int) -> list[tuple[str, RunRef]]:
        return self.backlog.runs_to_merge(run_jobs, at_least)

    def due_runs(self, now: float) -> list[tuple[str, RunRef]]:
        return self.backlog.due_runs(now)

    def expired_dead_runs(self, now: float) -> list[tuple[str, RunRef]]:
        """The dead runs (queue, ref) whose first dead letter is past its queue's retention."""
        return [
            (queue, ref)
            for queue, ref in self.backlog.dead_runs_of()
            if ref.next[0] + self.config(queue).dead_ttl_seconds <= now
        ]

    def lose_run(self, key: str, reason: str, now: float) -> None:
        """Drop the run ``key`` that storage no longer holds, or that does not decode: the
        jobs it held cannot even be named, so an archived record (id: the run's key) names
        its queue and how many jobs it held, with ``reason``, and the queue flows on without
        them. A lost key run forgets its idempotency keys (a duplicate is then taken as new)."""
        lost = self.backlog.drop_run(key)
        if lost is not None:
            queue, what, ref = lost
            error = f"{what} {key} of {ref.remaining} jobs lost: {reason}"
            record = Job(key, queue, "", 0, now, now, 1, finished_at=now, error=error)
            self.finished.append(Finished("dead", record))
            self.dirty = True
        elif self.backlog.drop_key_run(key):
            self.dirty = True

    # --- retention ---------------------------------------------------------------------

    def note_expiry(self, at: float) -> None:
        """A dead letter or an idempotency key expires ``at``: sweep by then."""
        self._sweep_at = min(self._sweep_at, at)

    def retention_changed(self) -> None:
        """A queue's retention changed, which moves expiry times: the next expire scans."""
        self._sweep_at = float("-inf")

    def sweep(self, now: float) -> None:
        """Drop dead letters and idempotency keys past retention; note when the next is due.
        Every commit calls this: it scans only when something is due."""
        if now < self._sweep_at:
            return
        upcoming = float("inf")
        for job_id, job in list(self.dead.items()):
            due = self.dead_expiry(job)
            if due <= now:
                self.drop_body(self.dead.pop(job_id))
                self.dirty = True
            else:
                upcoming = min(upcoming, due)
        for slot, record in list(self.doc.keys.items()):
            if record.expires_at <= now:
                del self.doc.keys[slot]
                self.dirty = True
            else:
                upcoming = min(upcoming, record.expires_at)
        dropped, next_run = self.backlog.expire_key_runs(now)
        self.dirty = self.dirty or dropped
        self._sweep_at = min(upcoming, next_run)

    def dead_expiry(self, job: Job) -> float:
        """When the dead letter ``job`` is past its queue's retention."""
        ttl = self.doc.queues.get(job.queue, QueueConfig()).dead_ttl_seconds
        return (job.finished_at or 0.0) + ttl

    # --- bodies and encoding -----------------------------------------------------------

    def drop_body(self, job: Job) -> None:
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
            self.index.changed(job)
        self.new_bodies.clear()
        if entries:
            self.doc.bodies[key] = len(entries)
        return entries

    def to_doc(self) -> StateDoc:
        self.doc.format = self.doc.needed_format()
        self.doc.jobs = list(self.jobs.values())
        self.doc.dead = list(self.dead.values())
        return self.doc

    def set_archive_tail(self, tail: ArchiveTail | None, lines: bytes) -> None:
        """Keep ``tail`` as the archive tail; ``lines``: its records as an archive object's
        lines, which :meth:`encode` splices in rather than encode them again."""
        self.doc.archive_tail = tail
        self._tail_lines = None if tail is None else (tail, lines)

    def archive_lines(self) -> bytes | None:
        """The archive tail's records as lines, when :meth:`set_archive_tail` gave them."""
        kept = self._tail_lines
        return kept[1] if kept is not None and kept[0] is self.doc.archive_tail else None

    def _tail_field(self, tail: ArchiveTail) -> tuple[bytes, bool]:
        """``tail`` as the state's last field and closing brace (``"archive_tail":{...}}``),
        and whether no field of it is written as a refused null (see ``check_encoded``); made
        once per tail: most commits finish no job and keep the tail as it was. A tail set with
        its lines is not encoded again: its records are the JSON list the lines make, and only
        the records added since the last are searched, when the lines before them were
        searched already."""
        made = self._tail_made
        if made is not None and made[0] is tail:
            return made[2], made[3]
        kept = self._tail_lines
        lines = kept[1] if kept is not None and kept[0] is tail else b""
        if lines:
            # Lines of JSON, one per record, hold no raw newline: with commas, they are a list.
            listed: Any = msgspec.Raw(b"[" + lines[:-1].replace(b"\n", b",") + b"]")
            spliced = ArchiveTail(since=tail.since, version=tail.version, records=listed)
            encoded = _job_encoder.encode(spliced)
            held = made[1] if made is not None and made[3] and lines.startswith(made[1]) else b""
            clean = refused_null(lines, len(held)) is None
        else:
            encoded = _job_encoder.encode(tail)
            clean = refused_null(encoded) is None
        field = b'"archive_tail":' + encoded + b"}"
        self._tail_made = (tail, lines, field, clean)
        return field, clean

    def encode(self) -> bytes:
        """The stored form of :meth:`to_doc`, re-encoding only the jobs that changed: a commit
        of a few ops on a deep queue costs a copy of the state, not a full encode.

        The jobs and the archive tail, the state's bulk, come last (a JSON object's fields
        may come in any order), from bytes kept between commits and searched once, when they
        were made, for a field written as a refused null. :attr:`unchecked` is then the rest,
        the only part of the state that still needs that search (``check_encoded``)."""
        doc = self.doc
        jobs, jobs_clean = self.index.encoded_jobs()
        doc.format = doc.needed_format()
        tail = doc.archive_tail
        doc.dead = [msgspec.Raw(_job_encoder.encode(job)) for job in self.dead.values()]  # type: ignore[misc]
        doc.jobs, doc.archive_tail = [], None
        try:
            rest = encode_state(doc)  # without its jobs or its tail
        finally:
            doc.dead = []  # to_doc() builds them when asked
            doc.archive_tail = tail
        # One join, with commas: the rest's fields (its closing brace left for the end), the
        # jobs, then the tail as kept between commits, so each part is copied once.
        head, pieces = rest[:-1], jobs  # (a list of its own)
        tail_field, tail_clean = (None, True) if tail is None else self._tail_field(tail)
        if pieces:
            pieces[0] = head + b',"jobs":[' + pieces[0]
            pieces[-1] += b"]}" if tail_field is None else b"]"
        else:
            pieces.append(head + b"}" if tail_field is None else head)
        if tail_field is not None:
            pieces.append(tail_field)
        data = b",".join(pieces)
        self.unchecked = rest if jobs_clean and tail_clean else data
        return data

    def list_jobs(
        self, queue: str, now: float, state: JobState | None = None, limit: int | None = None
    ) -> list[tuple[JobState, Job]]:
        """Jobs of ``queue`` in claim order (dead letters by death time), optionally filtered."""
        self.config(queue)
        rows: list[tuple[JobState, Job]] = []
        if state != "dead":
            members = self.index.jobs_of(queue)
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

    # --- writers ---------------------------------------------------------------------------

    def mark_writer(self, writer: str, commit_id: str, now: float) -> None:
        """Remember ``commit_id`` as the last commit of ``writer``; forget the writers that
        committed nothing for :data:`~objq_broker.model.records.WRITER_MARK_TTL_SECONDS`, and
        the least recent ones past :data:`~objq_broker.model.records.MAX_WRITER_MARKS`."""
        marks = self.doc.writers
        # The least recent come first: a writer that commits again moves to the end (a lone
        # writer, or one committing twice in a row, is there already).
        if next(reversed(marks), None) != writer:
            marks.pop(writer, None)
        marks[writer] = WriterMark(commit_id, now)
        if len(marks) > MAX_WRITER_MARKS or (
            next(iter(marks.values())).at < now - WRITER_MARK_TTL_SECONDS
        ):
            self._forget_writers(now)
        self.dirty = True

    def _forget_writers(self, now: float) -> None:
        marks = self.doc.writers
        # The last mark is the one just made: it stays.
        while (
            len(marks) > MAX_WRITER_MARKS
            or next(iter(marks.values())).at < now - WRITER_MARK_TTL_SECONDS
        ):
            del marks[next(iter(marks))]

    # --- broker sessions ---------------------------------------------------------------

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


def session_key(client: str) -> str:
    """Where the state keeps the mark of broker client ``client``: a hash of its id, never the
    id itself. The state is readable by anyone with the bucket (and the dashboard shows the
    marks): whoever could read a client's id could send sessions under it, and a session
    numbered past the client's next would make the broker answer that one as a replay."""
    return hashlib.blake2b(client.encode(), digest_size=12).hexdigest()
