"""What the dashboard's pages show, read the way ``objq status`` and ``objq workers`` read.

Every page reads the store through the read-only
:class:`~objq_broker.engine.snapshot.Snapshot` (the state object read once, plus the runs a
listing needs): looking at a queue never changes it, never takes part in the broker election,
and never adds a writer to the namespace. A page of jobs holds one page of rows, whatever the
depth of the queue; only the rows shown have their payloads loaded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import msgspec

from objq_broker import QueueStats
from objq_broker.dashboard.decode import (
    DecodedMessage,
    ShownPayload,
    decode_message,
    show_payload,
    task_name,
)
from objq_broker.engine.archive import (
    TAIL_KEY,
)
from objq_broker.engine.snapshot import Snapshot, StateSummary
from objq_broker.errors import PayloadInvalid, QueueNotFound
from objq_broker.model.records import Job, JobState
from objq_broker.model.workers import Worker, WorkerStatus
from objq_broker.storage import ObjectStore

#: The states of a queue page, in the order of its tabs.
STATES: tuple[JobState, ...] = ("ready", "delayed", "in-flight", "dead")
#: Characters of a payload shown in a row of a list.
PREVIEW_CHARS = 80
#: Broker clients listed on the broker page.
MAX_SESSIONS_SHOWN = 100


@dataclass(frozen=True)
class Overview:
    """The namespace at one moment: what the overview and broker pages and their JSON show."""

    url: str
    summary: StateSummary
    #: (client id, Unix time of its last request that changed the state), latest first.
    sessions: list[tuple[str, float]]
    queues: list[QueueStats]

    def as_json(self) -> dict[str, Any]:
        """The overview's JSON: the fields of ``objq status --json`` and the counter the rate
        chart needs."""
        state = self.summary
        return {
            "url": self.url,
            "exists": state.exists,
            "version": state.version,
            "size_bytes": state.size_bytes,
            "committed_at": state.committed_at,
            "read_at": state.read_at,
            "enqueued_total": state.enqueued_total,
            "broker": None
            if state.broker is None
            else {
                "address": state.broker.address,
                "epoch": state.broker.epoch,
                "since": state.broker.since,
                "secured": state.broker.secured,
                "active_clients": state.active_clients,
            },
            "queues": [msgspec.to_builtins(q) for q in self.queues],
        }


def read_overview(store: ObjectStore) -> Overview:
    snap = Snapshot.read(store)
    queues = [snap.stats(name) for name in snap.queue_names()]
    # After the queues, as objq status does: counting them may read a later state (when runs
    # it referred to were consumed meanwhile), and these facts then describe that one.
    sessions = snap.broker_sessions()[:MAX_SESSIONS_SHOWN] if snap.broker is not None else []
    return Overview(store.url, snap.summary(), sessions, queues)


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

    counts: QueueStats
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
    counts = snap.stats(queue)
    pages = max(1, math.ceil(counts.count(state) / page_size))
    page = min(max(page, 1), pages)
    start = (page - 1) * page_size
    found = snap.jobs(queue, state, start + page_size)[start:]
    rows = [_row(where, snap.fill(job)) for where, job in found]
    return QueuePage(counts, state, page, pages, page_size, rows, snap.read_at)


def dead_counts(store: ObjectStore) -> list[QueueStats]:
    """Every queue that holds dead letters, most first."""
    snap = Snapshot.read(store)
    counts = [snap.stats(name) for name in snap.queue_names()]
    return sorted((c for c in counts if c.dead), key=lambda c: (-c.dead, c.queue))


def _row(state: str, job: Job) -> JobRow:
    if job.ref is not None and not job.body:
        return JobRow(state, job, None, f"<{job.ref}>")
    if job.b64:
        try:
            shown = f"<{len(job.payload):,} bytes>"
        except PayloadInvalid:  # a row shows its raw size, and says why consumers refuse it
            shown = f"<{len(job.body.encode()):,} bytes{_INVALID}>"
        return JobRow(state, job, None, shown)
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
    return job_detail(state, snap.fill(job), snap.read_at)


def job_detail(state: str, job: Job, read_at: float, **where: str) -> JobDetail:
    """What the job page shows of ``job``, found in ``state`` (``where``: its archive object
    and commit, for an archived record)."""
    if job.ref is not None and not job.body:  # an archived record keeps no out-of-line body
        return JobDetail(state, job, None, None, read_at, **where)
    payload = job.shown_payload  # a poison job's raw bytes: what a reader can be shown
    return JobDetail(state, job, show_payload(payload), decode_message(payload), read_at, **where)


#: How a row marks a job whose body is marked base64 and is not (consumers dead-letter it).
_INVALID = ", marked base64 but not"
