"""Celery's own ``t/integration/test_tasks.py``, run against the objq kombu transport.

The suite comes from the sdist of the installed Celery (downloaded once into ``.upstream/``)
and runs in a subprocess with Celery's pytest settings; see ``celery_upstream.py``. Results
go to a redis-server started here (objq has no result backend yet); the broker is objq.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.celery_suite.celery_upstream import RUN_TIMEOUT_SECONDS, prepare_suite, run_suite
from tests.support.servers import RedisServer, start_redis


@pytest.fixture(scope="module")
def suite_root() -> Path:
    return prepare_suite()


@pytest.fixture(scope="module")
def result_backend() -> Iterator[RedisServer]:
    try:
        server = start_redis()
    except RuntimeError as exc:  # a backend that cannot start fails the test, never skips it
        pytest.fail(f"redis-server for Celery's results did not start: {exc}", pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_SECONDS + 60)
def test_celery_task_suite_passes_on_objq(
    suite_root: Path, result_backend: RedisServer, tmp_path: Path
) -> None:
    # Given Celery's task tests, with TEST_BROKER an objq store in a directory
    broker_url = f"objq+{(tmp_path / 'store').as_uri()}"
    # When they run against a worker inside the suite's process
    run = run_suite(suite_root, broker_url, result_backend, tmp_path / "report.json")
    print(run.summary())

    # Then every test ran and passed; the only ones left out are listed with their reasons
    assert run.report, f"the suite wrote no report:\n{run.output[-5000:]}"
    assert not run.report["unmatched_deselects"], run.summary()
    # A floor that catches a run that silently collected little (Celery 5.4's module has 32
    # tests, 5.7's 63).
    assert run.report["counts"].get("passed", 0) >= 20, run.summary()
    assert run.ok, f"{run.summary()}\n\n{run.output[-20000:]}"
