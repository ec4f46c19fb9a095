"""Compare-and-set holds across processes: concurrent read-increment-CAS loops lose nothing.

Four spawned processes each open the store from its URL and increment one counter 50 times,
retrying every lost race. If two writers could ever win from the same version, an increment
would be lost and the final value would fall short of 200 (or a value would be written twice).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.queues
import queue
from collections.abc import Callable
from pathlib import Path

import pytest

from objq_broker.storage import open_store
from tests.storage import race_worker
from tests.storage.race_worker import Report

PROCESSES = 4
INCREMENTS = 50
#: Seconds to wait for all children; the loops take a few seconds on every backend here.
RACE_TIMEOUT_SECONDS = 240.0


@pytest.mark.slow
@pytest.mark.parametrize("race_backend", ["file", "s3", "seaweedfs", "gs"])
def test_cas_counter_survives_racing_processes(
    race_backend: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    # Given a counter at 0 on a store every child can open by URL
    if race_backend == "file":
        url = tmp_path.as_uri()
    else:
        factory_name = {
            "s3": "s3_url_factory",
            "seaweedfs": "seaweedfs_url_factory",
            "gs": "gcs_url_factory",
        }[race_backend]
        factory: Callable[[], str] = request.getfixturevalue(factory_name)
        url = factory()
    store = open_store(url)
    store.write(race_worker.COUNTER_KEY, b"0", if_absent=True)

    # When four processes increment it 50 times each, all starting once all are ready
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(PROCESSES)
    reports: multiprocessing.queues.Queue[Report] = context.Queue()
    children = [
        context.Process(
            target=race_worker.run_increments,
            args=(url, INCREMENTS, start, reports),
            name=f"objq-race-{n}",
        )
        for n in range(PROCESSES)
    ]
    for child in children:
        child.start()
    try:
        results: list[Report] = []
        for _ in children:
            try:
                results.append(reports.get(timeout=RACE_TIMEOUT_SECONDS))
            except queue.Empty:
                pytest.fail(f"{race_backend}: a child did not report in {RACE_TIMEOUT_SECONDS} s")
    finally:
        for child in children:
            child.join(timeout=10)
            if child.is_alive():  # only the processes this test started
                child.kill()
                child.join(timeout=10)
        reports.close()
        reports.join_thread()

    # Then every process made exactly its 50 increments, each value was written exactly once,
    # and the counter reads 200
    errors = [r.error for r in results if r.error]
    assert not errors, "\n".join(errors)
    assert sorted(len(r.written) for r in results) == [INCREMENTS] * PROCESSES
    written = sorted(value for r in results for value in r.written)
    assert written == list(range(1, PROCESSES * INCREMENTS + 1))
    assert store.get(race_worker.COUNTER_KEY) == str(PROCESSES * INCREMENTS).encode()
    assert all(child.exitcode == 0 for child in children)
    store.close()
