"""A Spark session built as a user builds one (``SparkSession.builder...getOrCreate()``, not
:func:`objq_broker.spark.local_session`), in a process of its own, for the test that
``register`` alone makes filtered reads work there.

``python -m tests.spark.plain_session_app URL`` reads the jobs of queue ``a`` from the store at
``URL`` and prints one JSON line: the pushdown setting before and after ``register``, the
pushed filters Spark reports, and the ids read.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys

from pyspark.sql import SparkSession

from objq_broker.spark import register
from objq_broker.spark.source import PUSHDOWN_CONF


def main(url: str) -> None:
    spark = (
        SparkSession.builder.master("local[1]")
        .appName("objq-plain-session")
        .config("spark.ui.enabled", "false")
        # Only to start the JVM faster; nothing the source needs.
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
        .getOrCreate()
    )
    try:
        before = spark.conf.get(PUSHDOWN_CONF)
        register(spark)
        after = spark.conf.get(PUSHDOWN_CONF)
        jobs = spark.read.format("objq").option("url", url).option("table", "jobs").load()
        chosen = jobs.where("queue = 'a'")
        plan = io.StringIO()
        with contextlib.redirect_stdout(plan):
            chosen.explain("formatted")
        pushed = [line for line in plan.getvalue().splitlines() if "PushedFilters" in line]
        ids = [row.id for row in chosen.collect()]
    finally:
        spark.stop()
    print(json.dumps({"before": before, "after": after, "pushed": pushed, "ids": ids}))


if __name__ == "__main__":
    main(sys.argv[1])
