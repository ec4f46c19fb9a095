"""A small Celery app that uses its tasks' results, with nothing to run but its workers: the
broker and the result backend are both objq, on the same storage.

Run a worker from the repository root::

    CELERY_BROKER_URL=objq+file:///var/lib/objq \\
    CELERY_RESULT_BACKEND=objq+file:///var/lib/objq-results \\
    celery -A integrations.celery_results_app worker

Each task also appends a line to ``$APP_RESULTS_DIR/<pid>.log``, so how many times a task
really ran (a chord's callback: once) can be counted across worker processes.
"""

from __future__ import annotations

import os
from pathlib import Path

from celery import Celery

import objq_broker.kombu  # noqa: F401  (registers the objq+... broker and result backend URLs)

app = Celery("integrations.celery_results_app")
app.conf.update(
    # --- the only objq-specific settings ---
    broker_url=os.environ.get("CELERY_BROKER_URL", "objq+file:///var/lib/objq"),
    result_backend=os.environ.get("CELERY_RESULT_BACKEND", "objq+file:///var/lib/objq-results"),
    broker_transport_options={
        "visibility_timeout": float(os.environ.get("CELERY_VISIBILITY_TIMEOUT", "60")),
    },
    # --- ordinary Celery settings ---
    task_acks_late=True,  # a worker that dies mid-task leaves the task to run again
    task_reject_on_worker_lost=True,
    task_track_started=True,
    result_extended=True,
    result_expires=24 * 3600,
    worker_hijack_root_logger=False,
)


def record(line: str) -> None:
    """Append ``line`` to this process's log in ``$APP_RESULTS_DIR`` (one short write with
    ``O_APPEND`` lands whole, so a pool's processes share the folder without a lock)."""
    results = Path(os.environ.get("APP_RESULTS_DIR", "app-results"))
    results.mkdir(parents=True, exist_ok=True)
    fd = os.open(results / f"{os.getpid()}.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


@app.task
def add(x: int, y: int) -> int:
    record(f"add {x} {y}")
    return x + y


@app.task
def total(values: list[int]) -> int:
    """A chord's callback: the sum of its header's results."""
    record(f"total {len(values)} {sum(values)}")
    return sum(values)
