"""The pipeline example end to end, for a bounded time: files land in an inbox, the feed
enqueues their rows, a real Dramatiq worker runs them, and the outcome query counts them per
minute. Every row runs once and is counted once."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from integrations.spark_pipeline import per_minute, start_feed, start_outcomes
from tests.support.processes import Children
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
FILES, ROWS_PER_FILE = 3, 20
ROWS = FILES * ROWS_PER_FILE
#: Seconds a worker may take for a warm shutdown after SIGTERM.
STOP_GRACE_SECONDS = 60.0


def _ran(results: Path) -> list[str]:
    return [line for log in results.glob("*.log") for line in log.read_text().splitlines()]


def _counted(spark: Any, table: Path) -> int:
    if not any(table.glob("batch=*/*.parquet")):
        return 0
    return int(sum(row.jobs for row in per_minute(spark, str(table)).collect()))


def _healthy(*queries: Any) -> bool:
    for query in queries:
        if query.exception() is not None:
            raise AssertionError(f"query {query.name} failed: {query.exception()}")
    return True


@pytest.mark.slow
def test_files_to_jobs_to_outcomes_per_minute(
    spark: Any, tmp_path: Path, children: Children
) -> None:
    url = (tmp_path / "store").as_uri()
    inbox, table, results = tmp_path / "inbox", tmp_path / "outcomes", tmp_path / "results"
    inbox.mkdir()
    env = dict(os.environ, OBJQ_URL=url, APP_RESULTS_DIR=str(results), PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "dramatiq", "integrations.dramatiq_app",
               "--processes", "1", "--threads", "4"]  # fmt: skip
    children.start(command, env=env, cwd=ROOT, quiet=True, group=True)
    checkpoints = tmp_path / "checkpoints"
    feed = start_feed(spark, url, str(inbox), str(checkpoints / "feed"), trigger="0.5 seconds")
    outcomes = start_outcomes(
        spark, url, str(table), str(checkpoints / "out"), trigger="0.5 seconds"
    )
    try:
        # Given files landing one after another
        for index in range(FILES):
            rows = range(index * ROWS_PER_FILE, (index + 1) * ROWS_PER_FILE)
            landing = inbox / f".{index}.json"  # written whole, then renamed into sight
            landing.write_text("".join(json.dumps({"x": x, "y": 1}) + "\n" for x in rows))
            landing.rename(inbox / f"rows-{index}.json")
            wait_for(
                lambda: _healthy(feed, outcomes) and len(_ran(results)) >= len(rows) + rows[0],
                180,
                f"the rows of file {index} to run",
                interval=0.5,
            )
        # Then every row ran once, and the outcome table counts each once
        wait_for(
            lambda: _healthy(feed, outcomes) and _counted(spark, table) >= ROWS,
            120,
            "every job to be counted",
            interval=0.5,
            progress=lambda: _counted(spark, table),
        )
    finally:
        feed.stop()
        outcomes.stop()
    stuck = [worker.pid for worker in children.stop_all(STOP_GRACE_SECONDS)]
    assert not stuck, f"workers {stuck} ignored SIGTERM for {STOP_GRACE_SECONDS:g} s"
    ran = _ran(results)
    assert sorted(ran) == sorted(f"add {x} 1 {x + 1}" for x in range(ROWS))
    minutes = per_minute(spark, str(table)).collect()
    assert {(row.task, row.state) for row in minutes} == {("add", "done")}
    assert sum(row.jobs for row in minutes) == ROWS
