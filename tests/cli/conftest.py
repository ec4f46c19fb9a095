"""Fixtures of the ``objq`` command tests: stores to run it against, and its workers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from objq_cli import Objq, Workers, run_objq


@pytest.fixture
def objq() -> Objq:
    """``objq(*args, url=..., stdin=None, tty_answer=None) -> Result``."""
    return run_objq


@pytest.fixture(params=["file", "s3"])
def cli_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty store: a local directory, or a new bucket on moto's S3 server."""
    if request.param == "file":
        return (tmp_path / "store").as_uri()
    factory: Callable[[], str] = request.getfixturevalue("s3_url_factory")
    return factory()


@pytest.fixture
def file_url(tmp_path: Path) -> str:
    return (tmp_path / "store").as_uri()


@pytest.fixture
def workers(request: pytest.FixtureRequest) -> Iterator[Callable[[str], Workers]]:
    made: list[Workers] = []

    def make(url: str) -> Workers:
        made.append(Workers(url))
        return made[-1]

    yield make
    for group in made:
        group.stop_all()
