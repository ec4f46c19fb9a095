"""Fixtures of the queue-lifecycle tests: the kombu connections of tests/integrations."""

from __future__ import annotations

from tests.integrations.conftest import connect, store_url

__all__ = ["connect", "store_url"]
