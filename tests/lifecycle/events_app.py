"""A small Celery app for the queue-lifecycle tests: its broker is ``$CELERY_BROKER_URL``
(an ``objq+...`` URL), and its throwaway queues expire after a few seconds."""

from __future__ import annotations

import os

from celery import Celery

import objq_broker.kombu  # noqa: F401  (registers the "objq" transport)

app = Celery("lifecycle", broker=os.environ["CELERY_BROKER_URL"])
app.conf.update(
    # Event receivers' queues (Flower, `celery events`) expire this long after their last use.
    event_queue_expires=float(os.environ.get("EVENT_QUEUE_EXPIRES", "2")),
    # Pidbox queues of workers and reply queues of `celery inspect` (and of Flower).
    control_queue_expires=float(os.environ.get("CONTROL_QUEUE_EXPIRES", "4")),
    worker_send_task_events=True,
    task_send_sent_event=True,
    broker_connection_retry_on_startup=True,
)


def _add(x: int, y: int) -> int:
    return x + y


add = app.task(_add, name="lifecycle.add")
