"""Fixtures of the ``objq`` command tests: stores to run it against, and its workers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cli.objq_cli import Objq, Workers, run_objq
from tests.support.processes import Children


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
def workers(children: Children) -> Callable[[str], Workers]:
    """``workers(url)``: a group of ``objq worker`` processes on ``url``, stopped at the end."""

    def make(url: str) -> Workers:
        return Workers(url, children)

    return make
