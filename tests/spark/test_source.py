"""The ``objq`` Spark data source on a real local Spark session, on a directory and on S3."""

from __future__ import annotations

import contextlib
import io
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pyspark import TaskContext
from pyspark.errors import AnalysisException
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from objq_broker import Queue, builders
from objq_broker.engine import STATE_KEY, Engine
from objq_broker.engine.archive import archive_key
from objq_broker.engine.snapshot import Snapshot
from objq_broker.errors import QueueError
from objq_broker.model.bodies import split_ref
from objq_broker.model.encoding import decode_state, encode_archive
from objq_broker.model.records import ArchiveRecord, Job
from objq_broker.spark import ObjqDataSource
from objq_broker.spark.read import ObjqReader
from objq_broker.storage import open_store

ROWS = 100  # two partitions of 50


def _writer(spark: Any, df: Any, url: str, queue: str = "q", **options: str) -> Any:
    writer = df.write.format("objq").option("url", url).option("queue", queue)
    for name, value in options.items():
        writer = writer.option(name, value)
    return writer.mode("append")


def _jobs(spark: Any, url: str, table: str = "jobs") -> Any:
    return spark.read.format("objq").option("url", url).option("table", table).load()


def _staged(url: str) -> list[str]:
    """Staged objects left (a closed write's marker is not one)."""
    store = open_store(url)
    try:
        return [key for key in store.list("staging/") if not key.endswith("/_closed")]
    finally:
        store.close()


def _referenced(url: str) -> set[str]:
    """The bodies objects and runs the stored state refers to."""
    store = open_store(url)
    try:
        blob = store.read(STATE_KEY)
        if blob is None:
            return set()
        doc = decode_state(blob.data, "test")
        return set(doc.bodies) | doc.run_keys()
    finally:
        store.close()


def _round_trip(spark: Any, url: str) -> None:
    # Given a DataFrame of payloads with per-row priorities
    df = spark.range(0, ROWS, numPartitions=2).select(
        F.concat(F.lit("job-"), F.col("id").cast("string")).alias("payload"),
        (F.col("id") % 3).cast("int").alias("rank"),
    )
    # When it is written to a queue
    _writer(spark, df, url, priority_column="rank", rows_per_object="30").save()
    # Then the jobs table holds every row once, ready, with its priority
    rows = _jobs(spark, url).where("queue = 'q'").collect()
    assert sorted(r.payload for r in rows) == sorted(f"job-{i}".encode() for i in range(ROWS))
    assert {r.state for r in rows} == {"ready"}
    assert {(r.payload, r.priority) for r in rows} == {
        (f"job-{i}".encode(), i % 3) for i in range(ROWS)
    }
    # And only the staged objects the state refers to are left
    assert set(_staged(url)) == _referenced(url)
    # When workers drain the queue, half acked, the rest dead-lettered
    with Queue(url) as queue:
        deliveries = queue.claim("q", ROWS)
        assert len(deliveries) == ROWS
        assert deliveries[0].payload.startswith(b"job-")
        assert {d.job.priority for d in deliveries[:10]} == {0}  # lowest first
        for n, delivery in enumerate(deliveries):
            if n % 2:
                queue.nack(delivery, error="boom", retry=False)
            else:
                queue.ack(delivery)
    # Then the archive has them all, the dead table the failures, and staged objects are gone
    archive = _jobs(spark, url, "archive").collect()
    assert sorted(r.payload for r in archive) == sorted(f"job-{i}".encode() for i in range(ROWS))
    assert sum(r.state == "dead" for r in archive) == ROWS // 2
    assert all(r.finished_at is not None and r.started_at is not None for r in archive)
    dead = _jobs(spark, url, "dead").collect()
    assert len(dead) == ROWS // 2
    assert {r.error for r in dead} == {"boom"}
    # Dead letters still refer to their rows; once purged, no staged object is left
    assert set(_staged(url)) == _referenced(url) != set()
    with Queue(url) as queue:
        queue.purge_dead("q")
    assert _staged(url) == []


def test_round_trip_on_a_directory(spark: Any, tmp_path: Path) -> None:
    _round_trip(spark, (tmp_path / "store").as_uri())


def test_round_trip_on_s3(spark: Any, s3_url_factory: Callable[[], str]) -> None:
    _round_trip(spark, s3_url_factory())


def test_dramatiq_and_celery_messages_from_columns(spark: Any, tmp_path: Path) -> None:
    url = (tmp_path / "store").as_uri()
    df = spark.range(0, 20, numPartitions=2).selectExpr("id as x", "id * 2 as y")
    _writer(spark, df, url, "default", dramatiq_actor="add", args_columns="x,y").save()
    _writer(spark, df, url, "celery", celery_task="tasks.mul", kwargs_columns="x,y").save()
    rows = _jobs(spark, url).collect()
    assert {(r.queue, r.kind, r.task) for r in rows} == {
        ("default", "dramatiq", "add"),
        ("celery", "celery", "tasks.mul"),
    }
    assert len({r.message_id for r in rows}) == 40
    with Queue(url) as queue:
        import dramatiq

        messages = [dramatiq.Message.decode(d.payload) for d in queue.claim("default", 20)]
    assert sorted(m.args for m in messages) == [(x, 2 * x) for x in range(20)]


def test_a_failing_partition_leaves_the_queue_unchanged(spark: Any, tmp_path: Path) -> None:
    url = (tmp_path / "store").as_uri()
    with Queue(url) as queue:
        queue.enqueue("q", b"already there")

    @F.udf("string", useArrow=False)  # plain UDF: no type-hint inference
    def poisoned(n: int) -> str | None:
        # Partition 1's last row is null on every attempt: the writer refuses it after it has
        # staged the rows before it (late, so partition 0 has staged all of its rows by then).
        if n == ROWS - 1:
            time.sleep(1.0)
            return None
        return f"row-{n}"

    df = spark.range(0, ROWS, numPartitions=2).select(poisoned("id").alias("payload"))
    with pytest.raises(Exception, match="expected a payload, found null"):
        _writer(spark, df, url, rows_per_object="10").save()
    with Queue(url) as queue:
        assert [job.payload for _, job in queue.jobs("q")] == [b"already there"]
    assert _staged(url) == []


def test_a_retried_partition_enqueues_its_rows_once(spark: Any, tmp_path: Path) -> None:
    url = (tmp_path / "store").as_uri()

    @F.udf("string", useArrow=False)  # plain UDF: no type-hint inference
    def fails_first_time(n: int) -> str | None:
        context = TaskContext.get()
        if n == ROWS - 1 and context is not None and context.attemptNumber() == 0:
            return None  # the first attempt of partition 1 fails at its last row
        return f"row-{n}"

    df = spark.range(0, ROWS, numPartitions=2).select(fails_first_time("id").alias("payload"))
    _writer(spark, df, url, rows_per_object="10").save()
    rows = _jobs(spark, url).collect()
    assert sorted(r.payload for r in rows) == sorted(f"row-{n}".encode() for n in range(ROWS))
    # The committed rows of partition 1 come from its second attempt; the first attempt's
    # staged objects were removed.
    with Queue(url) as queue:
        refs = {split_ref(job.ref or "")[0] for _, job in queue.jobs("q")}
    partitions = {tuple(Path(key).name.split("-")[:2]) for key in refs}
    assert partitions == {("0", "0"), ("1", "1")}
    assert set(_staged(url)) == refs


def test_abort_after_a_landed_commit_keeps_what_the_queue_refers_to(tmp_path: Path) -> None:
    # Spark calls abort() when commit() raises, even if the compare-and-set had landed.
    import pyarrow as pa

    url = (tmp_path / "store").as_uri()
    source = ObjqDataSource({"url": url, "queue": "q", "rows_per_object": "2"})
    writer = source.writer(StructType().add("payload", "string"), False)
    batch = pa.RecordBatch.from_pydict({"payload": ["a", "b", "c"]})
    message = writer.write(iter([batch]))
    writer.commit([message])
    writer.abort([message])
    # Two bodies objects of two rows and one, and the run of each one's jobs
    assert len(_staged(url)) == 4 and set(_staged(url)) == _referenced(url)
    # A retried commit of the same write adds nothing
    writer.commit([message])
    assert writer.committed is None
    # A late attempt (a speculative copy still running) finds the write closed and cleans up
    with pytest.raises(QueueError, match="already committed or aborted"):
        writer.write(iter([batch]))
    assert set(_staged(url)) == _referenced(url)
    with Queue(url) as queue:
        deliveries = queue.claim("q", 10)
        assert sorted(d.payload for d in deliveries) == [b"a", b"b", b"c"]
        for delivery in deliveries:
            queue.ack(delivery)
    assert _staged(url) == []


def test_unsupported_save_modes_are_refused(spark: Any, tmp_path: Path) -> None:
    url = (tmp_path / "store").as_uri()
    df = spark.range(3).selectExpr("cast(id as string) as payload")
    with pytest.raises(Exception, match=r"use mode\('append'\)"):
        _writer(spark, df, url).mode("overwrite").save()
    with pytest.raises(AnalysisException, match="ErrorIfExists"):
        _writer(spark, df, url).mode("error").save()
    with pytest.raises(Exception, match=r"column.*'body'.*not in the DataFrame"):
        _writer(spark, df, url, payload_column="body").save()
    assert _staged(url) == []


def _archive_hours(url: str) -> list[float]:
    """Archive objects for 6 hours of one day, two queues, 5 jobs each per hour."""
    store = open_store(url)
    hours = [datetime(2026, 3, 1, h, 30, tzinfo=UTC).timestamp() for h in range(6)]
    try:
        for h, at in enumerate(hours):
            for queue in ("a", "b"):
                records = [
                    ArchiveRecord(
                        "done",
                        f"c{h}{queue}",
                        Job(
                            id=f"{queue}-{h}-{n}",
                            queue=queue,
                            body="x",
                            seq=n,
                            enqueued_at=at - 5,
                            visible_at=at,
                            max_attempts=1,
                            attempts=1,
                            started_at=at - 1,
                            finished_at=at + n,
                        ),
                    )
                    for n in range(5)
                ]
                store.put(archive_key(f"c{h}{queue}", at + 10), encode_archive(records))
    finally:
        store.close()
    return hours


def test_filters_on_queue_and_time_are_pushed_down(spark: Any, tmp_path: Path) -> None:
    url = (tmp_path / "store").as_uri()
    hours = _archive_hours(url)

    def archive() -> Any:
        # A fresh relation per query: Spark keeps a pushed-down plan on the loaded relation.
        return (
            spark.read.format("objq")
            .option("url", url)
            .option("table", "archive")
            .option("objects_per_partition", "1")
            .load()
        )

    start = datetime.fromtimestamp(hours[2], UTC)
    end = datetime.fromtimestamp(hours[3] + 2.5, UTC)  # within hour 3: jobs 0, 1, 2
    chosen = archive().where(
        (F.col("queue") == "a") & (F.col("finished_at") >= start) & (F.col("finished_at") < end)
    )
    plan = io.StringIO()
    with contextlib.redirect_stdout(plan):
        chosen.explain("formatted")
    pushed = next(line for line in plan.getvalue().splitlines() if "PushedFilters" in line)
    assert "EqualTo(queue,a)" in pushed
    assert "GreaterThanOrEqual(finished_at" in pushed
    assert "LessThan(finished_at" in pushed
    assert sorted(r.id for r in chosen.collect()) == [
        *(f"a-2-{n}" for n in range(5)),
        *(f"a-3-{n}" for n in range(3)),
    ]
    # One object per partition: the partitions count the archive objects read.
    # Hours 2 and 3, plus one hour of commit slack after the range: 3 hours of 2 objects.
    assert chosen.rdd.getNumPartitions() == 6
    assert archive().rdd.getNumPartitions() == 12
    assert archive().count() == 60


def test_the_archive_table_reads_the_state_tail_once(spark: Any, tmp_path: Path) -> None:
    url = (tmp_path / "store").as_uri()
    # Two records in an object (past 16 times the tail's size, they leave at once), then
    # three in the state's tail
    with Queue(url, archive_tail_bytes=1_000) as queue:
        for payloads in ([b"a" * 9_000, b"b" * 9_000], [b"c", b"d", b"e"]):
            queue.enqueue_many("q", payloads)
            for delivery in queue.claim("q", len(payloads)):
                queue.ack(delivery)
            queue.flush()
    store = open_store(url)
    try:
        tail = Snapshot.read(store).archive_tail
        assert [r.job.payload for r in tail] == [b"c", b"d", b"e"]
        # a writer that wrote the tail out and died before its state write landed
        store.put(archive_key("died", time.time()), encode_archive(tail))
    finally:
        store.close()
    archive = _jobs(spark, url, "archive")
    assert sorted(r.payload[:1] for r in archive.collect()) == [b"a", b"b", b"c", b"d", b"e"]
    assert archive.rdd.getNumPartitions() == 2  # the objects, and the tail


def _with_runs(url: str) -> Engine:
    """A namespace whose backlog, delayed jobs and dead letters are mostly in runs: 60 ready
    jobs, 15 delayed, 12 dead letters and 3 in flight, past a bound of 5 in runs of 10."""
    engine = Engine(open_store(url), spill_at=5, run_jobs=10)
    engine.call(builders.declare("q", {}))
    for n in range(6):
        payloads = [f"job-{n}-{i}".encode() for i in range(10)]
        engine.call(builders.enqueue("q", payloads, priority=n % 3))
    engine.call(builders.enqueue("q", [f"later-{i}".encode() for i in range(15)], delay=3600))
    doomed = engine.call(builders.claim(["q"], 12, owner="test"))
    for delivery in builders.deliveries(doomed):
        engine.call(builders.nack(delivery, error="boom", retry=False))
    engine.call(builders.claim(["q"], 3, owner="test"))
    engine.flush()
    return engine


def test_jobs_and_dead_tables_read_runs_on_several_partitions(spark: Any, tmp_path: Path) -> None:
    url = tmp_path.as_uri()
    _with_runs(url).close()
    snapshot = Snapshot.read(open_store(url))
    live_runs, dead_runs = snapshot.live_runs(), snapshot.dead_runs()
    assert len(live_runs) >= 4 and len(dead_runs) >= 1, "the namespace did not spill"
    expected = {(job.id, state, snapshot.fill(job).payload) for state, job in snapshot.all_live()}
    assert len(expected) == 60 + 15 - 12
    reader = spark.read.format("objq").option("url", url).option("runs_per_partition", "2")
    jobs = reader.option("table", "jobs").load()
    # The head on one partition, the runs two by two on others; every job once, as it is.
    assert jobs.rdd.getNumPartitions() == 1 + (len(live_runs) + 1) // 2
    rows = jobs.where("queue = 'q'").collect()
    assert len(rows) == len(expected)
    assert {(r.id, r.state, r.payload) for r in rows} == expected
    assert {state for _, state, _ in expected} == {"ready", "delayed", "in-flight"}
    dead = reader.option("table", "dead").load()
    assert dead.rdd.getNumPartitions() == 1 + (len(dead_runs) + 1) // 2
    assert sorted(r.id for r in dead.collect()) == sorted(j.id for j in snapshot.all_dead())
    assert {r.error for r in dead.collect()} == {"boom"}


def test_a_run_consumed_after_planning_yields_no_rows_and_the_rest_are_read(
    tmp_path: Path,
) -> None:
    url = tmp_path.as_uri()
    engine = _with_runs(url)
    try:
        reader = ObjqReader(url, "jobs", runs_per_partition=1)
        parts = reader.partitions()
        planned = {p.runs[0][1].key: p for p in parts if p.runs}
        # Workers take the whole backlog's first runs, which are then deleted.
        engine.call(builders.claim(["q"], 20, owner="late"))
        engine.flush()
        gone = [key for key in planned if open_store(url).read(key) is None]
        assert gone, "no run was consumed"
        for key, part in planned.items():
            count = sum(batch.num_rows for batch in reader.read(part))
            ref = part.runs[0][1]
            assert count == (0 if key in gone else ref.remaining)
    finally:
        engine.close()


def test_a_written_dataframe_is_runs_its_jobs_never_in_the_head(spark: Any, tmp_path: Path) -> None:
    url = (tmp_path / "store").as_uri()
    with Queue(url) as queue:
        queue.enqueue("q", b"before")
    df = spark.range(0, 30, numPartitions=3).select(
        F.concat(F.lit("row-"), F.col("id").cast("string")).alias("payload"),
        (F.col("id") % 2).cast("int").alias("rank"),
        F.when(F.col("id") % 10 == 9, F.lit(3600.0)).otherwise(F.lit(0.0)).alias("wait"),
    )
    _writer(spark, df, url, priority_column="rank", delay_column="wait").save()
    store = open_store(url)
    blob = store.read(STATE_KEY)
    assert blob is not None
    doc = decode_state(blob.data, "test")
    # One ready and one timed run per partition (10 rows each, one of them delayed)
    assert [job.body for job in doc.jobs] == ["before"]
    assert sorted(ref.kind for ref in doc.runs["q"]) == ["ready"] * 3 + ["timed"] * 3
    with Queue(url) as queue:
        assert queue.stats("q").ready == 28 and queue.stats("q").delayed == 3
        claimed = [d.payload for d in queue.claim("q", 40)]
    # By priority, then in partition and row order, after what was enqueued before
    ready = [n for n in range(30) if n % 10 != 9]
    expected = [b"before"] + [f"row-{n}".encode() for n in sorted(ready, key=lambda n: n % 2)]
    assert claimed == expected


def test_the_jobs_and_archive_tables_show_each_jobs_group(spark: Any, tmp_path: Path) -> None:
    url = (tmp_path / "store").as_uri()
    with Queue(url) as queue:
        queue.enqueue_many("g", [b"a0", b"a1"], group="tenant-a")
        queue.enqueue("g", b"none")
        (done,) = queue.claim("g")
        queue.ack(done)
    jobs = {r.payload: r.group for r in _jobs(spark, url).where("queue = 'g'").collect()}
    assert jobs == {b"a1": "tenant-a", b"none": None}
    archive = _jobs(spark, url, "archive").where("`group` = 'tenant-a'").collect()
    assert [r.payload for r in archive] == [b"a0"]


def test_a_group_column_puts_each_rows_job_in_its_group_with_its_cap_and_order(
    spark: Any, tmp_path: Path
) -> None:
    # Given a queue that runs one job of a group at a time, and a job of tenant b enqueued
    # before the write
    url = (tmp_path / "store").as_uri()
    with Queue(url) as queue:
        queue.declare("g", group_concurrency=1)
        queue.enqueue("g", b"b-first", group="b")
    # When a DataFrame of 20 rows in two groups (and 4 with none) is written
    df = spark.range(0, 24, numPartitions=2).select(
        F.concat(F.lit("row-"), F.col("id").cast("string")).alias("payload"),
        F.when(F.col("id") >= 20, F.lit(None))
        .otherwise(F.when(F.col("id") % 2 == 0, F.lit("a")).otherwise(F.lit("b")))
        .alias("tenant"),
    )
    _writer(spark, df, url, queue="g", group_column="tenant").save()
    with Queue(url) as queue:
        # Then the groups are counted without reading the runs
        stats = queue.stats("g")
        assert stats.groups == 2  # a and b (the four rows of no group name none)
        counts = {g.group: g.ready for g in stats.busiest if g.group in ("a", "b")}
        assert counts == {"a": 10, "b": 11}
        # And a claim takes one job of each group at most, a group's first job first
        claimed = queue.claim("g", 30)
        firsts = {d.payload for d in claimed}
        assert {b"b-first", b"row-0"} <= firsts
        assert not firsts & {f"row-{n}".encode() for n in range(2, 20)}
        # And the jobs of each group run in row order, one at a time, all of them
        order: dict[str, list[bytes]] = {"a": [], "b": []}
        while claimed:
            for delivery in claimed:
                if delivery.job.group in order:
                    order[delivery.job.group].append(delivery.payload)
                queue.ack(delivery)
            claimed = queue.claim("g", 30)
    assert order["a"] == [f"row-{n}".encode() for n in range(0, 20, 2)]
    assert order["b"] == [b"b-first"] + [f"row-{n}".encode() for n in range(1, 20, 2)]
