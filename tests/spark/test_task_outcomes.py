"""True task outcomes from a real Celery worker, in the archive and in the report: tasks that
raise are archived as failed (not done) and a retry as retried, though Celery acked each
message before it ran, and the report's failure rate reads what happened."""

from __future__ import annotations

import csv
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from objq_broker.engine.archive import iter_archive
from objq_broker.report import main as report_main
from objq_broker.storage.url import open_store
from tests.support.outcomes_worker import ROOT, outcomes_env, outcomes_worker
from tests.support.processes import Children
from tests.support.waiting import wait_for

DIVIDED, RETRIED = 100, 5
#: Seconds a worker may take for a warm shutdown after SIGTERM.
STOP_GRACE_SECONDS = 60.0


def _outcomes(url: str) -> Counter[tuple[str, str]]:
    """(outcome, kind) of every archive record; kind: "note" or "job" (its own record)."""
    store = open_store(url)
    try:
        return Counter(
            (r.outcome, "note" if r.job.attempts == 0 else "job") for r in iter_archive(store)
        )
    finally:
        store.close()


@pytest.mark.slow
def test_a_celery_app_with_failing_tasks_reports_its_failure_rate(
    spark: Any, tmp_path: Path, children: Children
) -> None:
    url = (tmp_path / "store").as_uri()
    env = outcomes_env(url)
    command = outcomes_worker("--concurrency", "2")
    children.start(command, env=env, cwd=ROOT, quiet=True, group=True)
    # Given 100 `divide` tasks, one in ten failing, and 5 tasks that retry once
    sender = "\n".join(
        [
            "from tests.spark.celery_outcomes_app import divide, retry_once",
            f"for n in range({DIVIDED}): divide.delay(n)",
            f"for n in range({RETRIED}): retry_once.delay(n)",
        ]
    )
    subprocess.run([sys.executable, "-c", sender], env=env, cwd=ROOT, timeout=120, check=True)
    # When the worker has run them all
    expected = Counter(
        {
            ("done", "job"): DIVIDED + 2 * RETRIED,  # every message, acked when taken
            ("failed", "note"): DIVIDED // 10,
            ("retried", "note"): RETRIED,
        }
    )
    wait_for(lambda: _outcomes(url) == expected, 120, "every outcome archived",
             interval=0.5, progress=lambda: _outcomes(url))  # fmt: skip
    stuck = [worker.pid for worker in children.stop_all(STOP_GRACE_SECONDS)]
    assert not stuck, f"workers {stuck} ignored SIGTERM for {STOP_GRACE_SECONDS:g} s"
    store = open_store(url)
    errors = {r.job.error for r in iter_archive(store) if r.outcome == "failed"}
    store.close()
    assert errors == {
        f"ZeroDivisionError: {n} is a tenth: failing by design" for n in range(0, 100, 10)
    }
    # Then the report counts each task once, with the outcome it really had
    out = tmp_path / "report"
    assert report_main(["--url", url, "--since", "1h", "--out", str(out)]) == 0
    with open(out / "tasks.csv", newline="") as table:
        rows = {row["task"]: row for row in csv.DictReader(table)}
    divide, retry = rows["divide"], rows["retry_once"]
    assert (divide["jobs"], divide["done"], divide["failed"], divide["dead"]) == (
        "100",
        "90",
        "10",
        "0",
    )
    assert float(divide["failure_rate"]) == pytest.approx(0.10)
    assert (retry["jobs"], retry["done"], retry["retried"], retry["failed"]) == (
        "10",
        "5",
        "5",
        "0",
    )
    assert float(retry["failure_rate"]) == 0.0
