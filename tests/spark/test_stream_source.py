"""The streaming source of finished jobs, on a real local Spark session, while workers finish
jobs: every archived job arrives once, across triggers and a restart from the checkpoint."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from objq_broker import Queue
from objq_broker.engine.archive import archive_key
from objq_broker.errors import ConfigurationError
from objq_broker.model.encoding import encode_archive
from objq_broker.model.records import ArchiveRecord, Job
from objq_broker.spark.stream_read import ObjqStreamReader, StreamOptions
from objq_broker.storage import open_store
from tests.support.waiting import wait_for

JOBS = 150
#: A small archive tail, so that finished jobs reach both archive objects and the tail.
TAIL_BYTES = 4096


class _Workers:
    """A thread that claims and acks a few jobs at a time, dead-lettering every tenth, once
    told to start."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.finished = 0
        self.go = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def finish(self, queue: Queue, count: int) -> None:
        for delivery in queue.claim("q", count):
            if delivery.payload.endswith(b"0"):
                queue.nack(delivery, error="boom", retry=False)
            else:
                queue.ack(delivery)
            self.finished += 1

    def _run(self) -> None:
        with Queue(self.url, archive_tail_bytes=TAIL_BYTES) as queue:
            self.finish(queue, 30)  # for the first micro-batch
            self.go.wait()
            while not self._stop.is_set() and self.finished < JOBS:
                self.finish(queue, 5)
                time.sleep(0.25)

    def __enter__(self) -> _Workers:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.go.set()
        self._stop.set()
        self._thread.join(timeout=30)


def _stream(spark: Any, url: str, out: Path, checkpoint: Path) -> Any:
    return (
        spark.readStream.format("objq")
        .option("url", url)
        .option("table", "archive")
        .option("startingOffsets", "earliest")
        .option("queues", "q")
        .load()
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="0.5 seconds")
        .start()
    )


def _delivered(spark: Any, out: Path) -> Counter[str]:
    if not (out / "_spark_metadata").exists():
        return Counter()
    return Counter(row.id for row in spark.read.parquet(str(out)).select("id").collect())


def _batches_with_rows(query: Any) -> int:
    failed = query.exception()
    if failed is not None:
        raise AssertionError(f"the query failed: {failed}")
    return sum(1 for progress in query.recentProgress if progress["numInputRows"] > 0)


def test_every_finished_job_arrives_once_across_triggers_and_a_restart(
    spark: Any, tmp_path: Path
) -> None:
    url = (tmp_path / "store").as_uri()
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    with Queue(url) as queue:
        # Payloads of ~300 bytes: a tail of 4 KiB is written out every dozen jobs.
        queue.enqueue_many("q", [f"{n:04d}".encode().rjust(300, b"x") for n in range(JOBS)])
        queue.enqueue("other", b"not read: another queue")
        [other] = queue.claim("other")
        queue.ack(other)
    # Given workers finishing jobs all along
    with _Workers(url) as workers:
        # When a query reads the archive over three triggers with rows, then stops
        query = _stream(spark, url, out, checkpoint)
        try:
            wait_for(lambda: _batches_with_rows(query) >= 1, 120, "a first micro-batch")
            workers.go.set()
            wait_for(
                lambda: _batches_with_rows(query) >= 3,
                120,
                "three micro-batches",
                progress=lambda: query.recentProgress,
            )
        finally:
            query.stop()
        first_run = sum(_delivered(spark, out).values())
        assert first_run > 0
        # And is started again from its checkpoint while the workers go on
        query = _stream(spark, url, out, checkpoint)
        try:
            wait_for(lambda: workers.finished >= JOBS, 120, "the workers to finish")
            wait_for(
                lambda: (
                    _batches_with_rows(query) >= 0 and sum(_delivered(spark, out).values()) >= JOBS
                ),
                120,
                "every job to arrive",
                progress=lambda: sum(_delivered(spark, out).values()),
            )
            time.sleep(1.5)  # a few more triggers: nothing may arrive twice
        finally:
            query.stop()
    # Then every finished job arrived once, with its outcome
    delivered = _delivered(spark, out)
    assert first_run < JOBS, "the first run read everything: no restart in the middle"
    assert [job for job, times in delivered.items() if times > 1] == []
    assert len(delivered) == JOBS
    rows = spark.read.parquet(str(out)).collect()
    assert Counter(row.state for row in rows) == {"done": JOBS - JOBS // 10, "dead": JOBS // 10}
    assert {row.queue for row in rows} == {"q"}
    store = open_store(url)
    try:
        assert len(store.list("archive/")) >= 3, "the jobs never reached archive objects"
    finally:
        store.close()


def _records(jobs: range, at: float) -> list[ArchiveRecord]:
    return [
        ArchiveRecord(
            "done",
            f"c{n}",
            Job(
                id=f"job-{n}",
                queue="q",
                body="x",
                seq=n,
                enqueued_at=at - 2,
                visible_at=at - 2,
                max_attempts=1,
                attempts=1,
                started_at=at - 1,
                finished_at=at,
            ),
        )
        for n in jobs
    ]


def _read(reader: ObjqStreamReader, start: dict[str, Any], end: dict[str, Any]) -> list[str]:
    ids: list[str] = []
    for part in reader.partitions(start, end):
        for batch in reader.read(part):
            ids += batch.column("id").to_pylist()
    return ids


def _reader(url: str, **options: str) -> ObjqStreamReader:
    return ObjqStreamReader(StreamOptions.from_options(options, url, 32))


def test_starting_offsets_and_a_micro_batch_run_again(tmp_path: Path) -> None:
    url = tmp_path.as_uri()
    store = open_store(url)
    now = time.time()
    store.put(archive_key("old", now - 7200), encode_archive(_records(range(0, 5), now - 7200)))
    store.put(archive_key("new", now), encode_archive(_records(range(5, 10), now)))
    with Queue(url) as queue:  # and one record in the state's tail
        queue.enqueue("q", b"tail")
        [delivery] = queue.claim("q")
        queue.ack(delivery)
    tail_id = delivery.job.id
    # earliest: everything; latest: nothing until more is archived
    earliest = _reader(url, startingOffsets="earliest")
    start = earliest.initialOffset()
    end = earliest.latestOffset(start)
    assert sorted(_read(earliest, start, end)) == sorted(
        [*(f"job-{n}" for n in range(10)), tail_id]
    )
    assert earliest.latestOffset(end) == end  # the state did not change: no listing
    with Queue(url) as queue:
        queue.enqueue("q", b"later")
    assert earliest.latestOffset(end) == end  # a commit that archived nothing: no micro-batch
    latest = _reader(url)
    start = latest.initialOffset()
    assert _read(latest, start, latest.latestOffset(start)) == []
    # A time: the jobs finished since then (here, an hour ago)
    recent = _reader(url, startingTimestamp="1h")
    start = recent.initialOffset()
    assert sorted(_read(recent, start, recent.latestOffset(start))) == sorted(
        [*(f"job-{n}" for n in range(5, 10)), tail_id]
    )
    # A micro-batch planned again by a new reader (a restart) reads the same records
    again = _reader(url, startingOffsets="earliest")
    assert sorted(_read(again, earliest.initialOffset(), end)) == sorted(
        _read(earliest, earliest.initialOffset(), end)
    )
    store.close()


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"startingOffsets": "newest"}, "startingOffsets must be one of"),
        ({"startingOffsets": "earliest", "startingTimestamp": "1h"}, "expected one"),
        ({"late_seconds": "soon"}, "late_seconds must be seconds"),
        ({"queues": " , "}, "names no queue"),
    ],
)
def test_bad_stream_options_are_refused(options: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        StreamOptions.from_options(options, "s3://jobs-bucket/objq", 32)


def _finish(url: str, payloads: list[bytes]) -> list[str]:
    """Enqueue, claim and ack ``payloads`` one commit each; their job ids."""
    ids = []
    with Queue(url) as queue:
        for payload in payloads:
            queue.enqueue("q", payload)
            [delivery] = queue.claim("q")
            queue.ack(delivery)
            ids.append(delivery.job.id)
    return ids


def test_a_tail_read_in_part_then_written_out_is_read_on_from_its_object(tmp_path: Path) -> None:
    url = tmp_path.as_uri()
    reader = _reader(url, startingOffsets="earliest")
    first = _finish(url, [b"a", b"b", b"c"])
    start = reader.initialOffset()
    end = reader.latestOffset(start)
    assert sorted(_read(reader, start, end)) == sorted(first)  # from the state's tail
    # Two more join the tail, then a large one fills it: all six go to an archive object
    more = _finish(url, [b"d", b"e", b"f" * 20_000])
    store = open_store(url)
    try:
        assert len(store.list("archive/")) == 1
    finally:
        store.close()
    start, end = end, reader.latestOffset(end)
    assert sorted(_read(reader, start, end)) == sorted(more)
    assert reader.latestOffset(end) == end
