"""Real Celery workers with objq as both broker and result backend: nothing else to run.

One run sends 2,000 tasks of ``integrations.celery_results_app`` (800 single tasks, a group of
100, a chord of 1,000 with its callback, a chain of 99), kills one of the two workers with
SIGKILL mid-run (the app acks late, so its tasks run again elsewhere), starts a replacement,
and then reads every result back. The chord's callback must have run exactly once, though
header tasks may have run twice. On a directory, and on SeaweedFS (a real S3 server).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from celery import Celery, chain, chord, group

import objq_broker.kombu  # noqa: F401  (registers the objq+... URLs)

ROOT = Path(__file__).resolve().parents[2]
APP = "integrations.celery_results_app"
SINGLE, GROUP, HEADER, CHAIN = 800, 100, 1000, 99
#: Seconds a killed worker's tasks stay invisible before another worker gets them.
VISIBILITY_TIMEOUT = 5


def _start_worker(env: dict[str, str], name: str, logs: Path) -> subprocess.Popen[bytes]:
    command = [
        sys.executable, "-m", "celery", "-A", APP, "worker", "--pool", "prefork",
        "--concurrency", "2", "--hostname", f"{name}@%h", "--loglevel", "WARNING",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
    ]  # fmt: skip
    logs.mkdir(parents=True, exist_ok=True)
    with (logs / f"{name}.log").open("ab") as log:
        return subprocess.Popen(
            command, cwd=ROOT, env=env, start_new_session=True, stdout=log, stderr=log
        )


def _kill(worker: subprocess.Popen[bytes]) -> None:
    """SIGKILL a worker and its pool at once, as a crashed host would."""
    if worker.poll() is None:
        os.killpg(worker.pid, signal.SIGKILL)
    worker.wait(timeout=30)


def _lines(folder: Path) -> list[str]:
    return [line for log in folder.glob("*.log") for line in log.read_text().splitlines() if line]


def _wait_for_lines(folder: Path, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while len(_lines(folder)) < count:
        assert time.monotonic() < deadline, f"fewer than {count} tasks ran in {timeout} s"
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("where", ["file", "seaweedfs"])
def test_every_result_comes_back_and_a_chord_completes_once_across_a_killed_worker(
    where: str, tmp_path: Path, store_url_factory: Callable[[str], str]
) -> None:
    broker, backend = f"objq+{store_url_factory(where)}", f"objq+{store_url_factory(where)}"
    ran = tmp_path / "ran"
    env = dict(os.environ)
    env.update(
        CELERY_BROKER_URL=broker,
        CELERY_RESULT_BACKEND=backend,
        CELERY_VISIBILITY_TIMEOUT=str(VISIBILITY_TIMEOUT),
        APP_RESULTS_DIR=str(ran),
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p),
    )
    app = Celery("producer", broker=broker, backend=backend)

    def add(*args: int) -> Any:
        return app.signature(f"{APP}.add", args=args)

    workers = [_start_worker(env, name, tmp_path / "logs") for name in ("w1", "w2")]
    try:
        # Given 2,000 tasks sent while two workers run
        singles = [app.send_task(f"{APP}.add", (n, 1)) for n in range(SINGLE)]
        grouped = group(add(n, 2) for n in range(GROUP)).apply_async()
        chorded = chord([add(n, 1) for n in range(HEADER)], app.signature(f"{APP}.total"))()
        chained = chain(add(0, 1), *[add(1) for _ in range(CHAIN - 1)]).apply_async()
        # When one worker is killed mid-run, and a replacement started
        _wait_for_lines(ran, 400, timeout=180)
        _kill(workers[0])
        workers.append(_start_worker(env, "w3", tmp_path / "logs"))
        # Then every result comes back
        assert [r.get(timeout=300) for r in singles] == [n + 1 for n in range(SINGLE)]
        assert grouped.get(timeout=300) == [n + 2 for n in range(GROUP)]
        assert chained.get(timeout=300) == CHAIN
        assert chorded.get(timeout=300) == sum(n + 1 for n in range(HEADER))
    finally:
        for worker in workers:
            _kill(worker)
        # The producer's connections hold the broker's engine: closed now, not by a process
        # that outlives the storage server
        app.pool.force_close_all()
    # And the chord's callback ran exactly once, after every header task ran at least once
    lines = _lines(ran)
    assert [line for line in lines if line.startswith("total")] == [
        f"total {HEADER} {sum(n + 1 for n in range(HEADER))}"
    ]
    header = {f"add {n} 1" for n in range(HEADER)}
    assert header <= set(lines)
