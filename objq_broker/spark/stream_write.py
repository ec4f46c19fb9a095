"""The streaming sink: each micro-batch of a streaming query enqueued as jobs, once.

    (rows.writeStream.format("objq")
        .option("url", "s3://jobs-bucket/objq").option("queue", "emails")
        .option("checkpointLocation", "s3://.../checkpoints/emails")
        .trigger(processingTime="10 seconds").start())

Options and columns are those of the DataFrame write (:mod:`objq_broker.spark.write`,
:mod:`objq_broker.spark.rows`), checked when the query starts. A micro-batch is written as a
DataFrame write is: its tasks stage their rows, and the driver adds them to the queue in one
compare-and-set commit. What makes it once per micro-batch:

* **The write id** is derived from the query's id (kept in its checkpoint, the same after a
  restart) and the micro-batch's id: ``sha256("<query id>:<batch id>")``, 16 hex digits. The
  commit stores it as the queue's idempotency key, so a micro-batch that Spark runs again,
  after a crash between the commit and its checkpoint entry, adds nothing the second time.
* **Each run of a micro-batch stages in a folder of its own**, ``staging/<write id>-<run>/``
  (``<run>``: made when Spark plans the micro-batch's write), closed by its own marker. A
  micro-batch run again stages beside the first run's objects, which the queue may already
  refer to, and its commit removes only what the state does not refer to.
* Retried task attempts are handled as in a DataFrame write: only the winning attempt of each
  partition is reported to the driver, and the others' objects are removed after the commit.

The tasks learn the query's id and the micro-batch's id from the local properties Spark sets
for a streaming query's jobs (``sql.streaming.queryId``, ``streaming.sql.batchId``), and hand
them to the driver in their commit messages: Spark's ``commit(messages, batch_id)`` is given no
query id. A micro-batch is deduplicated for the queue's ``idempotency_seconds`` (24 h by
default): a query restarted from a checkpoint older than that could enqueue its last
micro-batch twice.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage

from objq_broker.errors import ConfigurationError, ObjqError
from objq_broker.spark.write import (
    WriteSettings,
    commit_staged,
    queue_attempts,
    remove_staged,
    stage_rows,
    staged_parts,
)

log = logging.getLogger("objq_broker.spark")

#: The local properties Spark sets on the jobs of a streaming query.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"


def stream_write_id(query_id: str, batch_id: int) -> str:
    """The write id of micro-batch ``batch_id`` of the query ``query_id``."""
    return hashlib.sha256(f"{query_id}:{batch_id}".encode()).hexdigest()[:16]


class ObjqStreamWriter(DataSourceStreamArrowWriter):
    """Stages each micro-batch's rows in the executors; enqueues them in one commit, kept
    under the micro-batch's write id, on the driver. Spark makes one per micro-batch."""

    def __init__(self, settings: WriteSettings) -> None:
        self.settings = settings
        #: Tells this run of the micro-batch's write from another run of it (a restart).
        self.run = uuid.uuid4().hex[:8]
        self.max_attempts = settings.max_attempts or queue_attempts(settings.url, settings.queue)
        #: Jobs the last commit added (None when its write id had been committed before).
        self.committed: int | None = None

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        query_id, batch_id = _stream_identity()
        write_id = stream_write_id(query_id, batch_id)
        folder = f"{write_id}-{self.run}"
        return stage_rows(self.settings, self.max_attempts, folder, write_id, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        parts = staged_parts(messages)
        ids = {part.write_id for part in parts}
        if not ids:
            self.committed = 0  # no task reported: a micro-batch without partitions
            return
        if len(ids) > 1:
            raise ConfigurationError(
                f"objq stream writer: micro-batch {batchId}: tasks reported write ids "
                f"{sorted(ids)}; expected one (one query, one micro-batch)"
            )
        self.committed = commit_staged(self.settings, parts, ids.pop())
        if self.committed is None:
            log.info("micro-batch %d had been enqueued before: nothing added", batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # Only the folders of tasks that reported are known here; a folder no task reported
        # is collected by `objq gc` as an abandoned write.
        for folder in sorted({part.folder for part in staged_parts(messages)}):
            log.info("micro-batch %d aborted: removing what %s staged", batchId, folder)
            try:
                remove_staged(self.settings.url, folder, keep=None)
            except ObjqError as exc:
                log.warning("micro-batch %d: staged objects left behind: %s", batchId, exc)


def _stream_identity() -> tuple[str, int]:
    """(query id, micro-batch id) of the running streaming task."""
    from pyspark import TaskContext

    context = TaskContext.get()
    query_id = context.getLocalProperty(QUERY_ID_PROPERTY) if context is not None else None
    batch_id = context.getLocalProperty(BATCH_ID_PROPERTY) if context is not None else None
    if not query_id or batch_id is None:
        raise ConfigurationError(
            f"objq stream writer: expected Spark's {QUERY_ID_PROPERTY!r} and "
            f"{BATCH_ID_PROPERTY!r} in a streaming task, found {query_id!r} and {batch_id!r}"
        )
    return query_id, int(batch_id)
