"""Every page of a store with some of everything, in a real browser, with a screenshot of each
(the pictures of ``docs/dashboard.md``: ``OBJQ_SCREENSHOTS=docs/dashboard`` refreshes them)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dramatiq
import pytest
from celery import Celery
from playwright.sync_api import Page
from prometheus_client.parser import text_string_to_metric_families

import objq_broker.kombu  # noqa: F401  (registers the objq+ broker URLs)
from objq_broker import Queue
from objq_broker.dramatiq import ObjqBroker
from objq_broker.storage import open_store
from tests.dashboard.browsing import TOKEN, get, log_in, needs_chromium, screenshot, serving

pytestmark = needs_chromium

#: Store names that read well in the screenshots: a new one for each test, as a process
#: that saw a namespace's state refuses to see it start again (``engine.guard``), and
#: Celery's connection pool keeps its transport's queue for the life of the process.
_stores = (f"memory://shop{'' if n == 0 else f'-{n}'}" for n in itertools.count())


@dataclass
class Shop:
    """A namespace held by an elected broker, with Dramatiq and Celery messages, dead
    letters and an archive."""

    leader: Queue
    base: str
    dramatiq_job: str
    celery_job: str
    dead_job: str


@pytest.fixture
def shop() -> Iterator[Shop]:
    STORE = next(_stores)
    store = open_store(STORE)
    # The elected broker of the namespace, and a client that commits through it.
    with Queue(store=store, broker="auto") as leader, Queue(STORE, broker="client") as client:
        leader.declare("thumbnails")  # its first commit makes it the namespace's broker
        broker = ObjqBroker(url=STORE, broker="client")

        @dramatiq.actor(broker=broker, queue_name="emails")
        def send_welcome(user_id: int, *, template: str) -> None: ...

        for user in range(1, 8):
            send_welcome.send(user, template="welcome-v2")
        broker.close()
        app = Celery("shop", broker=f"objq+{STORE}", set_as_current=False)

        for order in range(1001, 1005):
            app.signature(
                "shop.tasks.charge", args=(order, 25.5), kwargs={"currency": "USD"}
            ).apply_async(queue="payments")
        app.close()
        client.enqueue_many("reports", [b'{"report": "daily"}'] * 3, delay=3600)
        # Two payments run: one finishes, one fails for good; an email is being sent.
        done, failed = client.claim("payments", 2, owner="celery@worker-1")
        client.ack(done)
        client.nack(failed, error="CardDeclined: insufficient funds", retry=False)
        [held] = client.claim("emails", 1, owner="dramatiq@worker-2", lease=300)
        celery_job = client.jobs("payments", state="ready", limit=1)[0][1].id
        with serving(store, TOKEN, refresh_seconds=0.5) as base:
            yield Shop(leader, base, held.id, celery_job, failed.id)
    for key in store.list():  # memory stores live as long as the process: leave it empty
        store.delete(key)
    store.close()


def test_every_page_renders_what_the_store_holds(shop: Shop, page: Page, tmp_path: Path) -> None:
    base = shop.base
    # The overview, once its charts have a few samples
    page.goto(base)
    for _ in range(6):  # some work while the page polls, so the charts have lines to show
        shop.leader.enqueue_many("thumbnails", [b'{"image": "cat.png"}'] * 5)
        page.wait_for_timeout(400)
    page.wait_for_function("() => document.querySelectorAll('#depth-chart polyline').length > 0")
    shown = {
        row.get_attribute("data-queue") for row in page.locator("#queues tr[data-queue]").all()
    }
    # Dramatiq declares each queue's delay queue too
    assert shown == {"emails", "emails.DQ", "payments", "reports", "thumbnails"}
    screenshot(page, tmp_path, "overview")

    # A queue page: the ready jobs of payments, in claim order, with Celery's task names
    page.goto(base + "queues/payments")
    assert page.locator("#jobs tr[data-job]").count() == 2
    assert page.locator("#jobs td", has_text="shop.tasks.charge").count() == 2
    screenshot(page, tmp_path, "queue")

    # Job pages: a Dramatiq message in flight with its lease holder, and a Celery message
    page.goto(base + f"jobs/{shop.dramatiq_job}")
    assert page.inner_text('[data-field="task"]') == "send_welcome"
    assert page.inner_text('[data-field="lease-owner"]') == "dramatiq@worker-2"
    screenshot(page, tmp_path, "job-dramatiq")
    page.goto(base + f"jobs/{shop.celery_job}")
    assert page.inner_text('[data-field="task"]') == "shop.tasks.charge"
    screenshot(page, tmp_path, "job-celery")

    # The login page, then dead letters with their actions
    page.goto(base + "login")
    screenshot(page, tmp_path, "login")
    log_in(page, base)
    page.goto(base + "dead")
    assert page.inner_text('#dead tr[data-queue="payments"] td.num') == "1"
    screenshot(page, tmp_path, "dead")
    page.goto(base + "queues/payments?state=dead")
    assert page.inner_text(f'tr[data-job="{shop.dead_job}"] .error') == (
        "CardDeclined: insufficient funds"
    )
    assert page.locator(f'tr[data-job="{shop.dead_job}"] button[data-action]').count() == 2
    screenshot(page, tmp_path, "queue-dead")

    # The archive: the finished payment and the dead-lettered one, with outcome and error
    page.goto(base + "archive?since=1h")
    outcomes = {
        row.get_attribute("data-job"): row.get_attribute("data-outcome")
        for row in page.locator("#archive tr[data-job]").all()
    }
    assert outcomes[shop.dead_job] == "dead"
    assert sorted(str(outcome) for outcome in outcomes.values()) == ["dead", "done"]
    dead_row = page.locator(f'#archive tr[data-job="{shop.dead_job}"]')
    assert dead_row.locator(".error").inner_text() == "CardDeclined: insufficient funds"
    screenshot(page, tmp_path, "archive")
    # Filtered by another queue, and by a range that ended before, it finds nothing
    page.goto(base + "archive?queue=emails&since=1h")
    assert page.locator("#archive").count() == 0
    page.goto(base + "archive?since=3h&until=2h")
    assert page.locator("#archive").count() == 0
    # An archived job's own page
    page.goto(base + "archive?since=1h")
    page.click(f'#archive tr[data-job="{shop.dead_job}"] a')
    assert page.inner_text("#job-state") == "dead"
    assert page.inner_text('[data-field="task"]') == "shop.tasks.charge"

    # The broker: the leader's address and epoch, and its clients
    page.goto(base + "broker")
    status = get(base + "api/overview").body
    assert page.inner_text('[data-field="address"]') in status
    assert page.inner_text('[data-field="epoch"]') == "1"
    assert int(page.inner_text('[data-field="clients"]').split()[0]) >= 1
    assert page.locator("#clients tr").count() >= 2
    screenshot(page, tmp_path, "broker")


def test_metrics_serves_the_store_families_with_the_pages_numbers(shop: Shop) -> None:
    answer = get(shop.base + "metrics")
    assert answer.status == 200
    assert answer.headers["content-type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(answer.body)}
    jobs = {
        (s.labels["queue"], s.labels["state"]): s.value for s in families["objq_queue_jobs"].samples
    }
    assert jobs[("payments", "ready")] == 2
    assert jobs[("payments", "dead")] == 1
    assert jobs[("emails", "in_flight")] == 1
    assert families["objq_up"].samples[0].value == 1
    assert families["objq_broker_registered"].samples[0].value == 1


def test_every_answer_forbids_framing_and_foreign_scripts(shop: Shop) -> None:
    for path in ("", "queues/payments", "jobs/none", "static/dashboard.js"):
        headers = get(shop.base + path).headers
        policy = headers["content-security-policy"]
        assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy, path
        assert headers["x-frame-options"] == "DENY", path
        assert headers["x-content-type-options"] == "nosniff", path


def test_bad_input_is_a_page_that_says_what_was_expected(shop: Shop, page: Page) -> None:
    for path, expected in (
        ("queues/payments?state=lost", "expected one of ready, delayed, in-flight, dead"),
        ("queues/payments?page=0", "expected a whole number from 1"),
        ("archive?since=yesterday", "expected ISO 8601"),
        ("archive?since=1h&until=2h", "expected until later than since"),
        ("queues/nowhere", "queue 'nowhere': not declared"),
    ):
        answer = page.goto(shop.base + path)
        assert answer is not None
        assert answer.status in (400, 404), path
        assert expected in page.inner_text("#error-detail"), path
