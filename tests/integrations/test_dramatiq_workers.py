"""Real `dramatiq` worker processes running the example app on objq."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from objq_broker import Queue

ROOT = Path(__file__).resolve().parents[2]
APP_QUEUE = "default"


def _env(url: str, results: Path, lease: float) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        OBJQ_URL=url,
        APP_RESULTS_DIR=str(results),
        OBJQ_LEASE_SECONDS=str(lease),
        PYTHONPATH=str(ROOT),
    )
    return env


def _start_worker(env: dict[str, str], threads: int = 8) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dramatiq",
            "integrations.dramatiq_app",
            "--processes",
            "1",
            "--threads",
            str(threads),
        ],
        cwd=ROOT,
        env=env,
        start_new_session=True,  # one process group: SIGKILL reaches the worker children too
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _kill(worker: subprocess.Popen[bytes], sig: int) -> None:
    os.killpg(worker.pid, sig)
    worker.wait(timeout=60)


def _lines(results: Path) -> Counter[str]:
    return Counter(
        line for log in results.glob("*.log") for line in log.read_text().splitlines() if line
    )


def _send_all(url: str, results: Path, lease: float, counts: dict[str, int]) -> None:
    """Send the app's messages from a producer process (threads share its group commits)."""
    script = f"""
import sys
from concurrent.futures import ThreadPoolExecutor
import integrations.dramatiq_app as app
def send(n):
    app.add.send(n, 1)
    if n < {counts["remind"]}:
        app.remind.send_with_options(args=(n,), delay=500 + n % 1000)
    if n < {counts["flaky"]}:
        app.flaky.send(n)
    if n < {counts["doomed"]}:
        app.doomed.send(n)
with ThreadPoolExecutor(16) as pool:
    list(pool.map(send, range({counts["add"]})))
app.add.broker.close()
"""
    subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=_env(url, results, lease),
        check=True,
        timeout=300,
    )


def _wait_drained(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with Queue(url) as queue:
        while time.monotonic() < deadline:
            # Both queues from one state: a message moving between them is never missed.
            names = (APP_QUEUE, f"{APP_QUEUE}.DQ")
            every = queue.stats_many(names)
            busy = sum(stats.ready + stats.delayed + stats.in_flight for stats in every)
            if busy == 0:
                return
            time.sleep(0.5)
    raise AssertionError(f"queue not drained within {timeout} s")


def run_app(url: str, results: Path, lease: float = 4.0) -> None:
    counts = {"add": 4000, "remind": 600, "flaky": 300, "doomed": 100}  # 5,000 messages
    env = _env(url, results, lease)
    first = _start_worker(env)
    second = _start_worker(env)
    _send_all(url, results, lease, counts)
    # Kill one worker mid-run (it holds prefetched and running messages), then replace it.
    deadline = time.monotonic() + 120
    while sum(_lines(results).values()) < 1500 and time.monotonic() < deadline:
        time.sleep(0.1)
    _kill(first, signal.SIGKILL)
    replacement = _start_worker(env)
    try:
        _wait_drained(url, timeout=240)
    finally:
        for worker in (second, replacement):
            _kill(worker, signal.SIGTERM)
    seen = _lines(results)
    expected = (
        {f"add {n} 1 {n + 1}" for n in range(counts["add"])}
        | {f"remind {n}" for n in range(counts["remind"])}
        | {f"flaky {n}" for n in range(counts["flaky"])}
    )
    missing = expected - set(seen)
    assert not missing, f"{len(missing)} messages never ran, e.g. {sorted(missing)[:5]}"
    assert set(seen) == expected  # nothing ran that was not sent
    with Queue(url) as queue:
        dead = [json.loads(job.payload) for job in queue.dead_letters(APP_QUEUE)]
        dead_errors = {job.error for job in queue.dead_letters(APP_QUEUE)}
        assert queue.dead_letters(f"{APP_QUEUE}.DQ") == []
    duplicates = sum(n - 1 for n in seen.values())
    backend = url.split(":", maxsplit=1)[0]
    print(
        f"\n{backend}: {sum(counts.values())} messages, {duplicates} ran more than once, "
        f"{len(dead)} dead letters"
    )
    # Every doomed message, and nothing else, is dead-lettered (a redelivered doomed message
    # can be dead-lettered twice: delivery is at least once).
    assert {m["actor_name"] for m in dead} == {"doomed"}
    assert {m["args"][0] for m in dead} == set(range(counts["doomed"]))
    assert all(error is not None and "ValueError" in error for error in dead_errors)


@pytest.mark.slow
def test_app_on_file_with_a_killed_worker(tmp_path: Path) -> None:
    run_app((tmp_path / "store").as_uri(), tmp_path / "results")


@pytest.mark.slow
def test_app_on_s3_with_a_killed_worker(tmp_path: Path, s3_url_factory: Callable[[], str]) -> None:
    # S3 commits are slower than a local disk's: a longer lease keeps heartbeats ahead of it.
    run_app(s3_url_factory(), tmp_path / "results", lease=10.0)


@pytest.mark.slow
def test_long_task_is_not_redelivered_while_its_worker_lives(tmp_path: Path) -> None:
    url = (tmp_path / "store").as_uri()
    results = tmp_path / "results"
    # A task 3.5 leases long. The lease leaves room for a heartbeat's round trip through the
    # elected broker (one of the two workers) on a loaded machine.
    lease = 2.0
    env = _env(url, results, lease)
    workers = [_start_worker(env, threads=2), _start_worker(env, threads=2)]
    try:
        script = (
            "import integrations.dramatiq_app as app; "
            f"app.long_task.send(1, {3.5 * lease}); app.long_task.broker.close()"
        )
        subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, check=True, timeout=60)
        _wait_drained(url, timeout=60)
    finally:
        for worker in workers:
            _kill(worker, signal.SIGTERM)
    seen = _lines(results)
    assert seen["long-start 1"] == 1, seen
    assert seen["long-end 1"] == 1
