"""The streaming sink on a real local Spark session: each micro-batch is enqueued once, when a
task is tried again and when the query restarts after a crash between its commit and its
checkpoint."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

from pyspark import TaskContext
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F
from pyspark.sql.datasource import WriterCommitMessage
from pyspark.sql.types import StructType

from objq_broker import Queue
from objq_broker.engine import STATE_KEY
from objq_broker.model.encoding import decode_state
from objq_broker.spark import ObjqDataSource
from objq_broker.spark.stream_write import ObjqStreamWriter, stream_write_id
from objq_broker.storage import open_store

FILES, ROWS_PER_FILE = 3, 12
#: Seconds a query with an availableNow trigger may take.
QUERY_SECONDS = 240


def _input(folder: Path) -> None:
    """FILES files of ROWS_PER_FILE rows ``{"n": ...}``: a micro-batch each, in order (Spark's
    file source takes the oldest first)."""
    folder.mkdir()
    written = time.time() - 60
    for index in range(FILES):
        rows = range(index * ROWS_PER_FILE, (index + 1) * ROWS_PER_FILE)
        path = folder / f"part-{index}.json"
        path.write_text("".join(json.dumps({"n": n}) + "\n" for n in rows))
        os.utime(path, (written + index, written + index))


def _run(spark: Any, rows: Any, url: str, checkpoint: Path, fmt: str = "objq") -> Any:
    """Run the stream into the queue until it has written what is there; the ended query."""
    query = (
        rows.writeStream.format(fmt)
        .option("url", url)
        .option("queue", "q")
        .option("rows_per_object", "5")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    with contextlib.suppress(StreamingQueryException):  # the caller looks at exception()
        query.awaitTermination(QUERY_SECONDS)
    return query


def _payloads(url: str) -> list[bytes]:
    with Queue(url) as queue:
        return sorted(job.payload for _, job in queue.jobs("q"))


def _staged_and_referenced(url: str) -> tuple[set[str], set[str]]:
    """Staged objects left (markers aside), and the staged objects the state refers to."""
    store = open_store(url)
    try:
        staged = {key for key in store.list("staging/") if not key.endswith("/_closed")}
        blob = store.read(STATE_KEY)
        assert blob is not None
        doc = decode_state(blob.data, "test")
        referenced = set(doc.bodies) | doc.run_keys()
        return staged, {key for key in referenced if key.startswith("staging/")}
    finally:
        store.close()


def _expected(count: int) -> list[bytes]:
    return sorted(f"row-{n}".encode() for n in range(count))


def test_a_micro_batch_whose_task_is_tried_again_is_enqueued_once(
    spark: Any, tmp_path: Path
) -> None:
    url = (tmp_path / "store").as_uri()
    _input(tmp_path / "in")

    @F.udf("string", useArrow=False)  # plain UDF: no type-hint inference
    def fails_first_time(n: int) -> str | None:
        context = TaskContext.get()
        if n % ROWS_PER_FILE == ROWS_PER_FILE - 1 and context and context.attemptNumber() == 0:
            return None  # each micro-batch's first attempt fails at its last row
        return f"row-{n}"

    rows = (
        spark.readStream.schema("n long")
        .option("maxFilesPerTrigger", 1)
        .json(str(tmp_path / "in"))
        .select(fails_first_time("n").alias("payload"))
    )
    query = _run(spark, rows, url, tmp_path / "checkpoint")
    assert query.exception() is None
    assert [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]] == [
        ROWS_PER_FILE
    ] * FILES
    assert _payloads(url) == _expected(FILES * ROWS_PER_FILE)
    staged, referenced = _staged_and_referenced(url)
    assert staged == referenced  # the failed attempts' objects were removed


def test_a_restart_after_a_crash_between_commit_and_checkpoint_enqueues_once(
    spark: Any, tmp_path: Path
) -> None:
    url = (tmp_path / "store").as_uri()
    _input(tmp_path / "in")
    crashed = tmp_path / "crashed"

    class CrashingWriter(ObjqStreamWriter):
        """Crashes once, after its first micro-batch's commit landed."""

        def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
            super().commit(messages, batchId)
            if not crashed.exists():
                crashed.write_text(json.dumps({"batch": batchId, "added": self.committed}))
                raise RuntimeError("the driver died before the checkpoint")

    class CrashingSource(ObjqDataSource):
        @classmethod
        def name(cls) -> str:
            return "objq_crashing"

        def streamWriter(self, schema: StructType, overwrite: bool) -> CrashingWriter:
            return CrashingWriter(super().streamWriter(schema, overwrite).settings)

    spark.dataSource.register(CrashingSource)

    def rows() -> Any:
        return (
            spark.readStream.schema("n long")
            .option("maxFilesPerTrigger", 1)
            .json(str(tmp_path / "in"))
            .selectExpr("concat('row-', n) as payload")
        )

    # Given a query whose first micro-batch was enqueued, but not checkpointed
    failed = _run(spark, rows(), url, tmp_path / "checkpoint", "objq_crashing")
    assert failed.exception() is not None
    assert json.loads(crashed.read_text()) == {"batch": 0, "added": ROWS_PER_FILE}
    assert _payloads(url) == _expected(ROWS_PER_FILE)
    # When it is started again from its checkpoint
    query = _run(spark, rows(), url, tmp_path / "checkpoint", "objq_crashing")
    assert query.exception() is None
    # Then the micro-batch run again added nothing, and the others were enqueued once
    assert query.id == failed.id
    assert _payloads(url) == _expected(FILES * ROWS_PER_FILE)
    staged, referenced = _staged_and_referenced(url)
    assert staged == referenced  # what the second run of the micro-batch staged is gone


def test_the_write_id_is_the_query_and_the_micro_batch() -> None:
    query = "71a08ce7-40b2-42c9-83bd-3750e15d62c0"
    assert stream_write_id(query, 0) == stream_write_id(query, 0)
    assert len({stream_write_id(query, 0), stream_write_id(query, 1), stream_write_id("x", 0)}) == 3
    assert len(stream_write_id(query, 7)) == 16
