"""One local Spark session for every Spark test (starting one costs seconds)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

#: Two cores, and each task may be tried twice, so a retried attempt can be tested.
MASTER = "local[2,2]"


@pytest.fixture(scope="session")
def spark(moto_endpoint: str) -> Iterator[Any]:
    # Python workers inherit the JVM's environment, fixed when the session starts: the S3
    # server's (dummy) credentials must be in it by then.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from objq_broker.spark import local_session

    session = local_session(
        MASTER,
        app_name="objq-tests",
        # Small Arrow batches reach the writer one by one, so a row can fail a task after
        # the rows before it were staged.
        conf={"spark.sql.execution.arrow.maxRecordsPerBatch": "10"},
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
