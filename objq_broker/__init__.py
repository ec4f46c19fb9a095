"""objq: a job-queue broker whose whole state lives in object storage.

>>> from objq_broker import Queue
>>> with Queue("memory://readme") as q:
...     _ = q.enqueue("default", b"work")
...     [delivery] = q.claim("default")
...     q.ack(delivery)
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from objq_broker.aio import AsyncQueue
from objq_broker.errors import (
    ConfigurationError,
    JobNotFound,
    LeaseLost,
    ObjqError,
    PreconditionFailed,
    QueueNotFound,
    StateCorrupt,
)
from objq_broker.model.records import Job, QueueConfig
from objq_broker.model.values import QueueStats
from objq_broker.queue import Delivery, Queue
from objq_broker.storage import open_store

try:
    __version__ = version("objq-broker")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0"

__all__ = [
    "AsyncQueue",
    "ConfigurationError",
    "Delivery",
    "Job",
    "JobNotFound",
    "LeaseLost",
    "ObjqError",
    "PreconditionFailed",
    "Queue",
    "QueueConfig",
    "QueueNotFound",
    "QueueStats",
    "StateCorrupt",
    "__version__",
    "open_store",
]
