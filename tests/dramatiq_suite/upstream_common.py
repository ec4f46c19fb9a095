"""``tests/common.py`` for Dramatiq's own test suite: the names its modules import from it.

Copied into the unpacked suite by ``dramatiq_upstream.py``; edit it here.
"""

from __future__ import annotations

import os
import platform
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import dramatiq
import pika
import pytest
from dramatiq import Worker

__all__ = [
    "RABBITMQ_CREDENTIALS",
    "RABBITMQ_PASSWORD",
    "RABBITMQ_USERNAME",
    "skip_in_ci",
    "skip_on_pypy",
    "skip_on_windows",
    "skip_unless_rabbit_mq",
    "worker",
]


@contextmanager
def worker(broker: dramatiq.Broker, *args: Any, **kwargs: Any) -> Iterator[Worker]:
    """A started Worker, stopped on the way out."""
    started = Worker(broker, *args, **kwargs)
    started.start()
    try:
        yield started
    finally:
        started.stop()


def _rabbitmq_listening(host: str = "127.0.0.1", port: int = 5672) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


skip_in_ci = pytest.mark.skipif(os.getenv("CI") is not None, reason="test skipped in CI")
skip_on_windows = pytest.mark.skipif(platform.system() == "Windows", reason="not on Windows")
skip_on_pypy = pytest.mark.skipif(
    platform.python_implementation() == "PyPy", reason="time limits need CPython"
)
skip_unless_rabbit_mq = pytest.mark.skipif(
    not _rabbitmq_listening(), reason="no RabbitMQ on 127.0.0.1:5672"
)

RABBITMQ_USERNAME = os.getenv("RABBITMQ_USERNAME", "guest")
RABBITMQ_PASSWORD = os.getenv("RABBITMQ_PASSWORD", "guest")
RABBITMQ_CREDENTIALS = pika.credentials.PlainCredentials(RABBITMQ_USERNAME, RABBITMQ_PASSWORD)
