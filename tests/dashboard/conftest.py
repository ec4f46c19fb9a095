"""A headless Chromium for the dashboard's browser tests: one per test module, one fresh
context (cookies, storage) per test.

Not one per session: Playwright's synchronous API keeps an event loop running on the thread
while it is started, so every later test of the same process that calls ``asyncio.run`` would
fail; pytest stops a module's fixture before it runs a test of another module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from tests.dashboard.browsing import CHROMIUM

#: Milliseconds any one browser action may take before the test fails.
ACTION_TIMEOUT_MS = 20_000


@pytest.fixture(scope="module")
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
