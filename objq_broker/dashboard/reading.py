"""What the dashboard's pages show, read the way ``objq status`` and ``objq workers`` read.

Every page reads the store through the read-only
:class:`~objq_broker.engine.snapshot.Snapshot` (the state object read once, plus the runs a
listing needs): looking at a queue never changes it, never takes part in the broker election,
and never adds a writer to the namespace. A page of jobs holds one page of rows, whatever the
depth of the queue; only the rows shown have their payloads loaded.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from objq_broker.dashboard.decode import (
    DecodedMessage,
    ShownPayload,
    decode_message,
    show_payload,
    task_name,
)
from objq_broker.engine.archive import (
    TAIL_KEY,
    RecordId,
    archive_keys,
    finished_within,
    read_archive,
    read_tail,
    record_id,
)
from objq_broker.engine.snapshot import ACTIVE_CLIENT_SECONDS, Snapshot
from objq_broker.errors import QueueNotFound
from objq_broker.model.records import ArchiveRecord, BrokerRecord, Job, JobState
from objq_broker.model.workers import Worker, WorkerStatus
from objq_broker.storage import ObjectStore

#: The states of a queue page, in the order of its tabs.
STATES: tuple[JobState, ...] = ("ready", "delayed", "in-flight", "dead")
#: Characters of a payload shown in a row of a list.
PREVIEW_CHARS = 80
#: Archive objects one archive page reads at most before it stops and offers to go on: a
#: filter that matches little must not read a month of archive in one request.
MAX_ARCHIVE_OBJECTS_PER_PAGE = 200
#: Broker clients listed on the broker page.
MAX_SESSIONS_SHOWN = 100


@dataclass(frozen=True)
class QueueCounts:
    """One queue's jobs by state, as ``objq status`` counts them."""

    queue: str
    ready: int
    delayed: int
    in_flight: int
    dead: int
    oldest_ready_age_seconds: float | None

    def count(self, state: JobState) -> int:
        return {"ready": self.ready, "delayed": self.delayed, "dead": self.dead}.get(
            state, self.in_flight
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "ready": self.ready,
            "delayed": self.delayed,
            "in_flight": self.in_flight,
            "dead": self.dead,
            "oldest_ready_age_seconds": self.oldest_ready_age_seconds,
        }


@dataclass(frozen=True)
class BrokerView:
    """The elected broker as the state names it, and the clients it commits for."""

    record: BrokerRecord
    epoch: int
    active_clients: int
    #: (client id, Unix time of its last request that changed the state), latest first.
    sessions: list[tuple[str, float]]


@dataclass(frozen=True)
class Overview:
    """The namespace at one moment: what the overview page and its JSON show."""

    url: str
    exists: bool
    version: int
    size_bytes: int
    committed_at: float | None
    read_at: float
    enqueued_total: int
    broker: BrokerView | None
    queues: list[QueueCounts]

    def as_json(self) -> dict[str, Any]:
        """The overview's JSON: the fields of ``objq status --json`` and the counter the rate
        chart needs."""
        return {
            "url": self.url,
            "exists": self.exists,
            "version": self.version,
            "size_bytes": self.size_bytes,
            "committed_at": self.committed_at,
            "read_at": self.read_at,
            "enqueued_total": self.enqueued_total,
            "broker": None
            if self.broker is None
            else {
                "address": self.broker.record.address,
                "epoch": self.broker.record.epoch,
                "since": self.broker.record.since,
                "tls": self.broker.record.tls,
                "active_clients": self.broker.active_clients,
            },
            "queues": [q.as_json() for q in self.queues],
        }


def read_overview(store: ObjectStore) -> Overview:
    snap = Snapshot.read(store)
    queues = [_counts(snap, name) for name in snap.queue_names()]
    # After the queues, as objq status does: counting them may read a later state (when runs
    # it referred to were consumed meanwhile), and these facts then describe that one.
    return Overview(
        url=store.url,
        exists=snap.exists,
        version=snap.version,
        size_bytes=snap.size_bytes,
        committed_at=snap.committed_at,
        read_at=snap.read_at,
        enqueued_total=snap.enqueued_total,
        broker=_broker(snap),
        queues=queues,
    )


def _counts(snap: Snapshot, queue: str) -> QueueCounts:
    stats = snap.stats(queue)
    return QueueCounts(
        queue,
        stats.ready,
        stats.delayed,
        stats.in_flight,
        stats.dead,
        stats.oldest_ready_age_seconds,
    )


def _broker(snap: Snapshot) -> BrokerView | None:
    if snap.broker is None:
        return None
    return BrokerView(
        snap.broker,
        snap.epoch,
        snap.broker_clients(ACTIVE_CLIENT_SECONDS),
        snap.broker_sessions()[:MAX_SESSIONS_SHOWN],
    )


# --- who is working -----------------------------------------------------------------------


@dataclass(frozen=True)
class WorkersView:
    """The lease holders at one moment (:mod:`objq_broker.model.workers`): those at work,
    then those gone lately, each by owner name."""

    url: str
    read_at: float
    workers: list[Worker]

    def count(self, status: WorkerStatus) -> int:
        return sum(1 for w in self.workers if w.status == status)

    def since(self, at: float | None) -> float | None:
        """Seconds from ``at`` to the read; never negative (another host's clock may run a
        little ahead of this one)."""
        return None if at is None else max(self.read_at - at, 0.0)

    def as_json(self) -> dict[str, Any]:
        """The rows of ``objq workers --json`` (every field, Unix seconds), and the time of
        the read they are as of."""
        return {
            "url": self.url,
            "read_at": self.read_at,
            "workers": [msgspec.structs.asdict(w) for w in self.workers],
        }


def read_workers(store: ObjectStore) -> WorkersView:
    snap = Snapshot.read(store)
    return WorkersView(store.url, snap.read_at, snap.workers())


# --- a queue's jobs ------------------------------------------------------------------------


@dataclass(frozen=True)
class JobRow:
    """One job in a list: its record (payload loaded) and what the list shows of it."""

    state: str
    job: Job
    task: str | None
    preview: str


@dataclass(frozen=True)
class QueuePage:
    """One page of one state of one queue."""

    counts: QueueCounts
    state: JobState
    page: int
    pages: int
    page_size: int
    rows: list[JobRow]
    read_at: float

    @property
    def total(self) -> int:
        return self.counts.count(self.state)

    @property
    def first(self) -> int:
        """The number of the first row shown, from 1."""
        return (self.page - 1) * self.page_size + 1


def read_queue_page(
    store: ObjectStore, queue: str, state: JobState, page: int, page_size: int
) -> QueuePage:
    """Page ``page`` (from 1) of the jobs of ``queue`` in ``state``, in claim order (dead
    letters by death time). A page past the last shows the last."""
    snap = Snapshot.read(store)
    if queue not in snap.queue_names():
        raise QueueNotFound(f"queue {queue!r}: not declared in {store.url}")
    counts = _counts(snap, queue)
    pages = max(1, math.ceil(counts.count(state) / page_size))
    page = min(max(page, 1), pages)
    start = (page - 1) * page_size
    found = snap.jobs(queue, state, start + page_size)[start:]
    rows = [_row(where, snap.fill(job)) for where, job in found]
    return QueuePage(counts, state, page, pages, page_size, rows, snap.read_at)


def dead_counts(store: ObjectStore) -> list[QueueCounts]:
    """Every queue that holds dead letters, most first."""
    snap = Snapshot.read(store)
    counts = [_counts(snap, name) for name in snap.queue_names()]
    return sorted((c for c in counts if c.dead), key=lambda c: (-c.dead, c.queue))


def _row(state: str, job: Job) -> JobRow:
    if job.ref is not None and not job.body:
        return JobRow(state, job, None, f"<{job.ref}>")
    if job.b64:
        return JobRow(state, job, None, f"<{len(job.payload):,} bytes>")
    text = " ".join(job.body.split())
    cut = text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"
    return JobRow(state, job, task_name(job.payload), cut)


# --- one job -------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobDetail:
    """Everything the job page shows."""

    #: Where the job is ("ready", "delayed", "in-flight", "dead"), or how it left the queue
    #: (the outcome of its archive record: "done", "dead", "failed", ...).
    state: str
    job: Job
    payload: ShownPayload | None
    message: DecodedMessage | None
    read_at: float
    #: The archive object the record was read from (:data:`TAIL_KEY`: the state's archive
    #: tail); None for a job still in the state.
    archive_key: str | None = None
    commit_id: str | None = None

    @property
    def in_tail(self) -> bool:
        """Whether the record was read from the state's archive tail, not an object."""
        return self.archive_key == TAIL_KEY


def read_job(store: ObjectStore, job_id: str) -> JobDetail | None:
    """The job ``job_id`` while it is in the state (live or dead); None once it left it."""
    snap = Snapshot.read(store)
    found = snap.find(job_id)
    if found is None:
        return None
    state, job = found
    return _detail(state, snap.fill(job), snap.read_at)


def _detail(state: str, job: Job, read_at: float, **where: str) -> JobDetail:
    if job.ref is not None and not job.body:  # an archived record keeps no out-of-line body
        return JobDetail(state, job, None, None, read_at, **where)
    payload = job.payload
    return JobDetail(state, job, show_payload(payload), decode_message(payload), read_at, **where)


# --- the archive -------------------------------------------------------------------------


@dataclass(frozen=True)
class ArchiveRow:
    outcome: str
    job: Job
    task: str | None
    key: str


@dataclass(frozen=True)
class ArchivePage:
    """Archived jobs, newest hour first, and where the next page starts (None: no more).
    Within an hour the archive's objects come in the order of their keys (commit ids, not
    times): ordering them by time would mean reading every object of the hour for each page."""

    rows: list[ArchiveRow]
    #: Where the next page goes on from: ``KEY:@RECORD`` after the record shown last (which
    #: names it whatever moved meanwhile: the state's tail is written out into an object
    #: between page loads), or ``KEY:0`` from the start of an object not read yet.
    next_cursor: str | None
    objects_read: int
    #: True when the page stopped at :data:`MAX_ARCHIVE_OBJECTS_PER_PAGE` before it was full.
    stopped_early: bool


#: Where a page starts: the key, and the number of matching records of it already shown (a
#: ``KEY:NUMBER`` cursor) or the record shown last (``KEY:@RECORD``).
_Start = tuple[str | None, int | RecordId]


def search_archive(
    store: ObjectStore,
    *,
    queue: str | None,
    since: float | None,
    until: float | None,
    cursor: str | None,
    page_size: int,
) -> ArchivePage:
    """Records of jobs finished in ``[since, until)`` (of ``queue``, or all), from ``cursor``
    on. Reads the archive objects of the range one by one, newest hour first (each one's
    records last first), and stops once a page is full.

    A page that ended in the state's tail goes on after the record it showed last, wherever
    that record is now: still in the tail, or in an object the tail was written out to since
    (of the newest hour), so no record is skipped or shown twice."""
    tail = read_tail(store)  # before the listing (see engine.archive); the newest of all
    in_tail = {record_id(record) for record in tail}
    keys = sorted(archive_keys(store, since, until), reverse=True)
    if tail:
        keys.insert(0, TAIL_KEY)  # sorts after every archive/ key, as cursors compare them

    def matching(key: str) -> list[ArchiveRecord]:
        held = tail if key == TAIL_KEY else read_archive(store, key)
        if key != TAIL_KEY:
            held = [r for r in held if record_id(r) not in in_tail]
        return [
            r
            for r in reversed(held)
            if (queue is None or r.job.queue == queue) and finished_within(r, since, until)
        ]

    start_key, after = _parse_cursor(cursor)
    if start_key is not None and start_key != TAIL_KEY:
        keys = [k for k in keys if k <= start_key]
    page = _page(keys, matching, (start_key, after), page_size)
    if page is None:  # the record shown last is nowhere now: go on from the objects
        page = _page([k for k in keys if k != TAIL_KEY], matching, (None, 0), page_size)
        assert page is not None  # (nothing to seek)
    return page


def _page(
    keys: list[str],
    matching: Callable[[str], list[ArchiveRecord]],
    start: _Start,
    page_size: int,
) -> ArchivePage | None:
    """A page of the records of ``keys`` (``matching`` each), from ``start``; None if it
    was to go on after a record of the state's tail found nowhere."""
    start_key, after = start
    seeking = after if isinstance(after, tuple) else None
    rows: list[ArchiveRow] = []
    last: RecordId | None = None
    for read, key in enumerate(keys):
        if read >= MAX_ARCHIVE_OBJECTS_PER_PAGE:
            if seeking is not None:
                return None  # not in the tail, nor in the newest objects
            return ArchivePage(rows, f"{key}:0", read, stopped_early=True)
        matched = matching(key)
        if key == start_key and isinstance(after, int):
            matched = matched[after:]
        if seeking is not None:
            matched, seeking = _after(seeking, matched, key, start_key)
        for record in matched:
            if len(rows) == page_size:
                return ArchivePage(rows, _cursor_after(rows[-1].key, last), read + 1, False)
            job = record.job
            task = task_name(job.payload) if job.body and not job.b64 else None
            rows.append(ArchiveRow(record.outcome, job, task, key))
            last = record_id(record)
    if seeking is not None:
        return None
    return ArchivePage(rows, None, len(keys), stopped_early=False)


def _after(
    shown: RecordId, matched: list[ArchiveRecord], key: str, start_key: str | None
) -> tuple[list[ArchiveRecord], RecordId | None]:
    """The records of ``key`` after ``shown`` (the record the last page ended with), and
    what is still to be found. A record of the state's tail is looked for further on when it
    is no longer there (it was written out to the newest object); one of an object, only in
    that object (if it is gone, the page goes on with the next)."""
    ids = [record_id(r) for r in matched]
    if shown in ids:
        return matched[ids.index(shown) + 1 :], None
    if start_key == TAIL_KEY:
        return [], shown
    return ([], None) if key == start_key else (matched, None)


def read_archived_job(store: ObjectStore, key: str, job_id: str) -> JobDetail | None:
    """The record of ``job_id`` in the archive object ``key``, or in the state's archive tail
    for :data:`TAIL_KEY` (the last one there, if the job was archived twice)."""
    held = read_tail(store) if key == TAIL_KEY else read_archive(store, key)
    found = [r for r in held if r.job.id == job_id]
    if not found:
        return None
    record = found[-1]
    return _detail(
        record.outcome,
        record.job,
        record.job.finished_at or 0.0,
        archive_key=key,
        commit_id=record.commit_id,
    )


def _parse_cursor(cursor: str | None) -> _Start:
    if not cursor:
        return None, 0
    key, _, where = cursor.rpartition(":")
    if key and where.isdigit():
        return key, int(where)
    if key and where.startswith("@"):
        try:
            found = msgspec.json.decode(base64.urlsafe_b64decode(where[1:]), type=RecordId)
        except (ValueError, msgspec.DecodeError):
            pass
        else:
            return key, found
    raise ValueError(f"archive cursor: expected KEY:NUMBER or KEY:@RECORD, found {cursor!r}")


def _cursor_after(key: str, shown: RecordId | None) -> str:
    """The cursor of the next page after ``shown``, the record shown last, found in ``key``."""
    encoded = base64.urlsafe_b64encode(msgspec.json.encode(shown)).decode()
    return f"{key}:@{encoded}"
