"""``objq check-store``: real stores pass, a real store whose conditions are dropped fails
(exit 1, the failed checks named), and a first commit through the command line refuses it."""

from __future__ import annotations

from pathlib import Path

import pytest

from objq_broker.cli import main
from objq_broker.storage import ObjectStore, open_store
from objq_broker.storage.faulty import FaultyStore
from objq_broker.storage.probe import (
    CONCURRENT_INCREMENTS,
    CREATE_OVER_EXISTING,
    STALE_VERSION,
)
from tests.cli.objq_cli import Objq, one_line_error

CHECKS = 5


def test_real_stores_pass(objq: Objq, cli_url: str, tmp_path: Path) -> None:
    if cli_url.startswith("file://"):
        Path(cli_url.removeprefix("file://")).mkdir()
    # The URL as the argument, for people
    shown = objq("check-store", cli_url, url=None)
    assert shown.code == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].startswith(f"{cli_url}: {CHECKS} checks, ")
    assert sum(line.startswith("ok ") for line in lines) == CHECKS
    assert lines[-1].startswith("ok: it enforces conditional writes")
    # As $OBJQ_URL, for scripts
    checked = objq("check-store", "--json", "--rounds", "2", url=cli_url)
    assert checked.code == 0, checked.stderr
    report = checked.json()
    assert report["passed"] is True and report["url"] == cli_url
    assert [check["name"] for check in report["checks"]][-1] == CONCURRENT_INCREMENTS
    # Nothing stays behind
    assert open_store(cli_url).list() == []


def test_the_url_once(objq: Objq, file_url: str) -> None:
    one_line_error(
        objq("check-store", file_url, "--url", "memory://other", url=None),
        2,
        "expected the store once",
    )
    one_line_error(objq("check-store", url=file_url), 1, "expected an existing directory")


def _ignoring(monkeypatch: pytest.MonkeyPatch) -> list[ObjectStore]:
    """Make the command line open its stores through a fault injector that drops every
    write's condition (the real store below it answers every request)."""
    opened: list[ObjectStore] = []

    def wrapped(url: str) -> ObjectStore:
        store = FaultyStore(open_store(url), ignore_conditions=True)
        opened.append(store.inner)
        return store

    monkeypatch.setattr("objq_broker.cli.context.open_existing", wrapped)
    monkeypatch.setattr("objq_broker.cli.context.open_store", wrapped)
    return opened


def test_a_store_ignoring_conditions_fails(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], cli_url: str
) -> None:
    opened = _ignoring(monkeypatch)
    assert main(["check-store", cli_url]) == 1
    out = capsys.readouterr().out
    failed = [line for line in out.splitlines() if line.startswith("FAILED")]
    assert [line.split("  ")[1].strip() for line in failed[:-1]] == [
        CREATE_OVER_EXISTING,
        STALE_VERSION,
    ]
    assert "expected PreconditionFailed" in failed[0]
    assert failed[-1].startswith("FAILED: it does NOT enforce conditional writes")
    assert opened[0].list() == []

    assert main(["check-store", "--json", cli_url]) == 1
    assert '"passed":false' in capsys.readouterr().out


def test_a_first_commit_refuses_a_store_ignoring_conditions(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], cli_url: str
) -> None:
    opened = _ignoring(monkeypatch)
    assert main(["enqueue", "q", "hello", "--url", cli_url]) == 2
    error = capsys.readouterr().err
    assert error.startswith("objq: error: store ")
    assert "expected a store that enforces conditional writes" in error
    assert STALE_VERSION in error and "check_conditions=false" in error
    assert opened[0].read("state.json") is None
