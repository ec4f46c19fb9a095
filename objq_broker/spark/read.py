"""Reading objq as Spark DataFrames: the live jobs, the dead letters, the archive.

Tables (option ``table``):

* ``jobs``: the jobs in the state now (ready, delayed, in-flight). The driver reads the state
  object once; one partition holds the jobs of its head, and the runs it refers to (the
  backlog, ``docs/runs.md``) are read by the executors, ``runs_per_partition`` at a time.
* ``dead``: the dead letters in the state now, read the same way.
* ``archive``: finished and dead-lettered jobs from ``archive/YYYY/MM/DD/HH/*.jsonl``, one Spark
  partition per group of ``objects_per_partition`` archive objects, and one for the newest
  records, which the state keeps in its archive tail until they fill an object.

Filters pushed down (they show as ``PushedFilters`` in ``explain("formatted")``): equality or
``IN`` on ``queue``, and comparisons on ``finished_at``. A time range on the archive lists only
the days it needs and reads only the hours it needs (see :mod:`objq_broker.engine.archive`); pushed
filters are applied exactly, row by row, so Spark does not evaluate them again. Pushdown needs
``spark.sql.python.filterPushdown.enabled`` (which :func:`~objq_broker.spark.source.register`
sets); where it is off, the reader reads every row and Spark applies the filters itself: the
same rows, read in full.

Rows are built as Arrow record batches in the executors, which read storage with objq's own
adapters (no Hadoop connector needed).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)

from objq_broker.engine.archive import archive_keys, read_archive, read_tail, record_id
from objq_broker.engine.bodies import BodyCache
from objq_broker.engine.snapshot import Snapshot, run_rows
from objq_broker.errors import ConfigurationError, ObjqError
from objq_broker.model.messages import describe
from objq_broker.model.records import ArchiveRecord, Job, JobState, RunRef
from objq_broker.storage import ObjectStore, open_store

#: The tables this source reads.
TABLES = ("jobs", "dead", "archive")
#: Archive objects one Spark partition reads, unless the ``objects_per_partition`` option says.
DEFAULT_OBJECTS_PER_PARTITION = 32
#: Runs (of up to 10,000 jobs) one Spark partition of the jobs or dead table reads, unless
#: the ``runs_per_partition`` option says.
DEFAULT_RUNS_PER_PARTITION = 4
#: Rows per Arrow record batch handed to Spark.
BATCH_ROWS = 8192

#: The declared schema of every table (Spark DDL).
SCHEMA = (
    "id string, queue string, state string, kind string, task string, message_id string, "
    "priority int, attempts int, max_attempts int, enqueued_at timestamp, "
    "started_at timestamp, finished_at timestamp, error string, `group` string, payload binary"
)
_TIME = pa.timestamp("us", tz="UTC")
ARROW_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("queue", pa.string()),
        ("state", pa.string()),
        ("kind", pa.string()),
        ("task", pa.string()),
        ("message_id", pa.string()),
        ("priority", pa.int32()),
        ("attempts", pa.int32()),
        ("max_attempts", pa.int32()),
        ("enqueued_at", _TIME),
        ("started_at", _TIME),
        ("finished_at", _TIME),
        ("error", pa.string()),
        ("group", pa.string()),
        ("payload", pa.binary()),
    ]
)


@dataclass
class TimeBounds:
    """The pushed range on ``finished_at``, in Unix seconds; None means open."""

    lower: float | None = None
    lower_inclusive: bool = True
    upper: float | None = None
    upper_inclusive: bool = False

    def narrow(self, kind: type[Filter], at: float) -> None:
        if kind in (GreaterThan, GreaterThanOrEqual, EqualTo):
            inclusive = kind is not GreaterThan
            if self.lower is None or at > self.lower or (at == self.lower and not inclusive):
                self.lower, self.lower_inclusive = at, inclusive
        if kind in (LessThan, LessThanOrEqual, EqualTo):
            inclusive = kind is not LessThan
            if self.upper is None or at < self.upper or (at == self.upper and not inclusive):
                self.upper, self.upper_inclusive = at, inclusive

    def admits(self, at: float | None) -> bool:
        if self.lower is None and self.upper is None:
            return True
        if at is None:
            return False  # SQL: a comparison with NULL is not true
        if self.lower is not None and (
            at < self.lower or (at == self.lower and not self.lower_inclusive)
        ):
            return False
        return not (
            self.upper is not None
            and (at > self.upper or (at == self.upper and not self.upper_inclusive))
        )

    def listing_range(self) -> tuple[float | None, float | None]:
        """``[since, until)`` for :func:`archive_keys`, wide enough for inclusive bounds."""
        until = None if self.upper is None else self.upper + 1e-3
        return self.lower, until


@dataclass
class ObjqPartition(InputPartition):
    """A table's share for one task: archive ``keys``; or rows of the state's head as the
    driver read it (``head``), or runs it referred to then (``runs``, read at ``read_at``)."""

    keys: list[str] = field(default_factory=list)
    #: Records of the state's archive tail, read by the driver before it listed ``keys``; a
    #: partition of objects skips those (one written out meanwhile holds them too).
    tail: list[ArchiveRecord] = field(default_factory=list)
    in_tail: set[tuple[str, str, str]] = field(default_factory=set)
    head: list[tuple[JobState, Job]] = field(default_factory=list)
    runs: list[tuple[str, RunRef]] = field(default_factory=list)
    read_at: float = 0.0


def _seconds(value: object, where: str) -> float:
    if isinstance(value, datetime):
        return value.timestamp()  # aware from Spark; naive is local time, as Spark gives it
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise ConfigurationError(f"{where}: expected a timestamp, found {value!r}")


class _OptionalPushdown:
    """``reader.pushFilters`` as Spark sees it: a pushdown that Spark may skip.

    Spark calls ``pushFilters`` only where ``spark.sql.python.filterPushdown.enabled`` is on.
    Where it is off, Spark (4.1 to 4.3: ``pyspark/sql/worker/plan_data_source_read.py``)
    refuses a reader whose ``pushFilters.__func__`` is not the base method, with
    ``DATA_SOURCE_PUSHDOWN_DISABLED``, in case the reader relies on being given its filters.
    This one does not: with nothing pushed it reads every row and Spark applies every filter
    itself. So the method it offers carries the base function as its ``__func__`` (what that
    check compares), and pushes when called. ``tests/spark/test_pushdown.py`` reads with the
    setting off: a Spark whose check differs fails there.
    """

    def __init__(self, reader: ObjqReader) -> None:
        self.__func__ = DataSourceReader.pushFilters
        self._reader = reader

    def __call__(self, filters: list[Filter]) -> Iterator[Filter]:
        return self._reader.push_filters(filters)


class ObjqReader(DataSourceReader):
    """Plans partitions on the driver and reads them in the executors."""

    def __init__(
        self,
        url: str,
        table: str,
        objects_per_partition: int = 0,
        runs_per_partition: int = 0,
    ) -> None:
        self.url = url
        self.table = table
        self.objects_per_partition = objects_per_partition or DEFAULT_OBJECTS_PER_PARTITION
        self.runs_per_partition = runs_per_partition or DEFAULT_RUNS_PER_PARTITION
        self.queues: set[str] | None = None
        self.bounds = TimeBounds()

    @property
    def pushFilters(self) -> _OptionalPushdown:
        """Takes the filters this source applies itself; see :class:`_OptionalPushdown`."""
        return _OptionalPushdown(self)

    def push_filters(self, filters: list[Filter]) -> Iterator[Filter]:
        """Spark's ``pushFilters``: apply what this source can, yield the rest for Spark."""
        for pushed in filters:
            if not self._take(pushed):
                yield pushed

    def _take(self, pushed: Filter) -> bool:
        """Apply ``pushed`` if this source can; True when it was taken."""
        column = getattr(pushed, "attribute", None)
        if column == ("queue",) and isinstance(pushed, EqualTo | In):
            values = {pushed.value} if isinstance(pushed, EqualTo) else set(pushed.value)
            wanted = {v for v in values if isinstance(v, str)}
            self.queues = wanted if self.queues is None else self.queues & wanted
            return True
        comparisons = (EqualTo, GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual)
        if column == ("finished_at",) and isinstance(pushed, comparisons):
            if pushed.value is None:
                return False
            self.bounds.narrow(type(pushed), _seconds(pushed.value, "filter on finished_at"))
            return True
        return False

    def partitions(self) -> list[ObjqPartition]:
        store = open_store(self.url)
        try:
            if self.table != "archive":
                return self._state_partitions(Snapshot.read(store))
            since, until = self.bounds.listing_range()
            tail = read_tail(store)  # before the listing (see engine.archive)
            keys = archive_keys(store, since, until)
        finally:
            store.close()
        size = self.objects_per_partition
        groups = [keys[i : i + size] for i in range(0, len(keys), size)]
        in_tail = {record_id(record) for record in tail}
        parts = [ObjqPartition(group, in_tail=in_tail) for group in groups]
        if tail:
            parts.append(ObjqPartition(tail=tail))
        # An empty archive still needs one (empty) partition to answer with no rows.
        return parts or [ObjqPartition(["-"])]

    def _state_partitions(self, snapshot: Snapshot) -> list[ObjqPartition]:
        """The head's rows on one partition, the runs on the others: every part comes from
        the one state read here, so no job is counted twice. A run consumed whole before an
        executor reads it yields nothing: its jobs were claimed after this moment."""
        if self.table == "dead":
            head: list[tuple[JobState, Job]] = [("dead", job) for job in snapshot.head_dead()]
            runs = snapshot.dead_runs()
        else:
            head, runs = snapshot.head_live(), snapshot.live_runs()
        if self.queues is not None:
            head = [(state, job) for state, job in head if job.queue in self.queues]
            runs = [(queue, ref) for queue, ref in runs if queue in self.queues]
        at, size = snapshot.read_at, self.runs_per_partition
        groups = [runs[i : i + size] for i in range(0, len(runs), size)]
        return [ObjqPartition(head=head, read_at=at)] + [
            ObjqPartition(runs=group, read_at=at) for group in groups
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, ObjqPartition)
        store = open_store(self.url)
        try:
            rows = RowBuilder(self.queues, self.bounds)
            found = (
                _archive_rows(store, partition)
                if self.table == "archive"
                else _state_rows(store, partition)
            )
            for state, job in found:
                rows.add(state, job, store)
                if rows.full():
                    yield rows.flush()
            if rows.count or not rows.flushed:
                yield rows.flush()
        finally:
            store.close()


def _archive_rows(store: ObjectStore, partition: ObjqPartition) -> Iterator[tuple[str, Job]]:
    for key in partition.keys:
        if key == "-":
            continue
        for record in read_archive(store, key):
            if record_id(record) not in partition.in_tail:
                yield record.outcome, record.job
    for record in partition.tail:
        yield record.outcome, record.job


def _state_rows(store: ObjectStore, partition: ObjqPartition) -> Iterator[tuple[JobState, Job]]:
    yield from partition.head
    for queue, ref in partition.runs:
        yield from run_rows(store, queue, ref, partition.read_at)


class RowBuilder:
    """Columns of the rows read so far, filtered by the pushed filters."""

    def __init__(self, queues: set[str] | None, bounds: TimeBounds) -> None:
        self.queues = queues
        self.bounds = bounds
        self.columns: dict[str, list[Any]] = {name: [] for name in ARROW_SCHEMA.names}
        self.count = 0
        self.flushed = False
        self._bodies: BodyCache | None = None

    def full(self) -> bool:
        return self.count >= BATCH_ROWS

    def add(self, state: str, job: Job, store: ObjectStore) -> None:
        if self.queues is not None and job.queue not in self.queues:
            return
        if not self.bounds.admits(job.finished_at):
            return
        payload = self._payload(job, store)
        info = describe(payload) if payload is not None else None
        columns = self.columns
        columns["id"].append(job.id)
        columns["queue"].append(job.queue)
        columns["state"].append(state)
        columns["kind"].append(None if info is None else info.kind)
        columns["task"].append(None if info is None else info.task)
        columns["message_id"].append(None if info is None else info.message_id)
        columns["priority"].append(job.priority)
        columns["attempts"].append(job.attempts)
        columns["max_attempts"].append(job.max_attempts)
        columns["enqueued_at"].append(_micros(job.enqueued_at))
        columns["started_at"].append(_micros(job.started_at))
        columns["finished_at"].append(_micros(job.finished_at))
        columns["error"].append(job.error)
        columns["group"].append(job.group)
        columns["payload"].append(payload)
        self.count += 1

    def _payload(self, job: Job, store: ObjectStore) -> bytes | None:
        if job.ref is not None and not job.body:
            if self._bodies is None:
                self._bodies = BodyCache(store)
            try:
                job = self._bodies.fill(job, inline=True)
            except ObjqError:
                return None  # its bodies object is gone (the job finished meanwhile)
        return job.shown_payload  # a poison job's raw bytes, rather than failing the read

    def flush(self) -> pa.RecordBatch:
        arrays = [
            pa.array(self.columns[name], type=ARROW_SCHEMA.field(name).type)
            for name in ARROW_SCHEMA.names
        ]
        batch = pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)
        self.columns = {name: [] for name in ARROW_SCHEMA.names}
        self.count = 0
        self.flushed = True
        return batch


def _micros(at: float | None) -> int | None:
    return None if at is None else round(at * 1_000_000)
