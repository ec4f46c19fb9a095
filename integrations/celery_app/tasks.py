"""The app's tasks: plain work, retries, countdowns, priorities, a long task, a rejection."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from celery.exceptions import Reject

from integrations.celery_app.app import app

#: How early a countdown task may start and still count as on time (clocks are one host's).
ON_TIME_SLACK_SECONDS = 0.05


class TransientError(Exception):
    """A failure that goes away when the task is tried again."""


def record(line: str) -> None:
    """Append ``line`` to this process's log in ``$APP_RESULTS_DIR``.

    One ``write`` of a short line to a file opened with ``O_APPEND`` lands whole, so threads of
    one worker and the processes of a pool can share a folder without a lock.
    """
    results = Path(os.environ.get("APP_RESULTS_DIR", "app-results"))
    results.mkdir(parents=True, exist_ok=True)
    fd = os.open(results / f"{os.getpid()}.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


@app.task
def add(x: int, y: int) -> int:
    record(f"add {x} {y} {x + y}")
    return x + y


@app.task
def remind(n: int, due: float) -> None:
    """Sent with a countdown or ETA of ``due`` (a Unix time): it must not run before then."""
    early = due - time.time()
    record(f"remind {n}" if early <= ON_TIME_SLACK_SECONDS else f"remind-early {n} {early:.3f}")


@app.task(
    bind=True,
    autoretry_for=(TransientError,),
    retry_kwargs={"max_retries": 5, "countdown": 0.2},
)
def flaky(self: Any, n: int) -> None:
    """Fails on its first attempt; Celery retries it after a countdown."""
    if self.request.retries == 0:
        raise TransientError(f"flaky {n}: the first attempt fails")
    record(f"flaky {n}")


@app.task(bind=True, max_retries=5)
def retried(self: Any, n: int) -> None:
    """Asks to be retried twice, then succeeds."""
    if self.request.retries < 2:
        raise self.retry(countdown=0.1 * (self.request.retries + 1))
    record(f"retried {n} after {self.request.retries}")


@app.task(priority=9)
def urgent(n: int) -> None:
    """Jumps the queue: priority 9 is served before the default 5 (higher first, as in AMQP)."""
    record(f"urgent {n}")


@app.task
def doomed(n: int) -> None:
    """Refuses its message for good: the broker keeps it as a dead letter."""
    raise Reject(f"doomed {n} is refused", requeue=False)


@app.task
def long_task(n: int, seconds: float) -> None:
    """Runs longer than the visibility timeout: it must not be handed to another worker."""
    record(f"long-start {n}")
    time.sleep(seconds)
    record(f"long-end {n}")
