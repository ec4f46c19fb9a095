"""The report's time buckets follow its range: a burst of two seconds reads per second."""

from __future__ import annotations

import csv
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from objq_broker.engine.archive import archive_key
from objq_broker.model.encoding import encode_archive
from objq_broker.model.records import ArchiveRecord, Job
from objq_broker.report import main as report_main
from objq_broker.spark.report import MAX_BUCKETS, bucket_seconds
from objq_broker.storage import open_store

#: Jobs finished in the first and in the second second of the burst.
FIRST, SECOND = 150, 450


@pytest.mark.parametrize(
    ("span", "size"),
    [(2, 1), (60, 1), (200, 1), (201, 2), (3600, 30), (86400, 600), (7 * 86400, 3600)],
)
def test_the_bucket_size_gives_at_most_a_few_hundred_points(span: float, size: int) -> None:
    assert bucket_seconds(1000.0, 1000.0 + span) == size
    assert span / size <= MAX_BUCKETS


def _burst(url: str, start: float) -> None:
    """FIRST jobs finished evenly in [start, start + 1), SECOND in [start + 1, start + 2)."""
    finished = [start + i / FIRST for i in range(FIRST)]
    finished += [start + 1 + i / SECOND for i in range(SECOND)]
    records = [
        ArchiveRecord(
            "done",
            "burst",
            Job(
                id=f"job-{n}",
                queue="q",
                body="x",
                seq=n,
                enqueued_at=at - 0.5,
                visible_at=at - 0.5,
                max_attempts=1,
                attempts=1,
                started_at=at - 0.01,
                finished_at=at,
            ),
        )
        for n, at in enumerate(finished)
    ]
    store = open_store(url)
    try:
        store.put(archive_key("burst", start + 2), encode_archive(records))
    finally:
        store.close()


def test_a_two_second_burst_reads_per_second_at_its_true_rate(spark: Any, tmp_path: Path) -> None:
    url = (tmp_path / "store").as_uri()
    start = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC).timestamp()
    _burst(url, start)
    out = tmp_path / "report"
    argv = ["--url", url, "--since", str(start), "--until", str(start + 2), "--out", str(out)]
    assert report_main(argv) == 0
    with open(out / "buckets.csv", newline="") as table:
        rows = list(csv.DictReader(table))
    assert [(r["bucket"], r["bucket_seconds"], r["jobs"]) for r in rows] == [
        ("2026-03-01 12:00:00", "1", str(FIRST)),
        ("2026-03-01 12:00:01", "1", str(SECOND)),
    ]
    assert [float(r["jobs_per_second"]) for r in rows] == [FIRST, SECOND]
    with open(out / "tasks.csv", newline="") as table:
        [task] = list(csv.DictReader(table))
    assert float(task["jobs_per_second"]) == (FIRST + SECOND) / 2
    assert "Buckets of 1 s" in (out / "index.html").read_text()
    assert (out / "throughput.png").stat().st_size > 0
