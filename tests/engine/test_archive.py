"""Reading the archive back by time range."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from objq_broker import Queue
from objq_broker.engine.archive import (
    archive_key,
    archive_keys,
    iter_archive,
    key_hour,
    read_archive,
)
from objq_broker.errors import StateCorrupt
from objq_broker.model.encoding import encode_archive
from objq_broker.model.records import ArchiveRecord, Job
from objq_broker.storage import MemoryStore


def _at(day: int, hour: int, minute: int = 0) -> float:
    return datetime(2026, 3, day, hour, minute, tzinfo=UTC).timestamp()


def _store_record(store: MemoryStore, job_id: str, finished_at: float, committed_at: float) -> str:
    job = Job(id=job_id, queue="q", body="x", seq=1, enqueued_at=0.0, visible_at=0.0,
              max_attempts=1, finished_at=finished_at)  # fmt: skip
    key = archive_key(f"c-{job_id}", committed_at)
    store.put(key, encode_archive([ArchiveRecord("done", f"c-{job_id}", job)]))
    return key


def test_acked_jobs_are_archived_under_the_commit_hour() -> None:
    # Given a queue whose jobs were acked and one dead-lettered
    store = MemoryStore("archive-hour")
    with Queue(store=store) as queue:
        queue.declare("q", max_attempts=1)
        queue.enqueue_many("q", [b"a", b"b", b"c"])
        for delivery in queue.claim("q", 3):
            if delivery.payload == b"c":
                queue.nack(delivery, error="boom")
            else:
                queue.ack(delivery)
        queue.flush()
    # Then every finished job is in the archive once, with its outcome and payload
    records = list(iter_archive(store))
    assert sorted((r.outcome, r.job.payload) for r in records) == [
        ("dead", b"c"),
        ("done", b"a"),
        ("done", b"b"),
    ]
    for key in archive_keys(store):
        assert abs(key_hour(key).timestamp() - (records[0].job.finished_at or 0)) < 3600
        assert read_archive(store, key)


def test_a_time_range_lists_only_its_days_and_filters_by_finish_time() -> None:
    store = MemoryStore("archive-range")
    _store_record(store, "old", _at(1, 10), _at(1, 10))
    _store_record(store, "in", _at(5, 10, 30), _at(5, 10, 30))
    # finished before 11:00 but committed in the 11:00 folder
    _store_record(store, "edge", _at(5, 10, 59), _at(5, 11, 0))
    _store_record(store, "late", _at(5, 12, 30), _at(5, 12, 30))
    _store_record(store, "new", _at(9, 10), _at(9, 10))
    listed: list[str] = []
    original = store.list

    def counting_list(prefix: str = "") -> list[str]:
        listed.append(prefix)
        return original(prefix)

    store.list = counting_list  # type: ignore[method-assign]
    found = sorted(r.job.id for r in iter_archive(store, _at(5, 10), _at(5, 11)))
    assert found == ["edge", "in"]
    assert listed == ["archive/2026/03/05/"]
    assert sorted(r.job.id for r in iter_archive(store, until=_at(5, 11))) == ["edge", "in", "old"]
    assert sorted(r.job.id for r in iter_archive(store, _at(5, 12))) == ["late", "new"]


def test_a_foreign_key_in_the_archive_folder_is_reported() -> None:
    with pytest.raises(StateCorrupt, match="expected archive/YYYY/MM/DD/HH"):
        key_hour("archive/2026/03/notes.jsonl")


def test_a_range_of_decades_lists_the_archive_once_not_once_a_day() -> None:
    store = MemoryStore("archive-decades")
    _store_record(store, "in", _at(5, 10), _at(5, 10))
    listed: list[str] = []
    original = store.list

    def counting_list(prefix: str = "") -> list[str]:
        listed.append(prefix)
        return original(prefix)

    store.list = counting_list  # type: ignore[method-assign]
    year_9999 = 253_370_764_800.0
    assert [r.job.id for r in iter_archive(store, 0.0, year_9999)] == ["in"]
    assert listed == ["archive/"]
