"""A Celery app whose tasks fail by design, for the true-outcomes test: ``divide`` raises for
every tenth number (Celery acks before running, its default), ``retry_once`` asks to run again
once and then succeeds."""

from __future__ import annotations

import os

from celery import Celery, Task

import objq_broker.kombu  # noqa: F401  (registers the objq+... broker URLs)

app = Celery("outcomes", broker=os.environ["CELERY_BROKER_URL"])
app.conf.update(
    task_default_queue="outcomes",
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


@app.task(name="divide")  # type: ignore[untyped-decorator]
def divide(n: int) -> float:
    if n % 10 == 0:
        raise ZeroDivisionError(f"{n} is a tenth: failing by design")
    return 1 / n


@app.task(name="retry_once", bind=True, max_retries=1, default_retry_delay=0)  # type: ignore[untyped-decorator]
def retry_once(self: Task, n: int) -> int:
    if self.request.retries == 0:
        raise self.retry(exc=RuntimeError(f"first run of {n} fails"))
    return n
