"""objq as a PySpark data source: read jobs, dead letters and the archive as DataFrames, and
enqueue a DataFrame in one commit; in Structured Streaming, a source of finished jobs and a
sink that enqueues each micro-batch once.

The modules: :mod:`~objq_broker.spark.source` (the ``objq`` format and a local session),
:mod:`~objq_broker.spark.read`, :mod:`~objq_broker.spark.write`, :mod:`~objq_broker.spark.rows`
(payloads from columns), :mod:`~objq_broker.spark.stream_read` and
:mod:`~objq_broker.spark.stream_write` (streaming), :mod:`~objq_broker.spark.report`
(``python -m objq_broker.report``).
"""

from __future__ import annotations

from objq_broker.spark.source import (
    SCHEMA,
    DefaultSource,
    ObjqDataSource,
    local_session,
    register,
)

__all__ = ["SCHEMA", "DefaultSource", "ObjqDataSource", "local_session", "register"]
