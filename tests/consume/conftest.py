"""Two handles on one namespace, as two consumer processes would have: ``queue`` (the consumer
under test) and ``other`` (another consumer or an operator), on ``memory://`` and ``file://``."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from objq_broker import Queue


@pytest.fixture(params=["memory", "file"])
def url(request: pytest.FixtureRequest, store_url_factory: Callable[[str], str]) -> str:
    return store_url_factory(request.param)


@pytest.fixture
def queue(url: str) -> Iterator[Queue]:
    with Queue(url) as opened:
        yield opened


@pytest.fixture
def other(url: str) -> Iterator[Queue]:
    """Another engine on the same store: what a second process sees and does."""
    with Queue(url) as opened:
        yield opened
