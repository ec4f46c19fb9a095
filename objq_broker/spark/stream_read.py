"""The streaming source of finished jobs: ``spark.readStream.format("objq")``.

    (spark.readStream.format("objq").option("url", "s3://jobs-bucket/objq")
        .option("table", "archive").option("queues", "emails,reports")
        .option("startingOffsets", "earliest").load())

Each micro-batch holds the archive records (jobs acked or dead-lettered, and frameworks' notes
on them) archived since the last, in the columns of the batch ``archive`` table: each record
once per query, in order of archiving from one micro-batch to the next.

**Offsets** name what was read, so a query restarted from its checkpoint goes on where it
stopped, and a micro-batch run again reads the same records:

* ``cutoff``: every archive object last written at or before this time (the storage's clock)
  has been read; ``recent``: the objects written after it that have been read too (an object's
  name is its commit's random id, so a listing gives no order; its modification time does).
  The cutoff trails the newest object listed by ``late_seconds``: an object that becomes
  listable later than that after it was written is missed.
* ``tail``: how far into the state's archive tail the query has read: the tail's first record
  and a count. A tail is written out as an archive object whose records begin with the tail's
  (:func:`objq_broker.engine.archive.plan_archive`); the records of such an object that were
  read from the tail are skipped.
* ``version``: the state's version when it was read: a trigger that finds the same version
  lists nothing, since no commit (and so no archive object) landed meanwhile.

**Cost per trigger**: one GET of the state. When it changed, one LIST per hour folder from the
hour of the cutoff (or of the tail's first record, or of an object named in ``recent``, if
earlier) to the next hour, usually two or three, each a page per 1,000 objects; then one GET
per new archive object, in the executors.

The archive can hold a job twice: a writer that crashed between its archive object and its
state archives those jobs again, and an object a commit wrote before losing its race is
removed a moment later but may be listed meanwhile. Such a job is in two micro-batches, as it
is twice in the batch table; ``dropDuplicatesWithinWatermark(["id", "state"])`` after
``withWatermark("finished_at", ...)`` drops the second.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from objq_broker.engine.archive import (
    ARCHIVE_PREFIX,
    floor_hour,
    key_hour,
    read_archive,
    record_id,
)
from objq_broker.engine.snapshot import Snapshot
from objq_broker.errors import ConfigurationError, ObjectNotFound
from objq_broker.model.durations import parse_time
from objq_broker.model.records import ArchiveRecord
from objq_broker.spark.read import DEFAULT_OBJECTS_PER_PARTITION, RowBuilder, TimeBounds
from objq_broker.spark.rows import check_known
from objq_broker.storage import ObjectMeta, ObjectStore, open_store

#: Where a query without a checkpoint starts, as Kafka's source says it.
STARTING_OFFSETS = ("earliest", "latest")
#: How long after it was written an archive object may first be listed and still be read.
DEFAULT_LATE_SECONDS = 60.0
#: Up to this many hours of folders are listed hour by hour; beyond, day by day.
HOURS_LISTED_ONE_BY_ONE = 48

_HOUR = timedelta(hours=1)
_DAY = timedelta(days=1)

Offset = dict[str, Any]


def _option(name: str, default: Any = None) -> Any:
    return field(default=default, metadata={"option": name})


@dataclass(frozen=True)
class StreamOptions:
    """The streaming source's options (each field's ``option`` names it), checked when the
    query starts."""

    url: str = _option("url", "")
    #: Only the jobs of these queues (comma-separated), as Kafka's ``subscribe``.
    queues: frozenset[str] | None = _option("queues")
    #: Where a query without a checkpoint starts: ``earliest`` or ``latest`` (the default).
    starting: str = _option("startingOffsets", "latest")
    #: Or from a time (ISO 8601, Unix seconds, or an age such as ``2h``): the jobs finished
    #: since then.
    starting_at: float | None = _option("startingTimestamp")
    late_seconds: float = _option("late_seconds", DEFAULT_LATE_SECONDS)
    objects_per_partition: int = _option("objects_per_partition", DEFAULT_OBJECTS_PER_PARTITION)

    @classmethod
    def from_options(cls, options: Mapping[str, str], url: str, objects: int) -> StreamOptions:
        where = "objq stream reader"
        raw_queues = options.get("queues")
        queues = None
        if raw_queues is not None:
            queues = frozenset(q.strip() for q in str(raw_queues).split(",") if q.strip())
            if not queues:
                raise ConfigurationError(f"{where}: option 'queues' names no queue: {raw_queues!r}")
        starting = options.get("startingOffsets")
        at = options.get("startingTimestamp")
        if starting is not None and at is not None:
            raise ConfigurationError(
                f"{where}: got both startingOffsets={starting!r} and startingTimestamp={at!r}; "
                "expected one"
            )
        starting = str(starting or "latest").lower()
        if starting not in STARTING_OFFSETS:
            raise ConfigurationError(
                f"{where}: startingOffsets must be one of {STARTING_OFFSETS}, found {starting!r}"
            )
        starting_at = None if at is None else parse_time(str(at), time.time(), "startingTimestamp")
        late = options.get("late_seconds")
        try:
            late_seconds = DEFAULT_LATE_SECONDS if late is None else float(late)
        except ValueError:
            late_seconds = -1.0
        if not 0 <= late_seconds < 86400:
            raise ConfigurationError(
                f"{where}: late_seconds must be seconds from 0 to 86400, found {late!r}"
            )
        return cls(url, queues, starting, starting_at, late_seconds, objects)


@dataclass
class StreamPartition(InputPartition):
    """A micro-batch's share for one task: archive objects, or records of the state's tail."""

    keys: list[str] = field(default_factory=list)
    #: Records to skip at the start of an object whose first record is one of these: they were
    #: (or are, in this micro-batch) read from the state's tail.
    skips: dict[tuple[str, str, str], int] = field(default_factory=dict)
    records: list[ArchiveRecord] = field(default_factory=list)
    #: Records of jobs finished before this are left out (``startingTimestamp``).
    since: float | None = None


@dataclass
class _Listed:
    """A listing of archive objects, and the offset it ended at."""

    end: Offset
    objects: list[ObjectMeta]
    tail: list[ArchiveRecord]


class ObjqStreamReader(DataSourceStreamReader):
    """Plans each micro-batch from the state and a listing of the newest archive folders."""

    def __init__(self, options: StreamOptions) -> None:
        self.options = options
        self._listed: _Listed | None = None

    def initialOffset(self) -> Offset:
        options = self.options
        start: Offset = {
            "version": -1,
            "cutoff": -1.0,  # every object is new
            "recent": [],
            "tail": None,
            "from": options.starting_at,
        }
        if options.starting_at is not None:
            # An object written this long before the time holds no job finished after it.
            start["cutoff"] = options.starting_at - options.late_seconds
        elif options.starting == "latest":
            # What is archived now counts as read: objects written before the lateness
            # allowed, and what the listing and the state's tail hold.
            start["cutoff"] = time.time() - options.late_seconds
            return self._advance(start)
        return start

    def latestOffset(self, start: Offset, limit: Any = None) -> Offset:
        return self._advance(start)

    def _advance(self, start: Offset) -> Offset:
        store = open_store(self.options.url)
        try:
            snapshot = Snapshot.read(store)  # before the listing: see engine.archive
            if snapshot.version == start["version"]:
                return start
            tail = snapshot.archive_tail
            objects = _list_from(store, _first_hour(start, self.options.late_seconds))
        finally:
            store.close()
        newest = max((meta.modified for meta in objects), default=start["cutoff"])
        cutoff = max(start["cutoff"], newest - self.options.late_seconds)
        end: Offset = {
            "version": snapshot.version,
            "cutoff": cutoff,
            # Every object listed is read by the end offset: name those the cutoff does not.
            "recent": sorted(_short(meta.key) for meta in objects if meta.modified > cutoff),
            "tail": _tail_offset(tail, snapshot.committed_at or time.time()),
            "from": start.get("from"),
        }
        if {**end, "version": start["version"]} == start:
            return start  # commits without archive records (enqueues): no micro-batch for them
        self._listed = _Listed(end, objects, tail)
        return end

    def partitions(self, start: Offset, end: Offset) -> Sequence[StreamPartition]:
        if start == end:
            return []
        listed = self._listed
        if listed is None or listed.end != end:  # run again after a restart: list again
            store = open_store(self.options.url)
            try:
                objects = _list_from(store, _first_hour(start, self.options.late_seconds))
                tail = _tail_records(store, end.get("tail"))
            finally:
                store.close()
            listed = _Listed(end, objects, tail)
        self._listed = None
        recent, done = set(end["recent"]), set(start["recent"])
        new = sorted(
            (
                meta
                for meta in listed.objects
                if meta.modified > start["cutoff"]
                and _short(meta.key) not in done
                and (meta.modified <= end["cutoff"] or _short(meta.key) in recent)
            ),
            key=lambda meta: (meta.modified, meta.key),
        )
        skips = {**_skip(start.get("tail")), **_skip(end.get("tail"))}
        size = self.options.objects_per_partition
        since = end.get("from")
        parts = [
            StreamPartition(keys=[meta.key for meta in new[i : i + size]], skips=skips, since=since)
            for i in range(0, len(new), size)
        ]
        records = _tail_slice(start.get("tail"), end.get("tail"), listed.tail)
        if records:
            parts.append(StreamPartition(records=records, since=since))
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, StreamPartition)
        options = self.options
        store = open_store(options.url)
        try:
            queues = None if options.queues is None else set(options.queues)
            rows = RowBuilder(queues, TimeBounds(lower=partition.since))
            for record in _records(store, partition):
                rows.add(record.outcome, record.job, store)
                if rows.full():
                    yield rows.flush()
            if rows.count:
                yield rows.flush()
        finally:
            store.close()

    def commit(self, end: Offset) -> None:
        """Nothing to release: the offsets name immutable objects."""


#: The streaming source's options, listed in errors about unknown ones.
STREAM_OPTIONS = ("table", *(f.metadata["option"] for f in fields(StreamOptions)))


def check_stream_options(options: Mapping[str, str]) -> None:
    """Refuse an option the streaming source does not know, listing those it does."""
    check_known(options, STREAM_OPTIONS, "objq stream reader")


def _records(store: ObjectStore, partition: StreamPartition) -> Iterator[ArchiveRecord]:
    for key in partition.keys:
        try:
            records = read_archive(store, key)
        except ObjectNotFound:
            continue  # a losing try's object, removed once the winning try landed
        if records:
            yield from records[partition.skips.get(record_id(records[0]), 0) :]
    yield from partition.records


def _short(key: str) -> str:
    """An archive key as offsets hold it: ``YYYY/MM/DD/HH/<commit id>``."""
    return key.removeprefix(ARCHIVE_PREFIX).removesuffix(".jsonl")


def _first_hour(start: Offset, late_seconds: float) -> datetime | None:
    """The oldest hour folder to list: the cutoff's (less the lateness allowed), the tail's
    (it is written out to the folder of its first hour), or that of an object the offset
    names as read after the cutoff (so that it is listed, and stays named, until the cutoff
    passes it). None: every folder."""
    cutoff = start["cutoff"]
    if cutoff < 0:
        return None
    first = floor_hour(cutoff - late_seconds)
    if start.get("tail"):
        first = min(first, floor_hour(start["tail"]["at"]))
    if start["recent"]:  # names begin with their hour: the least is the oldest
        first = min(first, key_hour(f"{ARCHIVE_PREFIX}{min(start['recent'])}.jsonl"))
    return first


def _list_from(store: ObjectStore, first: datetime | None) -> list[ObjectMeta]:
    """The archive objects in the hour folders from ``first`` (None: all of them) to the
    next hour (a writer's clock may run a little ahead)."""
    if first is None:
        return _archive_meta(store, ARCHIVE_PREFIX)
    # The storage's clock (which the cutoff follows) may run ahead of this machine's.
    last = max(floor_hour(time.time()), first) + _HOUR
    found: list[ObjectMeta] = []
    if last - first > HOURS_LISTED_ONE_BY_ONE * _HOUR:
        day = first.replace(hour=0)
        while day <= last:
            listed = _archive_meta(store, f"{ARCHIVE_PREFIX}{day:%Y/%m/%d}/")
            found += [meta for meta in listed if key_hour(meta.key) >= first]
            day += _DAY
        return found
    hour = first
    while hour <= last:
        found += _archive_meta(store, f"{ARCHIVE_PREFIX}{hour:%Y/%m/%d/%H}/")
        hour += _HOUR
    return found


def _archive_meta(store: ObjectStore, prefix: str) -> list[ObjectMeta]:
    # Only ``.jsonl`` objects: a crashed writer's temporary files never count.
    return [meta for meta in store.list_meta(prefix) if meta.key.endswith(".jsonl")]


def _tail_offset(tail: list[ArchiveRecord], now: float) -> dict[str, Any] | None:
    """How far into ``tail`` a query has read once it read all of it. ``at``: when its first
    record's job finished, at or just before the commit that began the tail, whose hour
    folder the tail is written out to."""
    if not tail:
        return None
    at = tail[0].job.finished_at or now
    return {"at": at, "first": list(record_id(tail[0])), "count": len(tail)}


def _skip(tail: dict[str, Any] | None) -> dict[tuple[str, str, str], int]:
    if not tail:
        return {}
    commit, job, outcome = tail["first"]
    return {(commit, job, outcome): tail["count"]}


def _tail_slice(
    start: dict[str, Any] | None, end: dict[str, Any] | None, tail: list[ArchiveRecord]
) -> list[ArchiveRecord]:
    """The records of the end offset's tail this micro-batch reads: those past the start
    offset's count when it is the same tail, else all that the end offset counts."""
    if not end:
        return []
    begin = start["count"] if start and start["first"] == end["first"] else 0
    return tail[begin : end["count"]]


def _tail_records(store: ObjectStore, tail: dict[str, Any] | None) -> list[ArchiveRecord]:
    """The records of the tail an offset names: from the state if it still holds that tail,
    else from the object it was written out to (in the folder of its first hour)."""
    if not tail:
        return []
    first = tuple(tail["first"])
    snapshot = Snapshot.read(store)
    records = snapshot.archive_tail
    if records and record_id(records[0]) == first and len(records) >= tail["count"]:
        return records
    hour = floor_hour(tail["at"])
    for meta in _list_from(store, hour):
        try:
            records = read_archive(store, meta.key)
        except ObjectNotFound:
            continue
        if records and record_id(records[0]) == first and len(records) >= tail["count"]:
            return records
    raise ObjectNotFound(
        f"{store.url}: the archive tail that began with record {first} is neither in the "
        f"state nor in an archive object of the hours from {hour:%Y-%m-%d %H}:00 UTC"
    )
