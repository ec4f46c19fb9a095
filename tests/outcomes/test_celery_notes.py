"""Celery's failed runs noted from a prefork child that leaves right after its task: the child
submits its note without waiting for it, and waits for what it submitted as it stops, so the
archive holds every failure though each child ran one task and left with ``os._exit``."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from objq_broker.engine.archive import iter_archive
from objq_broker.storage.url import open_store
from tests.support.outcomes_worker import ROOT, outcomes_env, outcomes_worker
from tests.support.processes import Children
from tests.support.waiting import wait_for

#: Tasks sent: ``divide`` fails for every tenth number, so for all of these.
FAILING = list(range(0, 120, 10))
STOP_GRACE_SECONDS = 60.0


def _outcomes(url: str) -> Counter[str]:
    store = open_store(url)
    try:
        return Counter(r.outcome for r in iter_archive(store))
    finally:
        store.close()


@pytest.mark.slow
@pytest.mark.parametrize("broker", ["auto", "off"])
def test_children_that_leave_after_each_failed_task_archive_every_note(
    broker: str, tmp_path: Path, children: Children
) -> None:
    url = (tmp_path / "store").as_uri()
    env = outcomes_env(url, OBJQ_BROKER=broker)
    command = outcomes_worker("--concurrency", "2", "--max-tasks-per-child", "1")
    children.start(command, env=env, cwd=ROOT, quiet=True, group=True)
    # Given failing tasks, each run by a child that leaves once it ran it
    sender = "\n".join(
        [
            "from tests.spark.celery_outcomes_app import divide",
            f"for n in {FAILING!r}: divide.delay(n)",
        ]
    )
    subprocess.run([sys.executable, "-c", sender], env=env, cwd=ROOT, timeout=120, check=True)
    # Then each failure is noted: none was lost with the child that submitted it
    expected = Counter({"done": len(FAILING), "failed": len(FAILING)})
    wait_for(lambda: _outcomes(url) == expected, 120, "every failure noted",
             interval=0.5, progress=lambda: _outcomes(url))  # fmt: skip
    stuck = [worker.pid for worker in children.stop_all(STOP_GRACE_SECONDS)]
    assert not stuck, f"workers {stuck} ignored SIGTERM for {STOP_GRACE_SECONDS:g} s"
    assert _outcomes(url) == expected
