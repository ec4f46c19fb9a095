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

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.celery_suite.celery_upstream import (
    MODULES,
    RUN_TIMEOUT_SECONDS,
    SHARDS,
    StartedRun,
    prepare_suite,
    start_suite,
)

#: Every run of every module: (module, (k, n)) for its k-th share of n.
RUNS = [(module, (k, SHARDS[module])) for module in MODULES for k in range(1, SHARDS[module] + 1)]

#: Passes (tests and subtests) each module must reach, in all its shares, so a run that
#: silently collected or ran little fails. Below the oldest Celery of the matrix, where the
#: modules are smallest; with objq's backend (tests needing a Redis backend skip themselves)
#: these passed: test_tasks 18 on 5.4, 21 on 5.5, 48 on 5.7; test_canvas 123 on 5.4 and 5.5,
#: 165 on 5.7.
PASS_FLOORS = {"t/integration/test_tasks.py": 15, "t/integration/test_canvas.py": 100}


@pytest.fixture(scope="module")
def started(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, StartedRun]]:
    """The runs of the tests selected here, started at once: their tests mostly wait
    (Celery's manager waits a second after each test for the worker's replies), so side by
    side they take about as long as the longest share, not the sum. Each test below waits
    for its own. Each run gets TEST_BROKER and TEST_BACKEND objq stores in a folder of its
    own."""
    root = prepare_suite()
    selected = {
        item.callspec.id
        for item in request.session.items
        if isinstance(item, pytest.Function)
        and item.originalname == "test_celery_suite_passes_on_objq"
    }
    runs: dict[str, StartedRun] = {}
    try:
        for module, shard in RUNS:
            if _id(module, shard) not in selected:
                continue
            folder = tmp_path_factory.mktemp(_id(module, shard))
            runs[_id(module, shard)] = start_suite(
                root,
                module,
                f"objq+{(folder / 'store').as_uri()}",
                f"objq+{(folder / 'results').as_uri()}",
                folder / "report.json",
                shard=None if shard[1] == 1 else shard,
            )
        yield runs
    finally:
        for run in runs.values():
            run.stop()  # (those whose test did not wait for them: a run stopped by -x, say)


def _id(module: str, shard: tuple[int, int]) -> str:
    return Path(module).stem + ("" if shard[1] == 1 else f"-{shard[0]}of{shard[1]}")


# One test process waits for them all (the runs are its children), while the other takes the
# rest of the selection.
@pytest.mark.slow
@pytest.mark.xdist_group("celery-upstream")
@pytest.mark.parametrize(
    ("module", "shard"),
    [
        pytest.param(
            module,
            shard,
            id=_id(module, shard),
            marks=pytest.mark.timeout(RUN_TIMEOUT_SECONDS[module] + 60),
        )
        for module, shard in RUNS
    ],
)
def test_celery_suite_passes_on_objq(
    module: str, shard: tuple[int, int], started: dict[str, StartedRun]
) -> None:
    # When one of Celery's integration modules (or a share of its tests) runs against a
    # worker inside the suite's process
    run = started[_id(module, shard)].finish()
    print(run.summary())

    # Then every test ran and passed; the only ones left out are listed with their reasons
    assert run.report, f"the suite wrote no report:\n{run.output[-5000:]}"
    assert not run.report["unmatched_deselects"], run.summary()
    assert run.report["counts"].get("passed", 0) > 0, run.summary()
    assert run.ok, f"{run.summary()}\n\n{run.output[-20000:]}"


@pytest.mark.slow
@pytest.mark.xdist_group("celery-upstream")
@pytest.mark.parametrize("module", MODULES, ids=lambda module: Path(module).stem)
def test_each_module_passed_its_floor_in_all_its_shares(
    module: str, started: dict[str, StartedRun]
) -> None:
    # (After the runs' own tests: a run that silently collected or ran little fails here.)
    ids = [_id(module, shard) for m, shard in RUNS if m == module]
    if not all(share in started for share in ids):
        pytest.skip(f"not every share of {module} was selected")
    shares = [started[share].finish() for share in ids]
    passed = sum(run.report.get("counts", {}).get("passed", 0) for run in shares)
    assert passed >= PASS_FLOORS[module], "\n".join(run.summary() for run in shares)
