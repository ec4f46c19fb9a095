"""Spark and objq: bulk enqueue, archive reads, and a 100,000-job run end to end.

* **enqueue**: N Dramatiq messages (actor ``add``, two integer arguments) into an empty queue on
  a local directory, (a) through the Spark writer (staged objects, one commit), (b) through a
  plain Python loop of ``Queue.enqueue_many`` in chunks of 1,000, (c) one ``enqueue_many`` of
  all N (one commit, payloads inline). Rows per second, the size of the state afterwards, and
  the time of one further small commit on that state (what every ack commit pays while
  workers drain it).
* **archive**: N archive records in objects of 500, read by the ``objq`` source and by
  ``spark.read.json`` on the same files (schema inferred, and given), same aggregation.
* **e2e**: N rows through the Spark writer in one commit, drained by two ``dramatiq`` worker
  processes (8 threads each) of ``integrations.dramatiq_app``, then ``objq report``.
* **stream**: (a) N rows landing as JSON files (ten), enqueued by a streaming query through the
  ``objq`` sink with an ``availableNow`` trigger, a file per micro-batch: rows per second over
  the micro-batches, and over the query's whole run; (b) the streaming source at a 1 s
  trigger while a worker acks jobs at a steady rate (``--ack-rate``, for ``--seconds``): the
  time from each ack's return to the start of the ``foreachBatch`` call that holds its row
  (median, p99).

    python benchmarks/spark_throughput.py                      # all four, N = 100,000
    python benchmarks/spark_throughput.py --only enqueue --rows 20000
    python benchmarks/spark_throughput.py --only stream

Markdown tables go to stdout, progress to stderr.
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from benchmarks.provenance import objq_revision  # noqa: E402
from objq_broker import Queue  # noqa: E402
from objq_broker.engine import STATE_KEY  # noqa: E402
from objq_broker.engine.archive import archive_key  # noqa: E402
from objq_broker.model.encoding import encode_archive  # noqa: E402
from objq_broker.model.messages import dramatiq_message  # noqa: E402
from objq_broker.model.records import ArchiveRecord, Job  # noqa: E402

CHUNK = 1000
RECORDS_PER_OBJECT = 500


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def state_size(folder: Path) -> int:
    return (folder / STATE_KEY).stat().st_size


def small_commit_seconds(url: str) -> float:
    """One enqueue and its ack on the state as it is: the cost of a commit while draining."""
    with Queue(url) as queue:
        queue.stats("default")  # load the state first: time the commits, not the first read
        started = time.perf_counter()
        queue.enqueue("probe", b"x")
        [delivery] = queue.claim("probe")
        queue.ack(delivery)
        return (time.perf_counter() - started) / 3


def bench_enqueue(spark: Any, rows: int, work: Path) -> list[list[str]]:
    table = []
    # (a) Spark writer
    folder = work / "spark-store"
    df = spark.range(0, rows, numPartitions=2).selectExpr("id as x", "1 as y").cache()
    df.count()
    # Warm-up: the first write of a session starts the Python workers.
    df.limit(100).write.format("objq").option("url", (work / "warm-up").as_uri()).option(
        "queue", "default"
    ).option("dramatiq_actor", "add").option("args_columns", "x,y").mode("append").save()
    started = time.perf_counter()
    (
        df.write.format("objq")
        .option("url", folder.as_uri())
        .option("queue", "default")
        .option("dramatiq_actor", "add")
        .option("args_columns", "x,y")
        .mode("append")
        .save()
    )
    spark_seconds = time.perf_counter() - started
    table.append(
        ["Spark writer (one commit, staged)", rows / spark_seconds, spark_seconds,
         state_size(folder), small_commit_seconds(folder.as_uri())]
    )  # fmt: skip
    log(f"spark: {spark_seconds:.1f} s")
    # (b) Python loop of enqueue_many, and (c) one enqueue_many
    for label, chunk in (("Python loop of enqueue_many (1,000 per call)", CHUNK),
                         ("one enqueue_many of all rows", rows)):  # fmt: skip
        folder = work / f"loop-{chunk}"
        started = time.perf_counter()
        with Queue(folder.as_uri()) as queue:
            for first in range(0, rows, chunk):
                payloads = [
                    dramatiq_message("default", "add", [x, 1])
                    for x in range(first, min(first + chunk, rows))
                ]
                queue.enqueue_many("default", payloads)
        seconds = time.perf_counter() - started
        table.append(
            [label, rows / seconds, seconds, state_size(folder),
             small_commit_seconds(folder.as_uri())]
        )  # fmt: skip
        log(f"{label}: {seconds:.1f} s")
    return [
        [name, f"{rate:,.0f}", f"{seconds:.1f}", f"{size / 1e6:.1f}", f"{commit * 1000:.0f}"]
        for name, rate, seconds, size, commit in table
    ]


def make_archive(folder: Path, records: int) -> None:
    from objq_broker.storage import open_store

    store = open_store(folder.as_uri())
    base = datetime(2026, 3, 1, tzinfo=UTC).timestamp()
    for number, first in enumerate(range(0, records, RECORDS_PER_OBJECT)):
        at = base + number * 60.0  # one object a minute: 60 per hour folder
        batch = [
            ArchiveRecord(
                "done" if n % 50 else "dead",
                f"c{number}",
                Job(
                    id=f"j{n}",
                    queue=f"q{n % 4}",
                    body=dramatiq_message(f"q{n % 4}", "add", [n, 1]),
                    seq=n,
                    enqueued_at=at - 2,
                    visible_at=at - 2,
                    max_attempts=5,
                    attempts=1,
                    started_at=at - 1,
                    finished_at=at,
                ),
            )
            for n in range(first, min(first + RECORDS_PER_OBJECT, records))
        ]
        store.put(archive_key(f"c{number}", at), encode_archive(batch))
    store.close()


JSON_SCHEMA = (
    "outcome string, commit_id string, job struct<id: string, queue: string, body: string, "
    "seq: long, enqueued_at: double, visible_at: double, max_attempts: int, attempts: int, "
    "started_at: double, finished_at: double, error: string>"
)


def bench_archive(spark: Any, records: int, work: Path) -> list[list[str]]:
    folder = work / "archive-store"
    make_archive(folder, records)
    files = str(folder / "archive" / "*" / "*" / "*" / "*" / "*.jsonl")
    cases = {
        "objq source (Arrow batches, payloads parsed)": lambda: (
            spark.read.format("objq")
            .option("url", folder.as_uri())
            .load()
            .groupBy("queue", "state")
            .count()
            .collect()
        ),
        "spark.read.json, schema inferred": lambda: (
            spark.read.json(files).groupBy("job.queue", "outcome").count().collect()
        ),
        "spark.read.json, schema given": lambda: (
            spark.read.schema(JSON_SCHEMA)
            .json(files)
            .groupBy("job.queue", "outcome")
            .count()
            .collect()
        ),
    }
    rows = []
    for name, run in cases.items():
        run()  # warm-up: Python workers, JIT
        started = time.perf_counter()
        result = run()
        seconds = time.perf_counter() - started
        assert sum(r["count"] for r in result) == records, result
        rows.append([name, f"{records / seconds:,.0f}", f"{seconds:.2f}"])
        log(f"{name}: {seconds:.2f} s")
    return rows


def bench_e2e(spark: Any, rows: int, work: Path) -> list[list[str]]:
    folder = work / "e2e-store"
    url = folder.as_uri()
    results = work / "e2e-results"
    env = dict(os.environ, OBJQ_URL=url, APP_RESULTS_DIR=str(results), PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "dramatiq", "integrations.dramatiq_app",
               "--processes", "1", "--threads", "8"]  # fmt: skip
    workers = [
        subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(2)
    ]
    try:
        df = spark.range(0, rows, numPartitions=2).selectExpr("id as x", "1 as y")
        started = time.perf_counter()
        (
            df.write.format("objq").option("url", url).option("queue", "default")
            .option("dramatiq_actor", "add").option("args_columns", "x,y")
            .mode("append").save()
        )  # fmt: skip
        written = time.perf_counter()
        log(f"e2e: enqueued in {written - started:.1f} s, state {state_size(folder) / 1e6:.1f} MB")
        with Queue(url) as queue:
            while True:
                stats = queue.stats("default")
                if stats.ready + stats.in_flight + stats.delayed == 0:
                    break
                time.sleep(1.0)
        drained = time.perf_counter()
        log(f"e2e: drained in {drained - written:.1f} s")
    finally:
        for worker in workers:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(timeout=120)
    lines = sum(
        1 for path in results.glob("*.log") for line in path.read_text().splitlines() if line
    )
    from objq_broker.report import main as report_main

    out = work / "e2e-report"
    report_started = time.perf_counter()
    assert report_main(["--url", url, "--since", "6h", "--out", str(out)]) == 0
    report_seconds = time.perf_counter() - report_started
    with open(out / "tasks.csv", newline="") as table:
        finished = sum(int(row["jobs"]) for row in csv.DictReader(table))
    drain = max(drained - written, 1e-9)
    return [
        ["rows enqueued (one commit)", f"{rows:,}", f"{written - started:.1f}"],
        ["drained by 2 workers x 8 threads", f"{rows / drain:,.0f} jobs/s", f"{drain:.1f}"],
        ["actor runs logged (at least once)", f"{lines:,}", ""],
        ["finished jobs counted by the report", f"{finished:,}", f"{report_seconds:.1f}"],
    ]  # fmt: skip


STREAM_FILES = 10


def bench_stream_sink(spark: Any, rows: int, work: Path) -> list[list[str]]:
    inbox = work / "stream-inbox"
    inbox.mkdir()
    per_file = -(-rows // STREAM_FILES)
    for index in range(STREAM_FILES):
        xs = range(index * per_file, min((index + 1) * per_file, rows))
        (inbox / f"rows-{index}.json").write_text("".join(f'{{"x": {x}}}\n' for x in xs))
    url = (work / "stream-store").as_uri()
    started = time.perf_counter()
    query = (
        spark.readStream.schema("x long").option("maxFilesPerTrigger", 1).json(str(inbox))
        .selectExpr("x", "1 as y").writeStream.format("objq").option("url", url)
        .option("queue", "default").option("dramatiq_actor", "add").option("args_columns", "x,y")
        .option("checkpointLocation", str(work / "stream-sink-checkpoint"))
        .trigger(availableNow=True).start()
    )  # fmt: skip
    query.awaitTermination()
    seconds = time.perf_counter() - started
    batches = [p for p in query.recentProgress if p["numInputRows"]]
    busy = sum(p["durationMs"]["triggerExecution"] for p in batches) / 1000
    with Queue(url) as queue:
        enqueued = queue.stats("default").ready
    assert enqueued == rows, (enqueued, rows)
    log(f"stream sink: {rows} rows in {len(batches)} micro-batches, {busy:.1f} s busy")
    return [
        [f"sink: {rows:,} rows, {len(batches)} micro-batches (busy time)", f"{rows / busy:,.0f}",
         f"{busy:.1f}"],
        ["sink: the same, whole query (start to end)", f"{rows / seconds:,.0f}", f"{seconds:.1f}"],
    ]  # fmt: skip


def bench_stream_source(spark: Any, work: Path, ack_rate: float, seconds: float) -> list[list[str]]:
    import threading

    url = (work / "source-store").as_uri()
    total = int(ack_rate * seconds)
    with Queue(url) as queue:
        queue.enqueue_many("default", [dramatiq_message("default", "add", [x, 1]) for x in
                                       range(total)])  # fmt: skip
    acked: dict[str, float] = {}
    arrived: dict[str, float] = {}

    def arrive(batch: Any, batch_id: int) -> None:
        at = time.time()
        for row in batch.select("id").collect():
            arrived.setdefault(row.id, at)

    query = (
        spark.readStream.format("objq").option("url", url).option("startingOffsets", "latest")
        .load().writeStream.foreachBatch(arrive)
        .option("checkpointLocation", str(work / "stream-source-checkpoint"))
        .trigger(processingTime="1 second").start()
    )  # fmt: skip
    while not query.recentProgress:  # the query is up: its first (empty) micro-batch ran
        time.sleep(0.2)

    def ack() -> None:
        with Queue(url) as queue:
            started = time.perf_counter()
            for n in range(total):
                [delivery] = queue.claim("default")
                queue.ack(delivery)
                acked[delivery.job.id] = time.time()
                time.sleep(max(0.0, started + (n + 1) / ack_rate - time.perf_counter()))

    worker = threading.Thread(target=ack)
    worker.start()
    worker.join()
    deadline = time.time() + 60
    while len(arrived) < total and time.time() < deadline:
        time.sleep(0.5)
    query.stop()
    delays = sorted(arrived[job] - acked[job] for job in acked if job in arrived)
    assert len(delays) == total, (len(delays), total)
    median, p99 = delays[len(delays) // 2], delays[min(len(delays) - 1, int(len(delays) * 0.99))]
    log(f"stream source: {total} jobs, median {median:.2f} s, p99 {p99:.2f} s")
    return [
        [f"source: ack to micro-batch, {total:,} jobs at {ack_rate:g}/s, 1 s trigger, median",
         f"{median:.2f}"],
        ["source: the same, p99", f"{p99:.2f}"],
    ]  # fmt: skip


def markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--only", choices=["enqueue", "archive", "e2e", "stream"], action="append")
    parser.add_argument("--ack-rate", type=float, default=50.0, help="stream: acks per second")
    parser.add_argument("--seconds", type=float, default=30.0, help="stream: seconds of acks")
    args = parser.parse_args()
    chosen = args.only or ["enqueue", "archive", "e2e", "stream"]
    from objq_broker.spark import local_session

    spark = local_session("local[2]", app_name="objq-bench")
    spark.sparkContext.setLogLevel("ERROR")
    work = Path(tempfile.mkdtemp(prefix="objq-spark-bench-"))
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(f"Run {stamp}, objq {objq_revision(ROOT)}, {platform.python_version()}, "
          f"PySpark {spark.version}, {os.cpu_count()} cores, N = {args.rows:,}\n")  # fmt: skip
    try:
        if "enqueue" in chosen:
            rows = bench_enqueue(spark, args.rows, work)
            print("### Bulk enqueue (local directory)\n")
            header = ["how", "rows/s", "seconds", "state MB", "next commit ms"]
            print(markdown(header, rows) + "\n")
        if "archive" in chosen:
            print("### Archive read (local directory, 4 queues, objects of 500 records)\n")
            print(
                markdown(["reader", "records/s", "seconds"], bench_archive(spark, args.rows, work))
            )
            print()
        if "e2e" in chosen:
            print("### End to end: Spark -> one commit -> Dramatiq workers -> report\n")
            print(markdown(["step", "count", "seconds"], bench_e2e(spark, args.rows, work)))
            print()
        if "stream" in chosen:
            print("### Streaming: the sink's rows/s, the source's latency (local directory)\n")
            sink = bench_stream_sink(spark, args.rows, work)
            print(markdown(["what", "rows/s", "seconds"], sink) + "\n")
            source = bench_stream_source(spark, work, args.ack_rate, args.seconds)
            print(markdown(["what", "seconds"], source))
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
