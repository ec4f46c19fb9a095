"""Writing a Spark DataFrame into a queue: one job per row, all rows in one commit.

How a write stays atomic under what Spark really does:

1. The driver makes a **write id** when it plans the write.
2. Each task attempt stages its rows as immutable objects
   ``staging/<write id>/<partition>-<attempt>-<token>-<n>.json`` in the format of the
   ``bodies/`` objects (a JSON list of ``[body, base64?]``), and returns a commit message that
   lists them. Retried, speculative and failed attempts also leave objects, but Spark reports
   only the winning attempt of each partition to the driver.
3. The driver's ``commit`` submits **one** operation that adds a job per staged row, each
   referring to its row (``<key>#<index>``), in one compare-and-set commit: the whole
   DataFrame is enqueued or none of it. The state counts the references; the objects are
   deleted once their last job finished. The write id is recorded as an idempotency key, so a
   retried commit adds nothing twice. Then it deletes what losing attempts staged.
4. ``abort`` deletes everything under ``staging/<write id>/`` that the state does not refer
   to; after a commit that landed (Spark calls ``abort`` when ``commit`` raises) it therefore
   keeps what the queue needs.

Spark calls ``abort`` (and may call ``commit``) while other attempts still run: a stage being
cancelled, a speculative copy. Before it cleans up, the driver writes a marker
``staging/<write id>/_closed``; a task reads it after each object it stages and, once the write
is closed, deletes what it staged and fails. Either the driver's listing sees an object, or the
task that staged it sees the marker. The marker (a few bytes) stays, for late attempts.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from objq_broker.broker.settings import broker_settings
from objq_broker.engine.snapshot import Snapshot
from objq_broker.errors import ObjqError, QueueError
from objq_broker.model.bodies import encode_bodies
from objq_broker.model.checks import MAX_STAGED_ENTRIES
from objq_broker.model.records import encode_payload
from objq_broker.ops import StagedBodies
from objq_broker.queue import Queue
from objq_broker.spark.rows import RowPlan
from objq_broker.storage import ObjectStore, open_store

log = logging.getLogger("objq_broker.spark")

#: Folder of the objects a write stages before its commit.
STAGING_PREFIX = "staging/"
#: Rows per staged object: a worker that claims one job loads (and caches) its whole object.
DEFAULT_ROWS_PER_OBJECT = 10_000
#: Written under a write's staging folder once its driver committed or aborted it.
CLOSED_MARKER = "_closed"


def staging_prefix(write_id: str) -> str:
    return f"{STAGING_PREFIX}{write_id}/"


@dataclass
class StagedPart(WriterCommitMessage):
    """What one task attempt staged: the commit message Spark hands back to the driver."""

    partition: int
    attempt: int
    objects: list[StagedBodies] = field(default_factory=list)


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
        #: Jobs the commit added (None when the write id had been committed before).
        self.committed: int | None = None

    @property
    def prefix(self) -> str:
        return staging_prefix(self.write_id)

    # --- executors -------------------------------------------------------------------------

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedPart:
        partition, attempt = _task_identity()
        settings = self.settings
        store = open_store(settings.url)
        try:
            stager = _Stager(store, self.prefix, partition, attempt, settings.rows_per_object)
            for batch in iterator:
                for body, priority, delay in settings.plan.rows(batch):
                    stager.add(body, priority, delay)
            stager.close()
            if not stager.objects:
                stager.check_open()
        finally:
            store.close()
        return StagedPart(partition, attempt, stager.objects)

    # --- driver ----------------------------------------------------------------------------

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        parts = sorted(
            (m for m in messages if isinstance(m, StagedPart)), key=lambda m: m.partition
        )
        staged = [obj for part in parts for obj in part.objects]
        settings = self.settings
        if staged:
            # One commit from the driver: through the namespace's broker if there is one,
            # never becoming it (it would resign a moment later).
            broker = broker_settings(None, {}, default="client")
            with Queue(settings.url, broker=broker) as queue:
                self.committed = queue.enqueue_staged(
                    settings.queue,
                    staged,
                    write_id=self.write_id,
                    priority=settings.priority,
                    delay=settings.delay_seconds,
                    max_attempts=settings.max_attempts,
                )
        else:
            self.committed = 0
        log.info(
            "write %s: %s jobs enqueued to %r from %d staged objects",
            self.write_id,
            self.committed,
            settings.queue,
            len(staged),
        )
        # What failed or speculative attempts staged is not referenced: remove it now. The
        # jobs are enqueued whatever happens here, so a failure must not fail the write.
        try:
            self._remove_staged(keep={obj.key for obj in staged})
        except ObjqError as exc:
            log.warning("write %s: staged objects left behind: %s", self.write_id, exc)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log.info("write %s aborted: removing its staged objects", self.write_id)
        self._remove_staged(keep=None)

    def _remove_staged(self, keep: set[str] | None) -> None:
        """Delete this write's staged objects but ``keep`` (None: those the state refers to,
        read now, so an abort after a commit that landed keeps what the queue needs)."""
        store = open_store(self.settings.url)
        marker = f"{self.prefix}{CLOSED_MARKER}"
        try:
            store.put(marker, b"closed\n")  # before listing: see the module docstring
            keys = [key for key in store.list(self.prefix) if key != marker]
            if keys and keep is None:
                keep = _referenced_bodies(store)
            for key in keys:
                if keep is None or key not in keep:
                    store.delete(key)
        finally:
            store.close()


def _referenced_bodies(store: ObjectStore) -> set[str]:
    """Bodies objects the stored state refers to now (its reference counts)."""
    return Snapshot.read(store).referenced_bodies


def _task_identity() -> tuple[int, int]:
    """(partition, attempt) of the running Spark task; (0, 0) outside a task."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        return 0, 0
    return context.partitionId(), context.attemptNumber()


class _Stager:
    """Collects encoded rows and writes them out, ``rows_per_object`` at a time."""

    def __init__(
        self, store: ObjectStore, prefix: str, partition: int, attempt: int, rows_per_object: int
    ) -> None:
        self.store = store
        self.marker = f"{prefix}{CLOSED_MARKER}"
        # A token per attempt: a re-run stage can repeat an attempt number.
        self.stem = f"{prefix}{partition}-{attempt}-{uuid.uuid4().hex[:6]}"
        self.rows_per_object = rows_per_object
        self.objects: list[StagedBodies] = []
        self._entries: list[tuple[str, bool]] = []
        self._priorities: list[int] = []
        self._delays: list[float] = []
        self._varied_priority = False
        self._varied_delay = False

    def add(self, body: bytes, priority: int | None, delay: float | None) -> None:
        self._entries.append(encode_payload(body))
        self._priorities.append(priority or 0)
        self._delays.append(delay or 0.0)
        self._varied_priority |= priority is not None
        self._varied_delay |= delay is not None
        if len(self._entries) >= self.rows_per_object:
            self._flush()

    def close(self) -> None:
        if self._entries:
            self._flush()

    def _flush(self) -> None:
        key = f"{self.stem}-{len(self.objects)}.json"
        self.store.put(key, encode_bodies(self._entries))
        self.objects.append(
            StagedBodies(
                key,
                len(self._entries),
                tuple(self._priorities) if self._varied_priority else None,
                tuple(self._delays) if self._varied_delay else None,
            )
        )
        self._entries, self._priorities, self._delays = [], [], []
        self._varied_priority = self._varied_delay = False
        self.check_open()

    def check_open(self) -> None:
        """Fail, removing what this attempt staged, once the driver closed the write."""
        if self.store.read(self.marker) is None:
            return
        for staged in self.objects:
            self.store.delete(staged.key)
        raise QueueError(
            f"{self.store.url}/{self.marker}: the write was already committed or aborted; "
            f"this task attempt's {len(self.objects)} staged objects were removed"
        )


def settings_from_options(options: Any, columns: list[str]) -> WriteSettings:
    """Read the writer's options (a case-insensitive mapping), checking them against the
    DataFrame's ``columns``."""
    from objq_broker.spark.rows import option_float, option_int, required

    where = "objq writer"
    url = required(options, "url", where)
    queue = required(options, "queue", where)
    max_attempts = option_int(options, "max_attempts", None, where)
    rows_per_object = option_int(options, "rows_per_object", DEFAULT_ROWS_PER_OBJECT, where)
    return WriteSettings(
        url=url,
        queue=queue,
        plan=RowPlan.from_options(options, columns, queue),
        priority=option_int(options, "priority", 0, where) or 0,
        delay_seconds=option_float(options, "delay_seconds", 0.0, where),
        max_attempts=max_attempts,
        rows_per_object=min(max(rows_per_object or DEFAULT_ROWS_PER_OBJECT, 1), MAX_STAGED_ENTRIES),
    )
