"""Shared fixtures: real storage peers (moto's S3 server, SeaweedFS, fake-gcs-server), stores
on them, and the child processes a test starts (stopped when it ends). The helpers behind them
are in ``tests/support/``."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from objq_broker.storage import ObjectStore, open_store
from tests.support.processes import Children
from tests.support.servers import (
    gcs_endpoint,
    gcs_url_factory,
    moto_endpoint,
    s3_url_factory,
    seaweedfs_endpoint,
    seaweedfs_url_factory,
)

__all__ = [
    "gcs_endpoint",
    "gcs_url_factory",
    "moto_endpoint",
    "s3_url_factory",
    "seaweedfs_endpoint",
    "seaweedfs_url_factory",
]

#: Every backend the contract suite runs against; none is ever skipped.
#: ``seaweedfs`` is S3 too (the same adapter), on a server that enforces conditional writes itself.
BACKENDS = ["memory", "file", "s3", "seaweedfs", "gs"]

_memory_names = itertools.count()


@pytest.fixture
def store_url_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], str]:
    """Returns make(backend) -> a URL of a fresh, empty store on that backend."""
    folders = itertools.count()

    def make(backend: str) -> str:
        if backend == "memory":
            return f"memory://test-{next(_memory_names)}"
        if backend == "file":
            return (tmp_path / f"store{next(folders)}").as_uri()
        if backend == "s3":
            factory: Callable[[], str] = request.getfixturevalue("s3_url_factory")
            return factory()
        if backend == "seaweedfs":
            factory = request.getfixturevalue("seaweedfs_url_factory")
            return factory()
        if backend == "gs":
            factory = request.getfixturevalue("gcs_url_factory")
            return factory()
        raise ValueError(f"unknown backend {backend!r}")

    return make


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
def store_url(backend: str, store_url_factory: Callable[[str], str]) -> str:
    return store_url_factory(backend)


@pytest.fixture
def store(store_url: str) -> Iterator[ObjectStore]:
    opened = open_store(store_url)
    yield opened
    opened.close()


@pytest.fixture
def children() -> Iterator[Children]:
    """The test's child processes: whatever still runs at its end is stopped and reaped."""
    with Children() as started:
        yield started


#: Test folders whose tests must share one worker process when the suite runs with
#: ``pytest -n 3 --dist loadgroup`` (the README's command): one Spark session for all Spark
#: tests, and one download of each upstream suite's sdist.
_SHARED_WORKER_FOLDERS = ("spark", "kombu_suite", "celery_suite", "dramatiq_suite")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests_root = Path(__file__).parent
    for item in items:
        parts = item.path.relative_to(tests_root).parts
        if parts and parts[0] in _SHARED_WORKER_FOLDERS:
            item.add_marker(pytest.mark.xdist_group(parts[0]))


@pytest.fixture(params=["file", "s3"])
def cli_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty store for the command line: a local directory, or a new bucket on
    moto's S3 server."""
    if request.param == "file":
        return (tmp_path / "store").as_uri()
    factory: Callable[[], str] = request.getfixturevalue("s3_url_factory")
    return factory()


@pytest.fixture
def file_url(tmp_path: Path) -> str:
    """A fresh, empty local directory store."""
    return (tmp_path / "store").as_uri()
