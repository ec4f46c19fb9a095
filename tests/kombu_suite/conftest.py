"""Fixtures for kombu's own integration test classes, run on the objq transport.

``connection`` is a ``kombu.Connection`` to a fresh objq store, once per backend (a local
directory, and S3 on moto's server); ``invalid_connection`` names a store that cannot be opened.
``DESELECT`` lists every upstream test left out, with the reason; an entry that matches no
collected test fails the run, so the list cannot go stale silently. ``LEFT_OUT_CLASSES`` lists
kombu's generic classes not run at all; the tests get it from the ``left_out_classes`` fixture
(a test never imports a conftest by name: another folder's may answer to ``conftest``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import kombu
import pytest

import objq_broker.kombu  # noqa: F401  (registers the "objq" transport alias)

#: Backends every connection-based upstream test runs on.
BACKENDS = ("file", "s3")
#: Short leases: a test that leaked a message would see it again quickly.
TRANSPORT_OPTIONS = {"visibility_timeout": 10, "polling_interval": 0.05}

#: "Class::test" -> why it does not run on objq (none so far: every test of the subclassed
#: classes runs). Classes of ``common.py`` left out entirely are in ``LEFT_OUT_CLASSES``.
DESELECT: dict[str, str] = {}

#: kombu's generic classes that are not subclassed for objq, with the reason.
LEFT_OUT_CLASSES: dict[str, str] = {
    "BaseFailover": (
        "failover between broker URLs; one objq store is one broker (an alternate store would "
        "hold other queues), so the transport refuses alternates with a clear error. kombu's "
        "Connection.switch() also re-parses an alternate with parse_url(), which turns any "
        "transport+URL form (objq+file://, sqla+postgresql://) into transport 'objq+file'"
    ),
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kept, dropped, matched = [], [], set()
    for item in items:
        cls = getattr(item, "cls", None)
        key = f"{cls.__name__ if cls else ''}::{getattr(item, 'originalname', item.name)}"
        if item.path.parent == Path(__file__).parent and key in DESELECT:
            dropped.append(item)
            matched.add(key)
        else:
            kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    here = [i for i in items if i.path.parent == Path(__file__).parent]
    stale = sorted(set(DESELECT) - matched)
    if here and stale and not config.getoption("keyword"):
        raise pytest.UsageError(f"kombu suite: DESELECT entries match no test: {stale}")


@pytest.fixture
def left_out_classes() -> dict[str, str]:
    """``LEFT_OUT_CLASSES``: kombu's generic classes not run on objq, with the reason."""
    return LEFT_OUT_CLASSES


@pytest.fixture(params=BACKENDS)
def objq_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "file":
        return (tmp_path / "objq").as_uri()
    make: Callable[..., str] = request.getfixturevalue("s3_url_factory")
    return make("kombu")


@pytest.fixture
def connection(objq_store_url: str) -> Iterator[kombu.Connection]:
    conn = kombu.Connection(f"objq+{objq_store_url}", transport_options=dict(TRANSPORT_OPTIONS))
    yield conn
    conn.close()


@pytest.fixture
def invalid_connection(tmp_path: Path) -> kombu.Connection:
    # A store "directory" below a regular file can never be opened.
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    return kombu.Connection(f"objq+{(blocker / 'objq').as_uri()}")
