"""Retry and purge from the pages, and every way an action is refused: without a token, from
another site, without the session's CSRF token."""

from __future__ import annotations

import signal
from pathlib import Path

from playwright.sync_api import Page

from objq_broker import Queue
from objq_broker.dashboard.security import SESSION_COOKIE
from objq_broker.dashboard.settings import TOKEN_ENV
from objq_broker.storage import MemoryStore, open_store
from tests.dashboard.browsing import (
    TOKEN,
    Answer,
    fill_store,
    get,
    log_in,
    needs_chromium,
    post,
    serving,
    start_dashboard,
)
from tests.support.processes import Children, reap

pytestmark = needs_chromium

#: Seconds a stopped ``objq dashboard`` may take to exit.
EXIT_TIMEOUT_SECONDS = 15.0


def where(url: str, job_id: str) -> str | None:
    """The job's state, through the Queue API."""
    with Queue(url, broker="off") as queue:
        found = queue.job(job_id)
    return None if found is None else found[0]


def test_retrying_a_dead_letter_from_the_page_moves_it_to_ready(
    page: Page, children: Children, tmp_path: Path
) -> None:
    # Given a real `objq dashboard` process given the token by its environment
    url = (tmp_path / "store").as_uri()
    ids = fill_store(url)
    log = tmp_path / "dashboard.log"
    dashboard = start_dashboard(children, url, log, env={TOKEN_ENV: TOKEN})
    base = dashboard.url
    page.goto(base + "queues/emails?state=dead")
    # Before logging in the dead letters are listed but nothing can be done to them
    assert page.locator(f'tr[data-job="{ids["dead"]}"]').count() == 1
    assert page.locator("button[data-action]").count() == 0

    # When someone logs in with the token and clicks Retry on the dead letter's row
    log_in(page, base)
    page.goto(base + "queues/emails?state=dead")
    page.click(f'tr[data-job="{ids["dead"]}"] button[data-action=retry]')

    # Then the page says so, and the Queue API finds the job ready with fresh attempts
    assert page.inner_text(".notice") == "1 dead letter of emails moved back to the queue"
    assert where(url, ids["dead"]) == "ready"
    with Queue(url, broker="off") as queue:
        stats = queue.stats("emails")
        found = queue.job(ids["dead"])
    assert (stats.ready, stats.dead) == (4, 0)
    assert found is not None and found[1].attempts == 0

    # And, listening on loopback, it answers no request addressed to another name
    rebound = get(base, {"Host": "attacker.test"})
    assert rebound.status == 400 and where(url, ids["dead"]) == "ready"

    # And the process stops cleanly on SIGTERM, having never written the token anywhere
    children.send_signal(dashboard.process, signal.SIGTERM)
    assert reap(dashboard.process, EXIT_TIMEOUT_SECONDS) == 0
    output = dashboard.output()
    assert "actions need the token" in output and "objq dashboard: stopped" in output
    assert TOKEN not in output


def test_purging_one_dead_letter_and_then_all_of_a_queue(page: Page, tmp_path: Path) -> None:
    # Given a queue with three dead letters and a dashboard with a token, logged in
    store = MemoryStore("purge-from-the-page")
    with Queue(store=store, broker="off") as queue:
        queue.enqueue_many("orders", [b"a", b"b", b"c"])
        for delivery in queue.claim("orders", 3):
            queue.nack(delivery, error="refused", retry=False)
        first, *others = [job.id for job in queue.dead_letters("orders")]
        with serving(store, TOKEN) as base:
            log_in(page, base)
            # When one is purged from its job page (the confirmation accepted)
            page.goto(base + f"jobs/{first}")
            page.click("button[data-action=purge]")
            # Then it is gone, and the others are still dead letters
            page.wait_for_selector(".notice")
            assert queue.job(first) is None
            assert sorted(job.id for job in queue.dead_letters("orders")) == sorted(others)

            # When the rest are purged with "Purge all" on the queue's dead tab
            page.goto(base + "queues/orders?state=dead")
            page.click(".actions button[data-action=purge]")
            # Then the queue has no dead letters, and nothing else changed
            assert page.inner_text(".notice") == "2 dead letters of orders deleted"
            assert queue.dead_letters("orders") == []
            assert queue.stats("orders").ready == 0


def test_without_a_token_no_action_is_offered_and_a_forged_post_is_refused(
    page: Page, tmp_path: Path
) -> None:
    url = (tmp_path / "store").as_uri()
    ids = fill_store(url)
    store = open_store(url)
    with serving(store) as base:
        # Given a dashboard started without a token: its pages offer no form that acts
        for path in ("queues/emails?state=dead", f"jobs/{ids['dead']}", "dead", ""):
            page.goto(base + path)
            assert page.locator("form[method=post]").count() == 0, path
            assert page.locator("a[href^='/login']").count() == 0, path
            assert page.inner_text("header .badge") == "read-only"

        # When requests are forged with the dashboard's own Origin
        origin = {"Origin": base.rstrip("/")}
        refused = [
            post(base + "queues/emails/dead/retry", {"id": ids["dead"]}, origin),
            post(base + "queues/emails/dead/purge", {"scope": "all"}, origin),
            post(base + "login", {"token": TOKEN, "next": "/"}, origin),
        ]
        # Then each one is refused, and the dead letter is still dead
        assert [answer.status for answer in refused] == [403, 403, 403]
        assert all("read-only" in answer.body for answer in refused)
    store.close()
    assert where(url, ids["dead"]) == "dead"


def test_cross_site_posts_with_the_session_cookie_are_refused(page: Page, tmp_path: Path) -> None:
    url = (tmp_path / "store").as_uri()
    ids = fill_store(url)
    store = open_store(url)
    with serving(store, TOKEN) as base:
        # Given a browser logged in with the token: its session cookie and its page's CSRF token
        log_in(page, base)
        page.goto(base + "queues/emails?state=dead")
        csrf = page.get_attribute(".actions input[name=csrf]", "value")
        assert csrf
        cookies = page.context.cookies(base)
        [session] = [c for c in cookies if c["name"] == SESSION_COOKIE]
        assert session.get("sameSite") == "Strict" and session.get("httpOnly")
        own = base.rstrip("/")
        cookie = {"Cookie": f"{SESSION_COOKIE}={session['value']}"}
        retry = base + "queues/emails/dead/retry"
        fields = {"id": ids["dead"], "csrf": csrf}

        def attempt(form: dict[str, str], **headers: str) -> Answer:
            return post(retry, form, {**cookie, **headers})

        # When the cookie is sent from another origin, without the CSRF token, with a wrong
        # one, with neither Origin nor Referer, with another site's Referer, or without it
        answers = {
            "other origin": attempt(fields, Origin="http://attacker.test"),
            "no csrf": attempt({"id": ids["dead"]}, Origin=own),
            "wrong csrf": attempt({**fields, "csrf": "x" + csrf}, Origin=own),
            "no origin": attempt(fields),
            "other referer": attempt(fields, Referer="http://attacker.test/page"),
            "no cookie": post(retry, fields, {"Origin": own}),
        }
        # Then every one is refused, saying why, and the dead letter is still dead
        assert {why: a.status for why, a in answers.items()} == dict.fromkeys(answers, 403)
        assert "cross-site" in answers["other origin"].body
        assert "CSRF" in answers["no csrf"].body and "CSRF" in answers["wrong csrf"].body
        assert "not logged in" in answers["no cookie"].body
        assert where(url, ids["dead"]) == "dead"

        # When a page of another site makes the logged-in browser post to the dashboard
        attack = (
            f'<form method="post" action="{base}queues/emails/dead/purge">'
            '<input type="hidden" name="scope" value="all"><button>win</button></form>'
        )
        page.route(
            "http://attacker.test/",
            lambda route: route.fulfill(status=200, content_type="text/html", body=attack),
        )
        page.goto("http://attacker.test/")
        with page.expect_response(lambda r: r.url.endswith("/dead/purge")) as response:
            page.click("button")
        # Then it is refused too, and the dead letter stays
        assert response.value.status == 403
        assert where(url, ids["dead"]) == "dead"

        # While the same request with the page's origin, cookie and CSRF token is accepted
        accepted = attempt(fields, Origin=own)
        assert accepted.status == 303
        assert where(url, ids["dead"]) == "ready"
    store.close()


def test_a_wrong_token_does_not_log_in_and_logging_out_ends_the_session(
    page: Page, tmp_path: Path
) -> None:
    store = MemoryStore("login-and-out")
    with Queue(store=store, broker="off") as queue:
        queue.enqueue("mail", b"x")
        queue.nack(queue.claim("mail")[0], error="no", retry=False)
        [dead] = queue.dead_letters("mail")
        with serving(store, TOKEN) as base:
            # A wrong token is refused and sets no cookie
            page.goto(base + "login")
            page.fill("input[name=token]", TOKEN + "x")
            with page.expect_response(lambda r: r.url.endswith("/login")) as answer:
                page.click("form.login button[type=submit]")
            assert answer.value.status == 403
            assert "not the token" in page.inner_text("main")
            assert page.context.cookies(base) == []

            # Logging in and out again: the old session no longer acts
            log_in(page, base)
            page.goto(base + "queues/mail?state=dead")
            csrf = page.get_attribute(".actions input[name=csrf]", "value")
            assert csrf
            [cookie] = page.context.cookies(base)
            page.click("text=Log out")
            page.wait_for_selector("a[href^='/login']")
            replay = post(
                base + "queues/mail/dead/retry",
                {"id": dead.id, "csrf": csrf},
                {"Origin": base.rstrip("/"), "Cookie": f"{SESSION_COOKIE}={cookie['value']}"},
            )
            assert replay.status == 403 and "not logged in" in replay.body
            assert queue.job(dead.id) is not None and queue.job(dead.id)[0] == "dead"  # type: ignore[index]
