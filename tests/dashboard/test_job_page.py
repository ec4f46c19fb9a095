"""The job page: a real Dramatiq message and a real Celery message decoded, and what a job's
record says (attempts, last error, lease holder and expiry)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import dramatiq
import pytest
from celery import Celery
from playwright.sync_api import Page

import objq_broker.kombu  # noqa: F401  (registers the objq+ broker URLs)
from objq_broker import Queue
from objq_broker.dramatiq import ObjqBroker
from objq_broker.model.shown import when
from objq_broker.storage import open_store
from tests.dashboard.browsing import fill_store, needs_chromium, serving

pytestmark = needs_chromium


@pytest.fixture
def store_name(request: pytest.FixtureRequest) -> str:
    return f"job-page-{request.node.name}"


@pytest.fixture
def base(store_name: str) -> Iterator[str]:
    store = open_store(f"memory://{store_name}")  # the store the frameworks open by URL
    with serving(store) as url:
        yield url
    store.close()


def field(page: Page, name: str) -> str:
    return page.inner_text(f'#message [data-field="{name}"]')


def only_job(store_name: str, queue: str) -> str:
    with Queue(f"memory://{store_name}", broker="off") as client:
        [(_, job)] = client.jobs(queue)
    return job.id


def test_a_dramatiq_message_shows_its_actor_and_arguments(
    page: Page, base: str, store_name: str
) -> None:
    # Given a message sent by Dramatiq itself through the objq broker
    broker = ObjqBroker(url=f"memory://{store_name}")

    @dramatiq.actor(broker=broker, queue_name="emails")
    def send_welcome(user_id: int, *, template: str, cc: list[str]) -> None: ...

    message = send_welcome.send_with_options(
        args=(42,), kwargs={"template": "welcome-v2", "cc": ["ops@example.com"]}, max_retries=3
    )
    broker.close()
    job_id = only_job(store_name, "emails")

    # When its job page is opened
    page.goto(base + f"jobs/{job_id}")

    # Then the actor, its arguments and the message id are shown decoded
    assert page.get_attribute("#message", "data-framework") == "Dramatiq"
    assert field(page, "task") == "send_welcome"
    assert json.loads(field(page, "args")) == [42]
    assert json.loads(field(page, "kwargs")) == {
        "template": "welcome-v2",
        "cc": ["ops@example.com"],
    }
    assert message.message_id in page.inner_text("#message")
    assert "option max_retries\n3" in page.inner_text("#message")
    # And the payload itself is pretty-printed JSON
    payload = json.loads(page.inner_text("#payload"))
    assert payload["actor_name"] == "send_welcome"
    assert "\n  " in page.inner_text("#payload")


def test_a_celery_message_shows_its_task_and_arguments(
    page: Page, base: str, store_name: str
) -> None:
    # Given a task sent by Celery itself (apply_async) through the objq transport
    app = Celery("shop", broker=f"objq+memory://{store_name}", set_as_current=False)

    # The producer needs no task code: a signature names the task, as for a task of another app.
    charge = app.signature("shop.tasks.charge", args=(1001, 25.5), kwargs={"currency": "USD"})
    result = charge.apply_async(queue="payments", retries=0)
    app.close()
    job_id = only_job(store_name, "payments")

    # When its job page is opened
    page.goto(base + f"jobs/{job_id}")

    # Then the task, its arguments and the task id are shown decoded
    assert page.get_attribute("#message", "data-framework") == "Celery"
    assert field(page, "task") == "shop.tasks.charge"
    assert json.loads(field(page, "args")) == [1001, 25.5]
    assert json.loads(field(page, "kwargs")) == {"currency": "USD"}
    assert result.id in page.inner_text("#message")
    assert "payments" in page.inner_text("#message")  # the routing key


def test_a_job_page_shows_attempts_last_error_and_lease(page: Page, tmp_path: Path) -> None:
    # Given a dead letter and a job held by a worker
    url = (tmp_path / "store").as_uri()
    ids = fill_store(url)
    store = open_store(url)
    with serving(store) as base:
        # Then the dead letter's page shows its attempts and last error
        page.goto(base + f"jobs/{ids['dead']}")
        assert page.inner_text("#job-state") == "dead"
        assert page.inner_text('[data-field="attempts"]').startswith("1 of ")
        assert page.inner_text('[data-field="error"]') == "SMTP 550: mailbox unavailable"
        assert page.inner_text('[data-field="lease-owner"]') == "-"
        # And the held job's page shows who holds it and until when
        page.goto(base + f"jobs/{ids['in_flight']}")
        assert page.inner_text("#job-state") == "in-flight"
        assert page.inner_text('[data-field="lease-owner"]') == "worker-7@host-a"
        with Queue(url, broker="off") as queue:
            held = queue.job(ids["in_flight"])
        assert held is not None and held[1].lease is not None
        expires = page.inner_text('[data-field="lease-expires"]')
        assert expires.startswith(when(held[1].lease.expires_at) + " (in ")  # a 600 s lease
        assert page.locator("#message").count() == 0  # not a framework's message
        # And a job that is not in the state is a page that says where to look
        answer = page.goto(base + "jobs/no-such-job")
        assert answer is not None and answer.status == 404
        assert "archive" in page.inner_text("#error-detail")
    store.close()
