"""A Spark pipeline that runs all day on objq: files in, jobs run, outcomes counted per minute.

Three parts, each an ordinary program:

1. **feed** (a streaming query): reads the JSON files that land in an inbox folder (one
   ``{"x": ..., "y": ...}`` object per line) and enqueues each row as a Dramatiq message for the
   ``add`` actor of :mod:`integrations.dramatiq_app`, through objq's streaming sink: each
   micro-batch in one commit, once.
2. **workers**: ``dramatiq integrations.dramatiq_app`` with ``OBJQ_URL`` set, as in any
   Dramatiq deployment.
3. **outcomes** (a second streaming query): reads the jobs that finished from objq's streaming
   source (the archive) and counts them per minute, task and outcome into a Parquet table.

Run it on a folder (or ``s3://...`` with ``objq-broker[s3]``), from the repository's root::

    export OBJQ_URL=file://$PWD/objq-pipeline/store
    dramatiq integrations.dramatiq_app &
    python -m integrations.spark_pipeline --inbox objq-pipeline/inbox \
        --out objq-pipeline/outcomes
    # then drop JSON files into objq-pipeline/inbox, and read the table:
    python -c "from integrations.spark_pipeline import per_minute; \
        from objq_broker.spark import local_session; \
        per_minute(local_session(), 'objq-pipeline/outcomes').show()"

The checkpoints (under ``--out``'s ``_checkpoints`` unless ``--checkpoints`` says) let both
queries stop and start again without losing or repeating a row.
"""

from __future__ import annotations

from integrations.spark_pipeline.pipeline import (
    INBOX_SCHEMA,
    per_minute,
    start_feed,
    start_outcomes,
)

__all__ = ["INBOX_SCHEMA", "per_minute", "start_feed", "start_outcomes"]
