"""A small, ordinary Dramatiq app. Its only objq-specific line is the broker.

Run a worker with ``OBJQ_URL=file:///var/lib/objq dramatiq integrations.dramatiq_app``.
Each actor appends a line to ``$APP_RESULTS_DIR/<pid>.log`` as its visible side effect (a real
app would write to its database).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import dramatiq

from objq_broker.dramatiq import ObjqBroker

dramatiq.set_broker(ObjqBroker())  # reads OBJQ_URL: the one line that names objq

RESULTS = Path(os.environ.get("APP_RESULTS_DIR", "app-results"))


def record(line: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    with open(RESULTS / f"{os.getpid()}.log", "a") as log:
        log.write(line + "\n")


@dramatiq.actor(max_retries=3, min_backoff=100, max_backoff=1000)
def add(x: int, y: int) -> None:
    record(f"add {x} {y} {x + y}")


@dramatiq.actor(max_retries=3, min_backoff=100, max_backoff=1000)
def remind(n: int) -> None:
    """Sent with a delay: it must not run before its time."""
    record(f"remind {n}")


@dramatiq.actor(max_retries=5, min_backoff=100, max_backoff=1000)
def flaky(n: int) -> None:
    """Fails on its first attempt, succeeds on a retry."""
    marker = RESULTS / f"flaky-{n}.tried"
    if not marker.exists():
        RESULTS.mkdir(parents=True, exist_ok=True)
        marker.touch()
        raise RuntimeError(f"flaky {n}: first attempt fails")
    record(f"flaky {n}")


@dramatiq.actor(max_retries=1, min_backoff=100, max_backoff=200)
def doomed(n: int) -> None:
    """Always fails: ends in the dead letters after its retries."""
    raise ValueError(f"doomed {n} always fails")


@dramatiq.actor(max_retries=0, time_limit=10 * 60 * 1000)
def long_task(n: int, seconds: float) -> None:
    """Runs longer than the lease: heartbeats must keep it from being redelivered."""
    record(f"long-start {n}")
    time.sleep(seconds)
    record(f"long-end {n}")
