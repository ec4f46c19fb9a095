"""Celery's own integration tests (``t/integration/test_tasks.py`` and ``test_canvas.py``) with
objq as the broker and as the result backend (a redis-server of the run's own only records what
the tests' tasks did, where Celery's tests keep that in Redis).

The suite comes from the sdist of the installed Celery (downloaded once into ``.upstream/``)
and each module runs in a subprocess of its own with Celery's pytest settings; see
``celery_upstream.py``. Tests that read the Redis result backend's own state, and those that
record into Redis when no redis-server is installed, skip themselves or are left out; the ones
left out or expected to fail are listed with their reasons in ``celery_conftest.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.celery_suite.celery_upstream import (
    MODULES,
    RUN_TIMEOUT_SECONDS,
    SHARDS,
    prepare_suite,
    run_suite,
)

#: Passes (tests and subtests) each module must reach, in all its shares, so a run that
#: silently collected or ran little fails. Below the oldest Celery of the matrix, where the
#: modules are smallest; with objq's backend (tests needing a Redis backend skip themselves)
#: these passed: test_tasks 18 on 5.4, 21 on 5.5, 48 on 5.7; test_canvas 123 on 5.4 and 5.5,
#: 165 on 5.7.
PASS_FLOORS = {"t/integration/test_tasks.py": 15, "t/integration/test_canvas.py": 100}


@pytest.fixture(scope="module")
def suite_root() -> Path:
    return prepare_suite()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("module", "shard"),
    [
        pytest.param(
            module,
            (k, SHARDS[module]),
            id=Path(module).stem + ("" if SHARDS[module] == 1 else f"-{k}of{SHARDS[module]}"),
            marks=pytest.mark.timeout(RUN_TIMEOUT_SECONDS[module] + 60),
        )
        for module in MODULES
        for k in range(1, SHARDS[module] + 1)
    ],
)
def test_celery_suite_passes_on_objq(
    module: str, shard: tuple[int, int], suite_root: Path, tmp_path: Path
) -> None:
    # Given one of Celery's integration modules (or a share of its tests), with TEST_BROKER
    # and TEST_BACKEND objq stores in a directory
    broker_url = f"objq+{(tmp_path / 'store').as_uri()}"
    backend_url = f"objq+{(tmp_path / 'results').as_uri()}"
    # When it runs against a worker inside the suite's process
    report = tmp_path / "report.json"
    whole = shard[1] == 1
    run = run_suite(
        suite_root, module, broker_url, backend_url, report, shard=None if whole else shard
    )
    print(run.summary())

    # Then every test ran and passed; the only ones left out are listed with their reasons
    assert run.report, f"the suite wrote no report:\n{run.output[-5000:]}"
    assert not run.report["unmatched_deselects"], run.summary()
    floor = PASS_FLOORS[module] // shard[1]
    assert run.report["counts"].get("passed", 0) >= floor, run.summary()
    assert run.ok, f"{run.summary()}\n\n{run.output[-20000:]}"
