"""Writing a Spark DataFrame into a queue: one job per row, all rows in one commit.

How a write stays atomic under what Spark really does:

1. The driver makes a **write id** when it plans the write.
2. Each task attempt stages its rows as immutable objects under
   ``staging/<write id>/<partition>-<attempt>-<token>-<n>``: a bodies object (``.json``, the
   format of ``bodies/`` objects: a JSON list of ``[body, base64?]``) and the jobs that refer
   to its entries as one or two runs (``.ready.json``, ``.timed.json``: the format of the
   state's runs, ``docs/runs.md``, jobs numbered from 0). It returns a commit message that
   lists them. Retried, speculative and failed attempts also leave objects, but Spark reports
   only the winning attempt of each partition to the driver.
3. The driver's ``commit`` submits **one** operation that adds a reference per staged run to
   the state, in one compare-and-set commit: the whole DataFrame is enqueued or none of it, and
   its jobs never pass through the state's head. The runs take their place in the queue then.
   The write id is recorded as an idempotency key, so a retried commit adds nothing twice.
   Workers delete each run once taken, each bodies object once its last job finished. Then
   the driver deletes what losing attempts staged.
4. ``abort`` deletes everything under ``staging/<write id>/`` that the state does not refer
   to; after a commit that landed (Spark calls ``abort`` when ``commit`` raises) it therefore
   keeps what the queue needs.

Spark calls ``abort`` (and may call ``commit``) while other attempts still run: a stage being
cancelled, a speculative copy. Before it cleans up, the driver writes a marker
``staging/<write id>/_closed``; a task reads it after each object it stages and, once the write
is closed, deletes what it staged and fails. Either the driver's listing sees an object, or the
task that staged it sees the marker. The marker (a few bytes) stays, for late attempts.

Jobs are made by the tasks, so what they are given is fixed there: their ``max_attempts`` (the
queue's as the driver planned the write, unless the ``max_attempts`` option says) and the time
their delays count from (when the row was staged).

The options are checked on the driver when the write is planned, before any task runs, with the
constraints the state holds jobs to (:mod:`objq_broker.model.checks`): a NaN delay, a priority
past 32 bits, ``max_attempts=0`` or ``"true"`` for a number is refused there, naming the option.
The columns are checked as :mod:`objq_broker.spark.rows` says.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import msgspec
import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from objq_broker.broker.settings import broker_settings
from objq_broker.builders import StagedRun
from objq_broker.engine.snapshot import Snapshot
from objq_broker.errors import ObjqError, QueueError
from objq_broker.model.bodies import encode_bodies
from objq_broker.model.checks import (
    STAGING_PREFIX,
    Attempts,
    Priority,
    QueueName,
    SignedSeconds,
    checked,
)
from objq_broker.model.records import Job, QueueConfig, encode_payload
from objq_broker.model.runs import MAX_RUN_JOBS, build_run
from objq_broker.queue import Queue
from objq_broker.spark.rows import RowPlan, check_known, required
from objq_broker.storage import ObjectStore, open_store

log = logging.getLogger("objq_broker.spark")

#: Rows per staged object (and run): a worker that claims one job loads (and caches) its
#: whole bodies object, and the run it is in. At most MAX_RUN_JOBS.
DEFAULT_ROWS_PER_OBJECT = 10_000
#: Written under a write's staging folder once its driver committed or aborted it.
CLOSED_MARKER = "_closed"

#: Rows per staged object: one at least, a run's worth at most.
RowsPerObject = Annotated[int, msgspec.Meta(ge=1, le=MAX_RUN_JOBS)]


def staging_prefix(write_id: str) -> str:
    return f"{STAGING_PREFIX}{write_id}/"


@dataclass
class StagedPart(WriterCommitMessage):
    """What one task attempt staged: the commit message Spark hands back to the driver."""

    partition: int
    attempt: int
    runs: list[StagedRun] = field(default_factory=list)
    #: The staging folder (``staging/<folder>/``) and the write id the commit is kept under:
    #: the same for a DataFrame write; a streaming write stages each run of a micro-batch in a
    #: folder of its own, under the micro-batch's one write id.
    folder: str = ""
    write_id: str = ""

    @property
    def keys(self) -> set[str]:
        """Every object this attempt staged."""
        return {run.key for run in self.runs} | {run.bodies for run in self.runs}


@dataclass
class WriteSettings:
    """Where and how a DataFrame is enqueued (from the writer's options)."""

    url: str
    queue: str
    plan: RowPlan
    priority: int = 0
    delay_seconds: float = 0.0
    max_attempts: int | None = None
    rows_per_object: int = DEFAULT_ROWS_PER_OBJECT


class ObjqWriter(DataSourceArrowWriter):
    """Stages rows in the executors; enqueues them all in one commit on the driver."""

    def __init__(self, settings: WriteSettings, write_id: str | None = None) -> None:
        self.settings = settings
        # Short ids and names: every job's reference to its row carries them into the state.
        self.write_id = write_id or uuid.uuid4().hex[:16]
        # A bad URL fails here, before any task runs. What the tasks give each job: the
        # option, or the queue's setting now.
        self.max_attempts = settings.max_attempts or queue_attempts(settings.url, settings.queue)
        #: Jobs the commit added (None when the write id had been committed before).
        self.committed: int | None = None

    # --- executors -------------------------------------------------------------------------

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedPart:
        return stage_rows(self.settings, self.max_attempts, self.write_id, self.write_id, iterator)

    # --- driver ----------------------------------------------------------------------------

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self.committed = commit_staged(self.settings, staged_parts(messages), self.write_id)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log.info("write %s aborted: removing its staged objects", self.write_id)
        remove_staged(self.settings.url, self.write_id, keep=None)


def stage_rows(
    settings: WriteSettings,
    max_attempts: int,
    folder: str,
    write_id: str,
    iterator: Iterator[pa.RecordBatch],
) -> StagedPart:
    """In a task: stage the rows of ``iterator`` under ``staging/<folder>/`` as jobs of
    ``max_attempts`` attempts; the commit message that lists them."""
    partition, attempt = _task_identity()
    store = open_store(settings.url)
    try:
        stem = f"{staging_prefix(folder)}{partition}-{attempt}-{uuid.uuid4().hex[:6]}"
        plan = _JobPlan(
            queue=settings.queue,
            priority=settings.priority,
            delay=settings.delay_seconds,
            max_attempts=max_attempts,
            rows_per_object=settings.rows_per_object,
        )
        stager = _Stager(store, stem, plan)
        for batch in iterator:
            for body, priority, delay, group in settings.plan.rows(batch):
                stager.add(body, priority, delay, group)
        stager.close()
        if not stager.runs:
            stager.check_open()
    finally:
        store.close()
    return StagedPart(partition, attempt, stager.runs, folder, write_id)


def staged_parts(messages: list[WriterCommitMessage | None]) -> list[StagedPart]:
    """The winning attempts' messages, in partition order (None: a task that failed)."""
    return sorted((m for m in messages if isinstance(m, StagedPart)), key=lambda m: m.partition)


def commit_staged(settings: WriteSettings, parts: list[StagedPart], write_id: str) -> int | None:
    """On the driver: enqueue the runs of ``parts`` in one commit kept under ``write_id``,
    then remove what other attempts staged in the parts' folders. The jobs added; None when
    ``write_id`` had been committed before (nothing added)."""
    runs = [run for part in parts for run in part.runs]
    committed: int | None = 0
    if runs:
        # One commit from the driver: through the namespace's broker if there is one,
        # never becoming it (it would resign a moment later).
        broker = broker_settings(None, {}, default="client")
        with Queue(settings.url, broker=broker) as queue:
            committed = queue.enqueue_runs(settings.queue, runs, write_id=write_id)
    log.info(
        "write %s: %s jobs enqueued to %r from %d staged runs",
        write_id,
        committed,
        settings.queue,
        len(runs),
    )
    # What failed or speculative attempts staged is not referenced: remove it now. When the
    # write id had been committed before (a micro-batch run again), what this run staged is
    # not referenced either, and what the first run staged is: keep what the state refers to.
    # The jobs are enqueued whatever happens here, so a failure must not fail the write.
    keep = None if committed is None else set().union(*(part.keys for part in parts))
    for folder in sorted({part.folder for part in parts} or {write_id}):
        try:
            remove_staged(settings.url, folder, keep)
        except ObjqError as exc:
            log.warning("write %s: staged objects left behind: %s", write_id, exc)
    return committed


def remove_staged(url: str, folder: str, keep: set[str] | None) -> None:
    """Close the staging folder ``staging/<folder>/`` and delete its objects but ``keep``
    (None: those the state refers to, read now, so an abort after a commit that landed keeps
    what the queue needs)."""
    store = open_store(url)
    prefix = staging_prefix(folder)
    marker = f"{prefix}{CLOSED_MARKER}"
    try:
        store.put(marker, b"closed\n")  # before listing: see the module docstring
        keys = [key for key in store.list(prefix) if key != marker]
        if keys and keep is None:
            keep = _referenced(store)
        for key in keys:
            if keep is None or key not in keep:
                store.delete(key)
    finally:
        store.close()


def _referenced(store: ObjectStore) -> set[str]:
    """The bodies objects and runs the stored state refers to now."""
    snapshot = Snapshot.read(store)
    return snapshot.referenced_bodies | snapshot.referenced_runs


def queue_attempts(url: str, queue: str) -> int:
    """The ``max_attempts`` of ``queue`` as stored now (the default for a queue not declared,
    which the write's commit declares)."""
    store = open_store(url)
    try:
        snapshot = Snapshot.read(store)
    finally:
        store.close()
    if queue in snapshot.queue_names():
        return snapshot.config(queue).max_attempts
    return QueueConfig().max_attempts


def _task_identity() -> tuple[int, int]:
    """(partition, attempt) of the running Spark task; (0, 0) outside a task."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        return 0, 0
    return context.partitionId(), context.attemptNumber()


@dataclass(frozen=True)
class _JobPlan:
    """What a task gives the jobs it stages."""

    queue: str
    priority: int
    delay: float
    max_attempts: int
    rows_per_object: int


class _Stager:
    """Collects encoded rows and writes them out, ``rows_per_object`` at a time: a bodies
    object and the run (or runs: ready and delayed) of the jobs that refer to it."""

    def __init__(self, store: ObjectStore, stem: str, plan: _JobPlan) -> None:
        self.store = store
        self.marker = f"{stem.rsplit('/', 1)[0]}/{CLOSED_MARKER}"  # beside the objects
        # A token per attempt in the stem: a re-run stage can repeat an attempt number.
        self.stem = stem
        self.plan = plan
        self.runs: list[StagedRun] = []
        self._objects = 0
        self._entries: list[tuple[str, bool]] = []
        # (priority, delay, group) of each entry
        self._rows: list[tuple[int, float, str | None]] = []

    def add(
        self, body: bytes, priority: int | None, delay: float | None, group: str | None
    ) -> None:
        """Stage a row; its settings were checked (None: the write's own; no group)."""
        priority = self.plan.priority if priority is None else priority
        delay = self.plan.delay if delay is None else delay
        self._entries.append(encode_payload(body))
        self._rows.append((priority, delay, group))
        if len(self._entries) >= self.plan.rows_per_object:
            self._flush()

    def close(self) -> None:
        if self._entries:
            self._flush()

    def _flush(self) -> None:
        name = f"{self.stem}-{self._objects}"
        self._objects += 1
        self.store.put(f"{name}.json", encode_bodies(self._entries))
        for run, data in self._runs_of(name):
            self.store.put(run.key, data)
            self.runs.append(run)
        self._entries, self._rows = [], []
        self.check_open()

    def _runs_of(self, name: str) -> list[tuple[StagedRun, bytes]]:
        """The jobs of the rows staged in the bodies object ``<name>.json``, as a ready run
        and a timed run (the delayed rows), each numbered from 0 in row order (the commit
        gives them their place)."""
        bodies = f"{name}.json"
        now = time.time()
        ids = uuid.uuid4().hex[:20]
        plan = self.plan
        kinds: dict[Literal["ready", "timed"], list[Job]] = {"ready": [], "timed": []}
        for index, (priority, delay, group) in enumerate(self._rows):
            jobs = kinds["timed" if delay > 0 else "ready"]
            jobs.append(
                Job(
                    id=f"{ids}{index:012x}",
                    queue=plan.queue,
                    body="",
                    seq=len(jobs),
                    priority=priority,
                    enqueued_at=now,
                    visible_at=now + max(delay, 0.0),
                    max_attempts=plan.max_attempts,
                    ref=f"{bodies}#{index}",
                    group=group,
                )
            )
        made: list[tuple[StagedRun, bytes]] = []
        for kind, jobs in kinds.items():
            if jobs:
                ref, data = build_run(f"{name}.{kind}.json", plan.queue, kind, jobs)
                last = ref.last or ref.next
                # A ready run names its groups' counts; a timed run's jobs enter the head.
                groups = Counter(job.group for job in jobs if job.group) if kind == "ready" else {}
                staged = StagedRun(
                    ref.key,
                    bodies,
                    kind,
                    ref.count,
                    ref.next,
                    last,
                    ref.oldest,
                    dict(groups) or None,
                )
                made.append((staged, data))
        return made

    def check_open(self) -> None:
        """Fail, removing what this attempt staged, once the driver closed the write."""
        if self.store.read(self.marker) is None:
            return
        staged = {run.key for run in self.runs} | {run.bodies for run in self.runs}
        for key in sorted(staged):
            self.store.delete(key)
        raise QueueError(
            f"{self.store.url}/{self.marker}: the write was already committed or aborted; "
            f"this task attempt's {len(staged)} staged objects were removed"
        )


class _JobOptions(msgspec.Struct, frozen=True):
    """The writer's options its jobs carry, held to the constraints the state holds jobs to."""

    queue: QueueName
    priority: Priority = 0
    delay_seconds: SignedSeconds = 0.0
    max_attempts: Attempts | msgspec.UnsetType = msgspec.UNSET  # unset: the queue's
    rows_per_object: RowsPerObject = DEFAULT_ROWS_PER_OBJECT


#: The options that are numbers, and the kind of number each must spell.
_NUMBERS: dict[str, type[int] | type[float]] = {
    "priority": int,
    "delay_seconds": float,
    "max_attempts": int,
    "rows_per_object": int,
}


def settings_from_options(options: Mapping[str, Any], schema: StructType) -> WriteSettings:
    """Read the writer's options (a case-insensitive mapping of text, as Spark passes them),
    checking them, and the columns they name against the DataFrame's ``schema``, on the driver
    before any task runs."""
    where = "objq writer"
    check_known(options)
    url = required(options, "url", where)
    given = {
        name: _spelled(options.get(name), kind)
        for name, kind in _NUMBERS.items()
        if options.get(name) is not None
    }
    job = checked(
        {"queue": required(options, "queue", where), **given}, _JobOptions, f"{where} option"
    )
    return WriteSettings(
        url=url,
        queue=job.queue,
        plan=RowPlan.from_options(options, schema, job.queue),
        priority=job.priority,
        delay_seconds=job.delay_seconds,
        max_attempts=None if job.max_attempts is msgspec.UNSET else job.max_attempts,
        rows_per_object=job.rows_per_object,
    )


def _spelled(raw: object, kind: type[int] | type[float]) -> object:
    """The number the text ``raw`` spells; anything else as it is, for the check to refuse
    and show ("2.5" is no int, "true" no number; "nan" is a float the check refuses)."""
    if not isinstance(raw, str):
        return raw
    try:
        return kind(raw)
    except ValueError:
        return raw
