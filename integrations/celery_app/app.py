"""The Celery application and its settings."""

from __future__ import annotations

import os

from celery import Celery

import objq_broker.kombu  # noqa: F401  (registers the objq+... broker URLs with kombu)

#: Where the broker keeps its state when ``CELERY_BROKER_URL`` is not set.
DEFAULT_BROKER_URL = "objq+file:///var/lib/objq"

app = Celery("integrations.celery_app", include=["integrations.celery_app.tasks"])
app.conf.update(
    # --- broker: the only objq-specific settings ---
    broker_url=os.environ.get("CELERY_BROKER_URL", DEFAULT_BROKER_URL),
    broker_transport_options={
        # How long a dead worker's messages stay invisible before another worker gets them;
        # a live worker keeps extending the messages it holds, so long tasks are not cut short.
        "visibility_timeout": float(os.environ.get("CELERY_VISIBILITY_TIMEOUT", "60")),
    },
    # --- ordinary Celery settings ---
    # Acknowledge after the task ran: a worker that dies mid-task leaves the message to be
    # delivered again instead of losing it. Tasks must therefore be idempotent.
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    task_ignore_result=True,  # the tasks record their effects themselves; no result backend
    task_default_priority=5,
    task_queue_max_priority=9,
    worker_hijack_root_logger=False,
)
