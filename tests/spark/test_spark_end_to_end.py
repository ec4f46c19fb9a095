"""A DataFrame enqueued in one commit, drained by real Dramatiq workers, then reported on.

The 100,000-row version of this run is ``benchmarks/spark_throughput.py --e2e 100000``
(minutes on two cores); here it runs with 5,000 rows.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from objq_broker import Queue
from objq_broker.report import main as report_main
from tests.support.processes import Children
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
ROWS = 5000
#: Seconds a worker may take for a warm shutdown after SIGTERM.
STOP_GRACE_SECONDS = 60.0


def _start_worker(children: Children, url: str, results: Path) -> subprocess.Popen[bytes]:
    """A ``dramatiq`` worker running the example app on ``url``."""
    env = dict(os.environ, OBJQ_URL=url, APP_RESULTS_DIR=str(results), PYTHONPATH=str(ROOT))
    command = [
        sys.executable, "-m", "dramatiq", "integrations.dramatiq_app",
        "--processes", "1", "--threads", "8",
    ]  # fmt: skip
    # Its own process group: a signal reaches the worker processes Dramatiq forks.
    return children.start(command, env=env, cwd=ROOT, quiet=True, group=True)


def _wait_drained(url: str, queue_name: str, timeout: float) -> None:
    with Queue(url) as queue:

        def drained() -> bool:
            stats = queue.stats(queue_name)
            return stats.ready + stats.delayed + stats.in_flight == 0

        wait_for(
            drained,
            timeout,
            f"queue {queue_name!r} to drain",
            interval=0.5,
            progress=lambda: queue.stats(queue_name),
        )


@pytest.mark.slow
def test_dataframe_to_dramatiq_workers_to_report(
    spark: Any, tmp_path: Path, children: Children
) -> None:
    url = (tmp_path / "store").as_uri()
    results = tmp_path / "results"
    for _ in range(2):
        _start_worker(children, url, results)
    # Given a DataFrame of arguments for the app's `add` actor
    df = spark.range(0, ROWS, numPartitions=4).selectExpr("id as x", "1 as y")
    # When it is enqueued as Dramatiq messages, in one commit
    (
        df.write.format("objq")
        .option("url", url)
        .option("queue", "default")
        .option("dramatiq_actor", "add")
        .option("args_columns", "x,y")
        .mode("append")
        .save()
    )
    # Then the workers run every message
    _wait_drained(url, "default", timeout=240)
    stuck = [worker.pid for worker in children.stop_all(STOP_GRACE_SECONDS)]
    assert not stuck, f"workers {stuck} ignored SIGTERM for {STOP_GRACE_SECONDS:g} s"
    lines = [line for log in results.glob("*.log") for line in log.read_text().splitlines() if line]
    assert set(lines) == {f"add {x} 1 {x + 1}" for x in range(ROWS)}
    # And the report counts each finished job once
    out = tmp_path / "report"
    assert report_main(["--url", url, "--since", "1h", "--out", str(out)]) == 0
    with open(out / "tasks.csv", newline="") as table:
        tasks = list(csv.DictReader(table))
    assert [(t["queue"], t["task"], t["jobs"], t["dead"]) for t in tasks] == [
        ("default", "add", str(ROWS), "0")
    ]
    for name in ("buckets.parquet", "throughput.png", "latency.png", "failures.png"):
        assert (out / name).stat().st_size > 0
    assert "default" in (out / "index.html").read_text()
