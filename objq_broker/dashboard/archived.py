"""The dashboard's archive pages: finished jobs searched in the archive objects and the state's
archive tail, newest first, a page at a time, and one archived job.

A page reads at most :data:`MAX_ARCHIVE_OBJECTS_PER_PAGE` archive objects and hands back a cursor
to go on from, so a filter that matches little never reads a month of archive in one request.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from objq_broker.dashboard.decode import task_name
from objq_broker.dashboard.reading import JobDetail, job_detail
from objq_broker.engine.archive import (
    TAIL_KEY,
    RecordId,
    archive_keys,
    finished_within,
    read_archive,
    read_tail,
    record_id,
)
from objq_broker.model.records import ArchiveRecord, Job
from objq_broker.storage import ObjectStore

#: Archive objects one archive page reads at most before it stops and offers to go on: a
#: filter that matches little must not read a month of archive in one request.
MAX_ARCHIVE_OBJECTS_PER_PAGE = 200


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
    return job_detail(
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
