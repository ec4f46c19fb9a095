"""Fixtures shared by the kombu transport's tests (``store_url`` is overridden where a test
module needs another store). kombu is imported by the fixture that needs it, so the Dramatiq
tests of this folder run where kombu is not installed (the Dramatiq tox envs)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import kombu


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return (tmp_path / "objq").as_uri()


@pytest.fixture
def connect(store_url: str) -> Iterator[Any]:
    """``connect(**transport_options)``: an open connection to ``store_url``, closed after."""
    import kombu

    import objq_broker.kombu  # noqa: F401  (registers the objq+... URLs)

    opened: list[kombu.Connection] = []

    def make(**options: Any) -> kombu.Connection:
        conn = kombu.Connection(f"objq+{store_url}", transport_options=options)
        conn.connect()
        opened.append(conn)
        return conn

    yield make
    for conn in opened:
        conn.close()
