"""The Celery app of the worker that serves two queues (``test_celery_groups``), run as
``celery -A tests.groups.across_app worker -Q a,b``: its broker comes from ``ACROSS_BROKER``,
and each ``across.quiet`` task appends how long after its sending it started to the file
``ACROSS_RECORD`` names."""

from __future__ import annotations

import os
import time

from celery import Celery

import objq_broker.kombu  # noqa: F401  (registers the objq+... URLs)

app = Celery("across", broker=os.environ["ACROSS_BROKER"])
app.conf.broker_transport_options = {"visibility_timeout": 60.0, "polling_interval": 0.1}
app.conf.task_ignore_result = True


def busy() -> None:
    time.sleep(0.001)


def quiet(sent_at: float) -> None:
    with open(os.environ["ACROSS_RECORD"], "a", encoding="utf-8") as record:
        record.write(f"{time.time() - sent_at}\n")


# (Registered by call, not as decorators: Celery's decorator is not annotated.)
app.task(name="across.busy")(busy)
app.task(name="across.quiet")(quiet)
