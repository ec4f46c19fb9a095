"""objq as a PySpark data source (format ``"objq"``): read jobs and history, enqueue DataFrames.

>>> from objq_broker.spark import local_session  # doctest: +SKIP
>>> spark = local_session()  # doctest: +SKIP
>>> done = (spark.read.format("objq").option("url", "s3://jobs-bucket/objq")
...         .option("table", "archive").load()
...         .where("queue = 'emails' and finished_at >= '2026-11-01'"))  # doctest: +SKIP
>>> (spark.range(1000).selectExpr("id as x", "id * 2 as y").write.format("objq")
...     .option("url", "s3://jobs-bucket/objq").option("queue", "default")
...     .option("dramatiq_actor", "add").option("args_columns", "x,y")
...     .mode("append").save())  # doctest: +SKIP

Reading: see :mod:`objq_broker.spark.read` (tables ``jobs``, ``dead``, ``archive``; filters on
``queue`` and ``finished_at`` pushed down). Writing: see :mod:`objq_broker.spark.write` (one
commit for the whole DataFrame) and :mod:`objq_broker.spark.rows` (payload or Dramatiq/Celery
messages from columns). Only ``mode("append")`` is accepted.

No JVM connector is involved: executors read and write storage with objq's own adapters, so
``s3://`` and ``gs://`` work where ``hadoop-aws`` is not installed. :func:`register` turns on
``spark.sql.python.filterPushdown.enabled`` in the session it registers into (without it,
reads work but filters are applied after reading every row). The Python workers must run the
driver's interpreter (``PYSPARK_PYTHON``).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

try:
    from pyspark.sql import SparkSession
    from pyspark.sql.datasource import CaseInsensitiveDict, DataSource
    from pyspark.sql.types import StructType
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the environment
    raise ModuleNotFoundError(
        "objq_broker.spark needs PySpark: pip install 'objq-broker[spark]'"
    ) from exc

from objq_broker.errors import ConfigurationError
from objq_broker.spark.read import (
    DEFAULT_OBJECTS_PER_PARTITION,
    DEFAULT_RUNS_PER_PARTITION,
    SCHEMA,
    TABLES,
    ObjqReader,
)
from objq_broker.spark.rows import option_int, required
from objq_broker.spark.stream_read import ObjqStreamReader, StreamOptions, check_stream_options
from objq_broker.spark.stream_write import ObjqStreamWriter
from objq_broker.spark.write import ObjqWriter, settings_from_options

__all__ = ["SCHEMA", "DefaultSource", "ObjqDataSource", "local_session", "register"]

log = logging.getLogger("objq_broker.spark")

#: The runtime SQL setting without which Spark pushes no filter into a Python data source.
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"
#: Options Spark passes to a streaming sink beside the user's (lower case, as Spark gives them).
SPARK_STREAM_OPTIONS = ("checkpointlocation", "queryname")
#: Spark settings that suit a local session (:func:`register` adds what the source needs).
SESSION_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "4",
    # The C1 compiler and a serial GC start a small local JVM in about half the time.
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
}


class ObjqDataSource(DataSource):
    """The ``objq`` format. Options: ``url`` (required), then for reading ``table``
    (jobs, dead or archive; default archive), ``objects_per_partition`` (archive) and
    ``runs_per_partition`` (jobs, dead); for streaming reads (archive only) those of
    :class:`~objq_broker.spark.stream_read.StreamOptions`; for writing, in batch or
    streaming, ``queue`` and the options of :mod:`objq_broker.spark.rows`."""

    @classmethod
    def name(cls) -> str:
        return "objq"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> ObjqReader:
        options = self.options
        where = "objq reader"
        table = str(options.get("table", "archive")).lower()
        if table not in TABLES:
            raise ConfigurationError(
                f"{where}: option 'table' must be one of {TABLES}, found {table!r}"
            )
        objects = _at_least_one(options, "objects_per_partition", DEFAULT_OBJECTS_PER_PARTITION)
        runs = _at_least_one(options, "runs_per_partition", DEFAULT_RUNS_PER_PARTITION)
        return ObjqReader(required(options, "url", where), table, objects, runs)

    def writer(self, schema: StructType, overwrite: bool) -> ObjqWriter:
        _append_only(overwrite, "mode('overwrite')", "mode('append')")
        return ObjqWriter(settings_from_options(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> ObjqStreamWriter:
        _append_only(overwrite, "outputMode('complete')", "outputMode('append')")
        return ObjqStreamWriter(settings_from_options(_users(self.options), schema))

    def streamReader(self, schema: StructType) -> ObjqStreamReader:
        options = _users(self.options)
        where = "objq stream reader"
        table = str(options.get("table", "archive")).lower()
        if table != "archive":
            raise ConfigurationError(
                f"{where}: option 'table' must be 'archive' (finished jobs arrive there; the "
                f"jobs and dead tables are read in batch), found {table!r}"
            )
        check_stream_options(options)
        objects = _at_least_one(options, "objects_per_partition", DEFAULT_OBJECTS_PER_PARTITION)
        url = required(options, "url", where)
        return ObjqStreamReader(StreamOptions.from_options(options, url, objects))


def _users(options: Mapping[str, str]) -> CaseInsensitiveDict:
    """A streaming query's options without those Spark itself passes along."""
    mine = CaseInsensitiveDict(options)
    for name in SPARK_STREAM_OPTIONS:
        mine.pop(name, None)
    return mine


def _append_only(overwrite: bool, asked: str, instead: str) -> None:
    if overwrite:
        raise ConfigurationError(
            f"objq writer: {asked} would have to drop the jobs already queued; "
            f"objq only adds jobs: use {instead}"
        )


def _at_least_one(options: Any, name: str, default: int) -> int:
    """The reader's integer option ``name`` (``default`` when absent), checked to be >= 1."""
    size = option_int(options, name, default, "objq reader")
    if size is None or size < 1:
        raise ConfigurationError(f"objq reader: {name} must be an integer >= 1, found {size}")
    return size


#: Spark finds a data source by module name through this alias: ``format("objq_broker.spark")``.
DefaultSource = ObjqDataSource


def register(spark: SparkSession) -> None:
    """Make ``format("objq")`` available in ``spark`` (registration is per session), and turn
    on filter pushdown there (:data:`PUSHDOWN_CONF`, a runtime setting of the session).

    A session that refuses the setting, or where it is turned off later, still reads the same
    rows: Spark then applies every filter itself, after the reader read everything.

    >>> from pyspark.sql import SparkSession  # doctest: +SKIP
    >>> spark = SparkSession.builder.getOrCreate()  # doctest: +SKIP
    >>> register(spark)  # doctest: +SKIP
    """
    spark.dataSource.register(ObjqDataSource)
    try:
        spark.conf.set(PUSHDOWN_CONF, "true")
    except Exception as exc:  # a platform's policy, or a Java error py4j passes on as it is
        # Reads are correct without it (slower): registering must not fail for it.
        log.warning(
            "objq: could not set %s=true (%s); reads will filter after reading every row",
            PUSHDOWN_CONF,
            exc,
        )


def local_session(
    master: str = "local[2]", app_name: str = "objq", conf: dict[str, str] | None = None
) -> Any:
    """A local Spark session set up for this source, with ``objq`` registered."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in {**SESSION_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark
