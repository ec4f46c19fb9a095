"""The pipeline's two streaming queries, and how to read what they counted."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

#: The rows that land in the inbox: the ``add`` actor's two arguments.
INBOX_SCHEMA = "x long, y long"
#: The queue the Dramatiq app's actors use.
QUEUE = "default"


def start_feed(
    spark: SparkSession, url: str, inbox: str, checkpoint: str, *, trigger: str = "1 second"
) -> Any:
    """Enqueue every row of the files that land in ``inbox`` as a message for ``add``: each
    micro-batch in one commit, once (objq's streaming sink)."""
    rows = spark.readStream.schema(INBOX_SCHEMA).json(inbox)
    return (
        rows.writeStream.format("objq")
        .queryName("objq-feed")
        .option("url", url)
        .option("queue", QUEUE)
        .option("dramatiq_actor", "add")
        .option("args_columns", "x,y")
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime=trigger)
        .start()
    )


def start_outcomes(
    spark: SparkSession,
    url: str,
    table: str,
    checkpoint: str,
    *,
    trigger: str = "1 second",
    starting: str = "earliest",
) -> Any:
    """Count the jobs that finish, per minute, task and outcome, into the Parquet ``table``.

    Each micro-batch adds its counts as a partition of its own (``batch=<id>``), overwritten
    if Spark runs the micro-batch again after a restart, so nothing is counted twice; a
    minute's total is the sum over micro-batches (:func:`per_minute`). Spark's windowed
    aggregation in append mode would write a minute only once the watermark has passed it;
    this table shows a minute's jobs within a trigger of their finishing."""
    finished = (
        spark.readStream.format("objq")
        .option("url", url)
        .option("table", "archive")
        .option("queues", QUEUE)
        .option("startingOffsets", starting)
        .load()
    )
    return (
        finished.writeStream.queryName("objq-outcomes")
        .foreachBatch(functools.partial(_count, table))
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime=trigger)
        .start()
    )


def _count(table: str, finished: DataFrame, batch_id: int) -> None:
    counts = finished.groupBy(
        F.date_trunc("minute", "finished_at").alias("minute"),
        F.coalesce("task", F.lit("(payload)")).alias("task"),
        "state",
    ).agg(F.count("*").alias("jobs"))
    counts.write.mode("overwrite").parquet(str(Path(table) / f"batch={batch_id}"))


def per_minute(spark: SparkSession, table: str) -> DataFrame:
    """The outcome table summed per minute, task and outcome (``state``: done or dead)."""
    return (
        spark.read.parquet(table)
        .groupBy("minute", "task", "state")
        .agg(F.sum("jobs").alias("jobs"))
        .orderBy("minute", "task", "state")
    )
