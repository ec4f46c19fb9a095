"""A namespace of 100,000 jobs: the pages show the right totals and one page of rows."""

from __future__ import annotations

import re

from playwright.sync_api import Page

from objq_broker import Queue
from objq_broker.dashboard.settings import DEFAULT_PAGE_SIZE
from objq_broker.storage import open_store
from tests.dashboard.browsing import needs_chromium, serving

pytestmark = needs_chromium

JOBS = 100_000
BATCH = 10_000


def test_a_queue_of_100000_jobs_shows_its_totals_and_one_page_of_rows(page: Page) -> None:
    # Given 100,000 jobs enqueued in batches, and 3 of them dead-lettered
    url = "memory://dashboard-100k"
    store = open_store(url)
    with Queue(store=store, broker="off") as queue:
        for start in range(0, JOBS, BATCH):
            queue.enqueue_many("bulk", [b'{"n": %d}' % n for n in range(start, start + BATCH)])
        for delivery in queue.claim("bulk", 3):
            queue.nack(delivery, error="bad row", retry=False)
        order = [
            job.id for _, job in queue.jobs("bulk", state="ready", limit=DEFAULT_PAGE_SIZE + 1)
        ]

        with serving(store) as base:
            # When the overview is opened, it shows the totals
            page.goto(base)
            row = page.locator('tr[data-queue="bulk"]')
            assert row.locator('[data-state="ready"]').inner_text() == "99,997"
            assert row.locator('[data-state="dead"]').inner_text() == "3"

            # When the queue's page is opened, it shows one page of rows in claim order
            page.goto(base + "queues/bulk")
            shown = page.locator("#jobs tr[data-job]")
            assert shown.count() == DEFAULT_PAGE_SIZE
            assert [r.get_attribute("data-job") for r in shown.all()] == order[:DEFAULT_PAGE_SIZE]
            assert page.inner_text('[data-tab="ready"] .count') == "99,997"
            assert page.inner_text('[data-tab="dead"] .count') == "3"
            pages = -(-(JOBS - 3) // DEFAULT_PAGE_SIZE)
            assert page.inner_text(".page-of") == f"page 1 of {pages:,}"
            # And the whole document holds that one page, not the queue
            assert len(re.findall(r"<tr data-job=", page.content())) == DEFAULT_PAGE_SIZE

            # The next page goes on where the first ended; the last holds the rest
            page.click("a[rel=next]")
            assert page.locator("#jobs tr[data-job]").first.get_attribute("data-job") == order[-1]
            page.click("text=last »")
            last = (JOBS - 3) - (pages - 1) * DEFAULT_PAGE_SIZE
            assert page.locator("#jobs tr[data-job]").count() == last
            assert page.inner_text(".page-of") == f"page {pages:,} of {pages:,}"
            # And the dead tab lists the 3 dead letters
            page.goto(base + "queues/bulk?state=dead")
            assert page.locator("#jobs tr[data-job]").count() == 3
    store.close()


def test_a_queues_page_shows_how_many_groups_and_the_busiest(page: Page) -> None:
    # Given a queue whose jobs name their tenants, one of them busy
    url = "memory://dashboard-groups"
    store = open_store(url)
    with Queue(store=store, broker="off") as queue:
        queue.enqueue_many("mail", [b"x"] * 40, group="big-tenant")
        for tenant in range(7):
            queue.enqueue("mail", b"y", group=f"tenant-{tenant}")
        with serving(store) as base:
            # When the queue's page is opened
            page.goto(f"{base}queues/mail")
            # Then it counts the groups and names the busiest first, at most five
            section = page.locator("#groups")
            assert section.locator("h2 .count").inner_text() == "8"
            names = section.locator("td.name").all_inner_texts()
            assert names[0] == "big-tenant" and len(names) == 5
    for key in store.list():
        store.delete(key)
