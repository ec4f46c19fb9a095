"""A small, ordinary Celery app. Its only objq-specific lines are the broker settings.

Run a worker from the repository root::

    CELERY_BROKER_URL=objq+file:///var/lib/objq celery -A integrations.celery_app worker

Each task appends a line to ``$APP_RESULTS_DIR/<pid>.log`` as its visible side effect (a real
app would write to its database), so completions can be counted across worker processes.
"""

from __future__ import annotations

from integrations.celery_app.app import app
from integrations.celery_app.tasks import (
    add,
    doomed,
    flaky,
    long_task,
    remind,
    retried,
    urgent,
)

__all__ = ["add", "app", "doomed", "flaky", "long_task", "remind", "retried", "urgent"]
