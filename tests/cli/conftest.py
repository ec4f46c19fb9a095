"""Fixtures of the ``objq`` command tests: stores to run it against, and its workers."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.cli.objq_cli import Objq, Workers, run_objq
from tests.support.processes import Children


@pytest.fixture
def objq() -> Objq:
    """``objq(*args, url=..., stdin=None, tty_answer=None) -> Result``."""
    return run_objq


@pytest.fixture
def workers(children: Children) -> Callable[[str], Workers]:
    """``workers(url)``: a group of ``objq worker`` processes on ``url``, stopped at the end."""

    def make(url: str) -> Workers:
        return Workers(url, children)

    return make
