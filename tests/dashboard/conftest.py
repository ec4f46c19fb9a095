"""A headless Chromium for the dashboard's browser tests: one per test session, one fresh
context (cookies, storage) per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from tests.dashboard.browsing import CHROMIUM

#: Milliseconds any one browser action may take before the test fails.
ACTION_TIMEOUT_MS = 20_000


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    if CHROMIUM is None:
        pytest.skip("Chromium not found on PATH (Debian/Ubuntu: apt-get install chromium)")
    with sync_playwright() as playwright:
        # Debian's Chromium: Playwright's own browser download is never needed.
        launched = playwright.chromium.launch(executable_path=CHROMIUM)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(ACTION_TIMEOUT_MS)
    opened = context.new_page()
    # A confirmation (purge) is accepted, as the person clicking meant it.
    opened.on("dialog", lambda dialog: dialog.accept())
    yield opened
    context.close()
