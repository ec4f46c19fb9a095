"""One rule for a missing ``file://`` directory, whoever opens it: the commands that add jobs,
the Python API, Dramatiq and Celery create it when its parent exists, and all refuse it, with the
same message naming the missing folder, when its parent is missing too (a mistyped path).
Commands that only read or change what is stored never create it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from objq_broker import Queue
from objq_broker.errors import BucketNotFound
from tests.cli.objq_cli import Objq, one_line_error


def _queue(url: str) -> None:
    Queue(url).close()


def _dramatiq(url: str) -> None:
    pytest.importorskip("dramatiq")
    from objq_broker.dramatiq import ObjqBroker

    ObjqBroker(url=url).close()


def _celery(url: str) -> None:
    kombu = pytest.importorskip("kombu")
    import objq_broker.kombu  # noqa: F401  (registers the objq+ transport alias)

    with kombu.Connection(f"objq+{url}") as connection:
        connection.connect()


#: Every Python entry point that opens a store from a URL.
OPENERS: dict[str, Callable[[str], None]] = {
    "Queue": _queue,
    "dramatiq": _dramatiq,
    "celery": _celery,
}
#: Commands that add to the store, so may create it.
CREATING_COMMANDS = [
    ["declare", "q"],
    ["enqueue", "q", "x"],
    ["worker", "--queue", "q", "--burst", "--declare"],
    ["demo", "--jobs", "20"],
]


@pytest.mark.parametrize("opener", sorted(OPENERS))
def test_python_entry_points_create_a_directory_in_an_existing_parent(
    tmp_path: Path, opener: str
) -> None:
    OPENERS[opener]((tmp_path / "new").as_uri())

    assert (tmp_path / "new").is_dir()


@pytest.mark.parametrize("args", CREATING_COMMANDS, ids=lambda args: args[0])
def test_commands_create_a_directory_in_an_existing_parent(
    objq: Objq, tmp_path: Path, args: list[str]
) -> None:
    url = (tmp_path / "new").as_uri()

    result = objq(*args, "--url", url, url=None)

    assert result.code == 0, result.stderr
    assert (tmp_path / "new").is_dir()


def test_a_missing_parent_is_refused_alike_everywhere(objq: Objq, tmp_path: Path) -> None:
    # Given a URL whose directory and parent directory are both missing (a typo in the path)
    url = (tmp_path / "typo" / "objq").as_uri()
    expected = (
        f"file store '{tmp_path / 'typo' / 'objq'}': expected an existing directory, or one to "
        f"create in an existing directory; found no directory '{tmp_path / 'typo'}'"
    )

    # When the Python API, Dramatiq and Celery open it, Then each refuses it with one message
    for name, opener in OPENERS.items():
        with pytest.raises(BucketNotFound) as refused:
            opener(url)
        assert str(refused.value).startswith(expected), (name, refused.value)

    # And every command that could create it refuses it with that same message
    for args in CREATING_COMMANDS:
        one_line_error(objq(*args, "--url", url, url=None), 1, f"objq: {expected}")

    # And nothing was created on the way
    assert not (tmp_path / "typo").exists()


@pytest.mark.parametrize(
    "args",
    [["status"], ["jobs", "list", "q"], ["purge", "q", "--yes"], ["requeue-stale"]],
    ids=lambda args: args[0],
)
def test_reading_commands_never_create_a_directory(
    objq: Objq, tmp_path: Path, args: list[str]
) -> None:
    url = (tmp_path / "new").as_uri()

    result = objq(*args, url=url)

    one_line_error(result, 1, f"'{tmp_path / 'new'}'", "expected an existing directory")
    assert not (tmp_path / "new").exists()
