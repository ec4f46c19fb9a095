"""The overview in a real browser: the counts ``objq status --json`` shows, kept live."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from playwright.sync_api import Page

from objq_broker import Queue
from objq_broker.storage import open_store
from tests.cli.objq_cli import run_objq
from tests.dashboard.browsing import fill_store, needs_chromium, screenshot, serving

pytestmark = needs_chromium

#: The columns of the overview, named as in ``objq status --json``.
COUNTS = ("ready", "delayed", "in_flight", "dead")


def status(url: str) -> dict[str, Any]:
    result = run_objq("status", "--json", url=url)
    assert result.code == 0, result.stderr
    document: dict[str, Any] = result.json()
    return document


def shown_counts(page: Page) -> dict[str, dict[str, int]]:
    """The overview table's numbers, by queue and column."""
    rows: dict[str, dict[str, int]] = {}
    for row in page.locator("#queues tr[data-queue]").all():
        name = row.get_attribute("data-queue")
        assert name is not None
        rows[name] = {
            state: int(row.locator(f'[data-state="{state}"]').inner_text().replace(",", ""))
            for state in COUNTS
        }
    return rows


def test_overview_shows_the_counts_of_objq_status_and_keeps_them_live(
    page: Page, tmp_path: Path
) -> None:
    # Given a file store with jobs in every state, and what objq status --json says of it
    url = (tmp_path / "store").as_uri()
    fill_store(url)
    expected = {q["queue"]: {state: q[state] for state in COUNTS} for q in status(url)["queues"]}
    assert expected["emails"] == {"ready": 3, "delayed": 2, "in_flight": 1, "dead": 1}

    store = open_store(url)
    with serving(store, refresh_seconds=0.5) as base:
        # When the overview is opened
        page.goto(base)
        first_read = page.get_attribute("#read-at", "data-read-at")

        # Then every queue's row shows the numbers objq status shows
        assert shown_counts(page) == expected
        # And the live poll draws the charts and updates the read time
        page.wait_for_function(
            "first => document.getElementById('read-at').dataset.readAt !== first", arg=first_read
        )
        page.wait_for_selector("#depth-chart polyline", state="attached")
        page.wait_for_selector("#rate-chart polyline", state="attached")

        # When jobs arrive while the page is open
        with Queue(url, broker="off") as queue:
            queue.enqueue_many("reports", [b"monthly"] * 40)
        # Then the open page shows them without a reload, as objq status does
        page.wait_for_function(
            "() => document.querySelector('tr[data-queue=reports] [data-state=ready]')"
            ".innerText === '42'"
        )
        assert shown_counts(page)["reports"] == {
            state: q[state]
            for q in status(url)["queues"]
            if q["queue"] == "reports"
            for state in COUNTS
        }
        screenshot(page, tmp_path, "overview")
    store.close()


def test_an_empty_store_says_so(page: Page, tmp_path: Path) -> None:
    folder = tmp_path / "empty"
    folder.mkdir()
    store = open_store(folder.as_uri())
    with serving(store) as base:
        page.goto(base)
        assert "no state yet" in page.inner_text("main")
        assert page.locator("#queues").inner_text().count("No queues declared") == 1
    store.close()
