"""What the queue did: a Spark job over the archive, written as tables, charts and a page.

    python -m objq_broker.report --url s3://jobs-bucket/objq --since 24h --out report/

reads the archive of finished and dead-lettered jobs in ``[since, until)`` (only the hours in
range are listed and read) and writes to ``--out``:

* ``buckets.parquet`` / ``buckets.csv``: per time bucket, queue and task: jobs finished, done,
  retried, failed, dead, failure rate, throughput (jobs per second over the bucket), and the
  50th/90th/99th percentiles of queue wait (started - enqueued) and run time
  (finished - started), in seconds. The bucket size follows the range (:func:`bucket_seconds`:
  a second for a run of seconds, up to a week for years), so the charts have tens to a few
  hundred points; the ``bucket_seconds`` column and the page say which it is. A bucket cut by
  the range's ends counts its throughput over the part inside the range.
* ``tasks.parquet`` / ``tasks.csv``: the same per queue and task over the whole range.
* ``throughput.png``, ``latency.png``, ``failures.png`` and ``index.html`` showing them.

A job appears once even if the archive holds it twice (see :mod:`objq_broker.engine.archive`).
The task is the Dramatiq actor or Celery task named in the payload, else ``(payload)``.
Each job counts once, with the worst outcome its records say: done, retried (its run failed and
the framework sent it again as a new job), failed (its run failed for good and the framework
settled it itself: Celery, or Dramatiq without its Retries middleware) or dead (dead-lettered
by the broker). The failure rate is (failed + dead) / (jobs - retried): of the jobs that came
to an end, the share that did not succeed. A framework's note on a job (Celery's, written after
the job was acked) counts when it falls in the same range as the job's own record.
"""

from __future__ import annotations

import argparse
import html
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from objq_broker.engine.archive import OUTCOME_RANKS
from objq_broker.engine.options import URL_ENV
from objq_broker.errors import ConfigurationError, redacted
from objq_broker.model.durations import parse_time

#: Percentiles reported for queue wait and run time.
PERCENTILES = (0.5, 0.9, 0.99)
#: Where the report goes when ``--out`` is not given.
DEFAULT_OUT = "objq-report"
#: The bucket sizes the report chooses from, in seconds: whole seconds, minutes, hours, days.
BUCKET_SIZES_SECONDS = (
    1, 2, 5, 10, 15, 30,
    60, 120, 300, 600, 900, 1800,
    3600, 7200, 10800, 21600, 43200,
    86400, 7 * 86400,
)  # fmt: skip
#: At most this many buckets over the range (the charts' points per line).
MAX_BUCKETS = 200


def bucket_seconds(since: float, until: float) -> int:
    """The smallest bucket size that cuts ``[since, until)`` into at most :data:`MAX_BUCKETS`
    buckets (the largest size for a longer range)."""
    span = max(until - since, 0.0)
    for size in BUCKET_SIZES_SECONDS:
        if span / size <= MAX_BUCKETS:
            return size
    return BUCKET_SIZES_SECONDS[-1]


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="objq report", description="Throughput, latency and failures from the archive."
    )
    parser.add_argument("--url", default=os.environ.get(URL_ENV), help=f"store URL (${URL_ENV})")
    parser.add_argument("--since", required=True, help="ISO time, Unix seconds, or age (24h)")
    parser.add_argument("--until", help="end of the range (exclusive); default: now")
    parser.add_argument("--queue", action="append", help="only these queues (repeatable)")
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"output folder ({DEFAULT_OUT})")
    parser.add_argument("--master", default="local[*]", help="Spark master (local[*])")
    args = parser.parse_args(argv)
    if not args.url:
        parser.error(f"no store: pass --url or set ${URL_ENV}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the report; returns the process exit status."""
    args = _arguments(argv)
    now = time.time()
    try:
        since = parse_time(args.since, now, "--since")
        until = parse_time(args.until, now, "--until") if args.until else now
    except ConfigurationError as exc:
        print(f"objq report: {exc}", file=sys.stderr)
        return 2
    if until <= since:
        print(f"objq report: --until ({until}) must be after --since ({since})", file=sys.stderr)
        return 2
    from objq_broker.spark import local_session

    spark = local_session(args.master, app_name="objq-report")
    buckets, tasks = summarise(spark, args.url, since, until, args.queue)
    out = Path(args.out)
    write_report(out, buckets, tasks, url=args.url, since=since, until=until)
    total, counts = _totals(tasks)
    size = _size(bucket_seconds(since, until))
    print(f"{total} jobs finished ({counts}) in {_span(since, until)}, in buckets of {size}")
    for row in tasks.itertuples():
        print(f"  {row.queue} {row.task}: {row.jobs} finished, {_counts(row._asdict())}")
    print(f"report written to {out.resolve()}/index.html")
    return 0


def summarise(
    spark: Any, url: str, since: float, until: float, queues: list[str] | None = None
) -> tuple[Any, Any]:
    """(per-bucket, per-task) pandas tables of the jobs finished in ``[since, until)``, in
    buckets of :func:`bucket_seconds`."""
    from pyspark.sql import functions as F

    size = bucket_seconds(since, until)
    start = datetime.fromtimestamp(since, UTC)
    end = datetime.fromtimestamp(until, UTC)
    archive = spark.read.format("objq").option("url", url).option("table", "archive").load()
    chosen = archive.where(
        (F.col("finished_at") >= F.lit(start)) & (F.col("finished_at") < F.lit(end))
    )
    if queues:
        chosen = chosen.where(F.col("queue").isin(queues))
    # A framework's note on how a run went (see Queue.note_outcome) is a record of its own;
    # each job counts once, with the worst outcome said of it.
    note = F.col("state").isin(*RUN_NOTES) & (F.col("attempts") == 0)
    noted = chosen.where(note).groupBy("id").agg(F.max(_rank("state")).alias("noted"))
    outcome = F.greatest(_rank("state"), F.coalesce(F.col("noted"), F.lit(0)))
    jobs = (
        chosen.where(~note)
        .dropDuplicates(["id"])
        .join(noted, "id", "left")
        .select(
            "queue",
            F.coalesce("task", F.lit("(payload)")).alias("task"),
            F.timestamp_seconds(F.floor(F.col("finished_at").cast("double") / size) * size).alias(
                "bucket"
            ),
            *[
                (outcome == rank).cast("int").alias(name)
                for name, rank in OUTCOME_RANKS.items()
                if rank
            ],
            (F.col("started_at").cast("double") - F.col("enqueued_at").cast("double")).alias(
                "wait"
            ),
            (F.col("finished_at").cast("double") - F.col("started_at").cast("double")).alias("run"),
        )
        .cache()
    )
    try:
        # A bucket cut by an end of the range: its rate over the part inside the range.
        bucket_start = F.col("bucket").cast("double")
        inside = F.least(bucket_start + size, F.lit(until)) - F.greatest(bucket_start, F.lit(since))
        buckets = _aggregate(jobs, ["bucket", "queue", "task"], per_second=inside)
        buckets.insert(1, "bucket_seconds", size)
        tasks = _aggregate(jobs, ["queue", "task"], per_second=F.lit(max(until - since, 1e-6)))
    finally:
        jobs.unpersist()
    return buckets, tasks


#: Outcomes a framework may note on a job after its own record was written.
RUN_NOTES = ("failed", "retried")
#: Counted per job, besides done.
_COUNTED = ("retried", "failed", "dead")


def _rank(column: str) -> Any:
    from pyspark.sql import functions as F

    ranked = F.lit(0)
    for name, rank in OUTCOME_RANKS.items():
        ranked = F.when(F.col(column) == name, F.lit(rank)).otherwise(ranked)
    return ranked


def _aggregate(jobs: Any, keys: list[str], per_second: Any) -> Any:
    """Counts and percentiles per ``keys``; throughput is jobs over ``per_second`` (a column
    of seconds)."""
    from pyspark.sql import functions as F

    levels = list(PERCENTILES)
    grouped = jobs.groupBy(*keys).agg(
        F.count("*").alias("jobs"),
        *[F.sum(name).alias(name) for name in _COUNTED],
        F.percentile_approx("wait", levels).alias("wait"),
        F.percentile_approx("run", levels).alias("run"),
    )
    done = F.col("jobs") - F.col("retried") - F.col("failed") - F.col("dead")
    columns = [*keys, "jobs", done.alias("done"), *_COUNTED]
    # Of the jobs that came to an end: a retried run's job lives on as a new one.
    ended = F.col("jobs") - F.col("retried")
    failures = (F.col("failed") + F.col("dead")) / F.when(ended > 0, ended)
    columns.append(F.coalesce(failures, F.lit(0.0)).alias("failure_rate"))
    columns.append((F.col("jobs") / per_second).alias("jobs_per_second"))
    for metric in ("wait", "run"):
        for index, level in enumerate(levels):
            name = f"{metric}_p{round(level * 100)}_s"
            columns.append(F.col(metric).getItem(index).alias(name))
    table = grouped.select(*columns).orderBy(*keys).toPandas()
    for name in ("jobs", "done", *_COUNTED):
        table[name] = table[name].astype("int64")
    return table


def write_report(
    out: Path, buckets: Any, tasks: Any, *, url: str, since: float, until: float
) -> None:
    """Tables as Parquet and CSV, three charts and an HTML page into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    for name, table in (("buckets", buckets), ("tasks", tasks)):
        table.to_parquet(out / f"{name}.parquet", index=False)
        table.to_csv(out / f"{name}.csv", index=False)
    from objq_broker.spark.charts import draw_charts

    size = _size(bucket_seconds(since, until))
    charts = draw_charts(out, buckets, tasks, size)
    title = f"objq report: {html.escape(_span(since, until))}"
    figures = "\n".join(f'<p><img src="{name}" alt="{name}"></p>' for name in charts)
    links = " · ".join(
        f'<a href="{n}">{n}</a>'
        for n in ("buckets.csv", "buckets.parquet", "tasks.csv", "tasks.parquet")
    )
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}</style></head>
<body><h1>{title}</h1>
<p>Store: <code>{html.escape(redacted(url))}</code>. Jobs: {_totals(tasks)[0]}
({html.escape(_totals(tasks)[1])}). Failure rate: (failed + dead) / (jobs - retried). Times in
seconds; wait = started - enqueued, run = finished - started. Buckets of {size}; throughput
is jobs finished per second over each bucket.</p>
<h2>Per task</h2>
{tasks.to_html(index=False, float_format=lambda v: f"{v:.4g}")}
{figures}
<h2>Per bucket of {size}</h2>
{buckets.to_html(index=False, float_format=lambda v: f"{v:.4g}")}
<p>Data: {links}</p>
</body></html>
"""
    (out / "index.html").write_text(page, encoding="utf-8")


def _totals(tasks: Any) -> tuple[int, str]:
    """All jobs, and how they ended ("12 done, 1 retried, 2 failed, 0 dead")."""
    sums = {name: int(tasks[name].sum()) if len(tasks) else 0 for name in ("jobs", "done")}
    sums.update({name: int(tasks[name].sum()) if len(tasks) else 0 for name in _COUNTED})
    return sums["jobs"], _counts(sums)


def _counts(row: Any) -> str:
    return ", ".join(f"{int(row[name])} {name}" for name in ("done", *_COUNTED))


def _size(seconds: int) -> str:
    """A bucket size as people say it: "1 s", "15 min", "6 h", "1 d"."""
    for unit, length in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= length and seconds % length == 0:
            return f"{seconds // length} {unit}"
    return f"{seconds} s"


def _span(since: float, until: float) -> str:
    def fmt(at: float) -> str:
        return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")

    return f"{fmt(since)} to {fmt(until)}"


if __name__ == "__main__":
    sys.exit(main())
