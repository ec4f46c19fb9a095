"""The workers page in a real browser: the lease holders ``objq workers`` lists, the ones whose
leases ran out marked gone, names escaped, kept live while it is open, and ``/api/workers``
with the same rows (the picture of ``docs/dashboard.md``: ``OBJQ_SCREENSHOTS=docs/dashboard``
refreshes it)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pytest
from playwright.sync_api import Locator, Page

from objq_broker import Queue
from objq_broker.storage import open_store
from tests.dashboard.browsing import get, needs_chromium, screenshot, serving

pytestmark = needs_chromium

#: A store name that reads well in the screenshot.
STORE = "memory://fleet"
#: How long ago the oldest job held was claimed.
OLDEST_CLAIM_SECONDS = 720.0


def behind(seconds: float) -> Callable[[], float]:
    """A clock ``seconds`` behind this host's: claims made with it were made that long ago."""
    return lambda: time.time() - seconds


def cell(row: Locator, field: str) -> str:
    return row.locator(f'[data-field="{field}"]').inner_text()


@pytest.fixture
def fleet() -> Iterator[Queue]:
    """Given two workers at work and one whose lease ran out: ``web-1:101:dramatiq`` holds
    two emails (one claimed 12 minutes ago) and a report, ``web-2:202`` one email, and
    ``batch-3:303:celery`` claimed a report with a 30 s lease five minutes ago and never
    renewed it. Yields a queue of the namespace."""
    url = STORE
    with (
        Queue(url, broker="off", owner="web-1:101:dramatiq") as web_1,
        Queue(url, broker="off", owner="web-2:202") as web_2,
    ):
        with Queue(
            url, broker="off", owner="web-1:101:dramatiq", clock=behind(OLDEST_CLAIM_SECONDS)
        ) as earlier:
            earlier.enqueue("emails", b"welcome 1")
            earlier.claim("emails", lease=3600)
        web_1.enqueue_many("emails", [b"welcome 2", b"welcome 3", b"welcome 4"])
        web_1.enqueue("reports", b"daily")
        web_1.claim("emails")
        web_1.claim("reports")
        web_2.claim("emails")
        with Queue(url, broker="off", owner="batch-3:303:celery", clock=behind(300)) as lost:
            lost.enqueue("reports", b"weekly")
            lost.claim("reports", lease=30)
        assert web_2.expire() == 1  # its report goes back to the queue; it is gone
        yield web_2
    store = open_store(url)
    for key in store.list():  # memory stores live as long as the process: leave it empty
        store.delete(key)
    store.close()


def test_workers_page_lists_the_holders_and_marks_the_gone(
    fleet: Queue, page: Page, tmp_path: Path
) -> None:
    store = open_store(STORE)
    with serving(store) as base:
        # When the workers page is opened from the navigation
        page.goto(base)
        page.click('header nav a[href="/workers"]')
        assert page.get_attribute('header nav a[href="/workers"]', "class") == "here"

        # Then each holder has a row, at work first, then the gone one
        rows = page.locator("#workers tr[data-owner]")
        assert [row.get_attribute("data-owner") for row in rows.all()] == [
            "web-1:101:dramatiq",
            "web-2:202",
            "batch-3:303:celery",
        ]
        assert "2 working, 1 gone" in page.inner_text("#workers-summary")
        web_1 = page.locator('#workers tr[data-owner="web-1:101:dramatiq"]')
        assert [cell(web_1, f) for f in ("host", "pid", "framework", "status")] == [
            "web-1",
            "101",
            "dramatiq",
            "working",
        ]
        assert cell(web_1, "queues") == "emails, reports"
        assert cell(web_1, "jobs-held") == "3"
        # (12 minutes and the seconds this test took: 13 once it took 30 s or more)
        assert cell(web_1, "oldest-held") in ("12 min ago", "13 min ago")
        assert cell(web_1, "last-seen").endswith(" s ago")  # the claims made just now
        web_2 = page.locator('#workers tr[data-owner="web-2:202"]')
        assert [cell(web_2, f) for f in ("framework", "queues", "jobs-held")] == [
            "-",
            "emails",
            "1",
        ]
        # And the worker whose lease ran out is marked gone, holding nothing
        gone = page.locator('#workers tr[data-owner="batch-3:303:celery"]')
        assert gone.get_attribute("class") == "worker-gone"
        assert gone.locator(".state-gone").inner_text() == "gone"
        assert [cell(gone, f) for f in ("framework", "queues", "jobs-held", "oldest-held")] == [
            "celery",
            "-",
            "0",
            "-",
        ]
        assert cell(gone, "last-seen").startswith("leases ran out ")
        # And a queue links to its jobs in flight
        web_1.locator('[data-field="queues"] a', has_text="reports").click()
        page.wait_for_url("**/queues/reports?state=in-flight")
        page.go_back()
        screenshot(page, tmp_path, "workers")

        # And /api/workers gives the rows objq workers gives, every field
        answer = json.loads(get(base + "api/workers").body)
        assert answer["workers"] == [msgspec.structs.asdict(w) for w in fleet.workers()]
        assert answer["url"] == STORE
    store.close()


def test_names_are_escaped(page: Page, tmp_path: Path) -> None:
    # Given a holder and a queue whose names are HTML
    url = (tmp_path / "store").as_uri()
    with Queue(url, broker="off", owner="<b>x</b>:1") as queue:
        queue.enqueue("<i>queue", b"job")
        queue.claim("<i>queue")
    store = open_store(url)
    with serving(store) as base:
        # When the workers page shows them
        page.goto(base + "workers")
        row = page.locator("#workers tr[data-owner]")
        # Then they are text, not markup
        assert row.get_attribute("data-owner") == "<b>x</b>:1"
        assert cell(row, "owner") == "<b>x</b>:1"
        assert cell(row, "host") == "<b>x</b>"
        assert cell(row, "queues") == "<i>queue"
        assert page.locator("#workers b, #workers i").count() == 0
        assert row.locator('[data-field="queues"] a').get_attribute("href") == (
            "/queues/%3Ci%3Equeue?state=in-flight"
        )
    store.close()


def test_no_holder_says_idle_workers_are_not_listed(page: Page, tmp_path: Path) -> None:
    # Given jobs that nobody holds
    url = (tmp_path / "store").as_uri()
    with Queue(url, broker="off") as queue:
        queue.enqueue_many("emails", [b"one", b"two"])
    store = open_store(url)
    with serving(store) as base:
        page.goto(base + "workers")
        assert page.locator("#workers").is_hidden()
        assert "idle workers" in page.inner_text("#no-workers").lower()
        assert json.loads(get(base + "api/workers").body)["workers"] == []
    store.close()


def test_the_workers_page_follows_the_holders_live(page: Page, tmp_path: Path) -> None:
    # Given one worker holding a job, and the workers page open (read every half second)
    url = (tmp_path / "store").as_uri()
    with (
        Queue(url, broker="off", owner="web-1:101:dramatiq") as web_1,
        Queue(url, broker="off", owner="<b>batch</b>:7:celery") as batch,
    ):
        web_1.enqueue_many("emails", [b"one", b"two"])
        [first] = web_1.claim("emails")
        store = open_store(url)
        with serving(store, refresh_seconds=0.5) as base:
            page.goto(base + "workers")
            owners = page.locator("#workers tr[data-owner]")
            assert [row.get_attribute("data-owner") for row in owners.all()] == [
                "web-1:101:dramatiq"
            ]
            assert "1 working, 0 gone" in page.inner_text("#workers-summary")

            # When, with the page left open, the first acks and another worker claims
            web_1.ack(first)
            [second] = batch.claim("emails")

            # Then the page shows the new holder without a reload, its name as text
            row = page.locator('#workers tr[data-owner="<b>batch</b>:7:celery"]')
            row.wait_for(timeout=10_000)
            page.wait_for_function(
                "document.querySelectorAll('#workers tr[data-owner]').length === 1"
            )
            assert [cell(row, f) for f in ("host", "pid", "framework", "status")] == [
                "<b>batch</b>",
                "7",
                "celery",
                "working",
            ]
            assert cell(row, "queues") == "emails"
            assert row.locator('[data-field="queues"] a').get_attribute("href") == (
                "/queues/emails?state=in-flight"
            )
            assert cell(row, "jobs-held") == "1"
            assert cell(row, "last-seen").endswith(" s ago")
            assert page.locator("#workers b").count() == 0

            # And once nobody holds a job, it says so
            batch.ack(second)
            page.locator("#no-workers").wait_for(state="visible", timeout=10_000)
            assert page.locator("#workers").is_hidden()
            assert page.locator("#workers-summary").is_hidden()
        store.close()
