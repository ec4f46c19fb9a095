"""Real `celery worker` processes running the example app on objq.

Each run sends a mix of the app's tasks (plain, countdown and ETA, autoretry and ``self.retry``,
priorities 0, 5 and 9, rejected ones) from a producer process, kills one worker with SIGKILL while
it holds prefetched, running and countdown messages (the app acks late), starts a replacement,
and then checks that every task ran at least once, that nothing ran that was not sent, and that
the broker's queue is empty, with exactly the rejected tasks among its dead letters.

Sizes, chosen to keep this file near two minutes on two cores: 3,000 tasks on ``file://`` with
the prefork pool (the full proof), 600 on S3 (moto) with the threads pool (every commit is an
HTTP round trip, and this covers the other pool and store without repeating the big run).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from objq_broker import Queue

ROOT = Path(__file__).resolve().parents[2]
#: Celery's default queue, which every task of the app goes to.
APP_QUEUE = "celery"
DOOMED_TASK = "integrations.celery_app.tasks.doomed"
#: How long a worker may take for a warm shutdown after SIGTERM.
STOP_TIMEOUT_SECONDS = 30


@dataclass(frozen=True)
class Mix:
    """How many of each task one run sends."""

    add: int
    remind: int
    flaky: int
    retried: int
    urgent: int
    doomed: int

    @property
    def total(self) -> int:
        return self.add + self.remind + self.flaky + self.retried + self.urgent + self.doomed

    def expected_lines(self) -> set[str]:
        return (
            {f"add {n} 1 {n + 1}" for n in range(self.add)}
            | {f"remind {n}" for n in range(self.remind)}
            | {f"flaky {n}" for n in range(self.flaky)}
            | {f"retried {n} after 2" for n in range(self.retried)}
            | {f"urgent {n}" for n in range(self.urgent)}
        )


FULL = Mix(add=2200, remind=300, flaky=200, retried=150, urgent=100, doomed=50)
SMALL = Mix(add=400, remind=80, flaky=40, retried=30, urgent=30, doomed=20)


def store_url(broker_url: str) -> str:
    """The objq store behind an ``objq+<store URL>`` broker URL."""
    scheme, _, rest = broker_url.partition("+")
    assert scheme == "objq", f"expected an objq+... broker URL, found {broker_url!r}"
    return rest


def _env(broker_url: str, results: Path, visibility_timeout: float) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        CELERY_BROKER_URL=broker_url,
        CELERY_VISIBILITY_TIMEOUT=str(visibility_timeout),
        APP_RESULTS_DIR=str(results),
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p),
    )
    return env


def _start_worker(
    env: dict[str, str], name: str, logs: Path, *, pool: str, concurrency: int
) -> subprocess.Popen[bytes]:
    command = [
        sys.executable, "-m", "celery", "-A", "integrations.celery_app", "worker",
        "--pool", pool, "--concurrency", str(concurrency),
        "--hostname", f"{name}@%h", "--loglevel", "WARNING",
        # Gossip, mingle and event heartbeats are cluster chatter this test does not use.
        "--without-gossip", "--without-mingle", "--without-heartbeat",
    ]  # fmt: skip
    logs.mkdir(parents=True, exist_ok=True)
    with (logs / f"{name}.log").open("ab") as log:
        return subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            start_new_session=True,  # one process group: SIGKILL reaches the pool's children
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def _kill(worker: subprocess.Popen[bytes]) -> None:
    """SIGKILL the worker and its pool's children at once, as a crashed host would."""
    if worker.poll() is None:
        os.killpg(worker.pid, signal.SIGKILL)
    worker.wait(timeout=30)


def _stop(*workers: subprocess.Popen[bytes] | None) -> None:
    """Warm shutdown: SIGTERM to each main process only (it stops its own pool). A worker that
    does not exit in time is killed, and the test fails."""
    running = [w for w in workers if w is not None and w.poll() is None]
    for worker in running:
        worker.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
    stuck = []
    for worker in running:
        try:
            worker.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _kill(worker)
            stuck.append(worker.pid)
    assert not stuck, f"workers {stuck} ignored SIGTERM for {STOP_TIMEOUT_SECONDS} s"


def _lines(results: Path) -> Counter[str]:
    return Counter(
        line for log in results.glob("*.log") for line in log.read_text().splitlines() if line
    )


def _send(env: dict[str, str], mix: Mix) -> None:
    """Send the mix from a producer process, 8 threads sharing Celery's producer pool."""
    script = f"""
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
import integrations.celery_app as app

def send(n):
    if n < {mix.add}:
        app.add.apply_async((n, 1), priority=0 if n % 2 else None)
    if n < {mix.remind}:
        countdown = 0.5 + (n % 10) / 10
        due = time.time() + countdown
        if n % 2:
            app.remind.apply_async((n, due), countdown=countdown)
        else:
            eta = datetime.fromtimestamp(due, tz=timezone.utc)
            app.remind.apply_async((n, due), eta=eta)
    if n < {mix.flaky}:
        app.flaky.delay(n)
    if n < {mix.retried}:
        app.retried.delay(n)
    if n < {mix.urgent}:
        app.urgent.delay(n)
    if n < {mix.doomed}:
        app.doomed.delay(n)

with ThreadPoolExecutor(8) as pool:
    list(pool.map(send, range({mix.add})))
"""
    subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, check=True, timeout=300)


def _wait_for(
    lines: set[str], results: Path, workers: list[subprocess.Popen[bytes]], timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if lines <= set(_lines(results)):
            return
        dead = [w.args for w in workers if w.poll() is not None]
        assert not dead, f"a worker exited on its own: {dead}"
        time.sleep(0.25)
    missing = lines - set(_lines(results))
    raise AssertionError(
        f"{len(missing)} of {len(lines)} tasks never ran within {timeout} s, "
        f"e.g. {sorted(missing)[:5]}"
    )


def _wait_empty(url: str, timeout: float) -> list[str]:
    """Wait until the app's queue holds nothing ready, delayed or in flight; its dead letters."""
    deadline = time.monotonic() + timeout
    with Queue(url) as queue:
        while True:
            stats = queue.stats(APP_QUEUE)
            if stats.ready + stats.delayed + stats.in_flight == 0:
                return [job.payload.decode() for job in queue.dead_letters(APP_QUEUE)]
            if time.monotonic() > deadline:
                raise AssertionError(f"queue {APP_QUEUE!r} still busy after {timeout} s: {stats}")
            time.sleep(0.25)


def _doomed_numbers(dead_payloads: list[str]) -> Counter[int]:
    """Which ``doomed(n)`` tasks the dead letters hold (Celery's message headers say)."""
    found: Counter[int] = Counter()
    for payload in dead_payloads:
        message = json.loads(payload)
        headers = message["headers"]
        assert headers["task"] == DOOMED_TASK, f"unexpected dead letter: {headers['task']}"
        found[int(headers["argsrepr"].strip("(),"))] += 1
    return found


def run_app(
    broker_url: str, tmp_path: Path, mix: Mix, *, pool: str, concurrency: int,
    visibility_timeout: float,
) -> None:  # fmt: skip
    results, logs = tmp_path / "results", tmp_path / "logs"
    env = _env(broker_url, results, visibility_timeout)
    start = lambda name: _start_worker(env, name, logs, pool=pool, concurrency=concurrency)  # noqa: E731
    first, second = start("first"), start("second")
    replacement = None
    started = time.monotonic()
    try:
        # Given two workers and a mix of tasks sent by a producer
        _send(env, mix)
        sent = time.monotonic()
        # When one worker is killed mid-run (it holds prefetched, running and countdown
        # messages) and a replacement starts
        deadline = time.monotonic() + 120
        while sum(_lines(results).values()) < mix.total // 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        _kill(first)
        killed = time.monotonic()
        replacement = start("replacement")
        # Then every task runs at least once
        expected = mix.expected_lines()
        _wait_for(expected, results, [second, replacement], timeout=240)
        ran = time.monotonic()
        dead = _wait_empty(store_url(broker_url), timeout=60)
    finally:
        _stop(first, second, replacement)

    seen = _lines(results)
    early = sorted(line for line in seen if line.startswith("remind-early"))
    assert not early, f"countdown tasks ran before their time: {early[:5]}"
    assert set(seen) == expected, f"unexpected lines: {sorted(set(seen) - expected)[:5]}"
    # ... and the dead letters are the rejected tasks, each at least once, nothing else
    doomed = _doomed_numbers(dead)
    assert set(doomed) == set(range(mix.doomed)), sorted(doomed)
    duplicates = sum(n - 1 for n in seen.values())
    store = broker_url.split(":", maxsplit=1)[0]
    print(
        f"\n{store} {pool}: {mix.total} tasks, {duplicates} ran more than once, "
        f"{len(dead)} dead letters ({sum(doomed.values()) - mix.doomed} duplicates); "
        f"sent in {sent - started:.1f} s, killed at {killed - started:.1f} s, "
        f"all ran at {ran - started:.1f} s"
    )


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_prefork_workers_on_file_with_a_killed_worker(tmp_path: Path) -> None:
    broker_url = f"objq+{(tmp_path / 'store').as_uri()}"
    run_app(broker_url, tmp_path, FULL, pool="prefork", concurrency=2, visibility_timeout=5.0)


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_threads_workers_on_s3_with_a_killed_worker(
    tmp_path: Path, s3_url_factory: Callable[[], str]
) -> None:
    # S3 commits are slower than a local disk's: a longer timeout keeps heartbeats ahead of it.
    broker_url = f"objq+{s3_url_factory()}"
    run_app(broker_url, tmp_path, SMALL, pool="threads", concurrency=8, visibility_timeout=10.0)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_long_task_is_not_redelivered_while_its_worker_lives(tmp_path: Path) -> None:
    broker_url = f"objq+{(tmp_path / 'store').as_uri()}"
    results, logs = tmp_path / "results", tmp_path / "logs"
    visibility_timeout = 1.0
    env = _env(broker_url, results, visibility_timeout)
    # Given two idle workers, so a redelivered message would find a taker at once
    workers = [
        _start_worker(env, name, logs, pool="threads", concurrency=2) for name in ("one", "two")
    ]
    try:
        # When a task runs for 3.5 x the visibility timeout
        script = "import integrations.celery_app as app; app.long_task.delay(1, 3.5)"
        subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, check=True, timeout=60)
        _wait_for({"long-end 1"}, results, workers, timeout=60)
        _wait_empty(store_url(broker_url), timeout=30)
        time.sleep(2 * visibility_timeout)  # time for a wrongly expired lease to be redelivered
    finally:
        _stop(*workers)
    # Then it ran exactly once
    seen = _lines(results)
    assert seen["long-start 1"] == 1, seen
    assert seen["long-end 1"] == 1, seen
