"""What the dashboard's tests share: a dashboard served in this process or as a real
``objq dashboard`` child process, requests made outside the browser (a forged POST), and
screenshots.

Screenshots always go to the test's temporary folder; when ``$OBJQ_SCREENSHOTS`` names a
folder they are written there too (``OBJQ_SCREENSHOTS=docs/dashboard pytest tests/dashboard``
refreshes the pictures of ``docs/dashboard.md``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from email.message import Message
from pathlib import Path

import pytest
from playwright.sync_api import Page

from objq_broker import Queue
from objq_broker.dashboard import DashboardServer, DashboardSettings, create_app
from objq_broker.storage import ObjectStore
from tests.cli.objq_cli import environment, objq_command
from tests.support.processes import Children
from tests.support.servers import free_port
from tests.support.waiting import wait_for

#: The environment variable naming a folder that receives a copy of every screenshot.
SCREENSHOTS_ENV = "OBJQ_SCREENSHOTS"
#: A token long enough for the dashboard (16 characters or more).
TOKEN = "test-token-5bd1c0a7e4f24d8e"
#: Seconds an ``objq dashboard`` process may take to answer (a Python start and one bind).
START_TIMEOUT_SECONDS = 20.0
#: Seconds one request made outside the browser may take.
REQUEST_TIMEOUT_SECONDS = 30.0

#: Debian's Chromium, driven headless by Playwright (Playwright's own browser download is
#: never used).
CHROMIUM = shutil.which("chromium")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="Chromium not found on PATH (Debian/Ubuntu: apt-get install chromium; "
    "scripts/test installs it when run as root)",
)


@contextmanager
def serving(store: ObjectStore, token: str | None = None, **options: float) -> Iterator[str]:
    """The dashboard of ``store`` served in this process on a free loopback port; yields its
    base URL (ending in ``/``)."""
    settings = DashboardSettings(token=token, **options)  # type: ignore[arg-type]
    server = DashboardServer.start(create_app(store, settings), "127.0.0.1", 0)
    try:
        yield server.url
    finally:
        server.stop()


@dataclass
class DashboardProcess:
    """A running ``objq dashboard`` child process."""

    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def output(self) -> str:
        return self.log.read_text()


def start_dashboard(
    children: Children, store_url: str, log: Path, env: Mapping[str, str] | None = None
) -> DashboardProcess:
    """Start ``objq dashboard`` for ``store_url`` on a free port and wait until it answers."""
    port = free_port()
    full_env = {**environment(store_url), **(env or {})}
    process = children.start(
        [*objq_command(), "dashboard", "--listen", f"127.0.0.1:{port}"], env=full_env, log=log
    )
    running = DashboardProcess(process, f"http://127.0.0.1:{port}/", log)

    def answers() -> bool:
        if process.poll() is not None:
            raise AssertionError(
                f"objq dashboard exited with {process.returncode}: {running.output()}"
            )
        try:
            return get(running.url).status == 200
        except (urllib.error.URLError, ConnectionError):
            return False

    wait_for(answers, START_TIMEOUT_SECONDS, "objq dashboard to answer", progress=running.output)
    return running


@dataclass
class Answer:
    status: int
    body: str
    #: By lowercase name.
    headers: dict[str, str]


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None  # a 303 is an answer to look at, not a page to follow


_opener = urllib.request.build_opener(_NoRedirects)


def get(url: str, headers: Mapping[str, str] | None = None) -> Answer:
    return _send(urllib.request.Request(url, headers=dict(headers or {})))


def post(url: str, fields: Mapping[str, str | list[str]], headers: Mapping[str, str]) -> Answer:
    """A form POST made by hand: what a forger can send, with exactly these headers."""
    body = urllib.parse.urlencode(fields, doseq=True).encode()
    request = urllib.request.Request(url, data=body, method="POST")
    request.add_header("Content-Type", "application/x-www-form-urlencoded")
    for name, value in headers.items():
        request.add_header(name, value)
    return _send(request)


def _send(request: urllib.request.Request) -> Answer:
    try:
        with _opener.open(request, timeout=REQUEST_TIMEOUT_SECONDS) as response:
            return Answer(response.status, response.read().decode(), _names(response.headers))
    except urllib.error.HTTPError as error:
        return Answer(error.code, error.read().decode(), _names(error.headers))


def _names(headers: Message) -> dict[str, str]:
    return {name.lower(): value for name, value in headers.items()}


def screenshot(page: Page, folder: Path, name: str) -> Path:
    """A full-page screenshot ``name``.png into ``folder``, and into ``$OBJQ_SCREENSHOTS``."""
    taken = folder / f"{name}.png"
    page.screenshot(path=taken, full_page=True)
    copies = os.environ.get(SCREENSHOTS_ENV)
    if copies:
        Path(copies).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(taken, Path(copies) / taken.name)
    assert taken.stat().st_size > 0
    return taken


def log_in(page: Page, base: str, token: str = TOKEN) -> None:
    """Log in through the login form, as a person would."""
    page.goto(base + "login")
    page.fill("input[name=token]", token)
    page.click("form.login button[type=submit]")
    page.wait_for_selector("text=Log out")


def fill_store(url: str) -> dict[str, str]:
    """Given jobs in every state: ``emails`` with 3 ready, 2 delayed, 1 in flight and 1 dead,
    ``reports`` with 2 ready, ``idle`` declared and empty. Returns the ids of the dead and the
    in-flight job."""
    with Queue(url, broker="off") as queue:
        queue.declare("idle")
        queue.enqueue_many("emails", [b"one", b"two", b"three", b"four", b"five"])
        queue.enqueue_many("emails", [b"later", b"much later"], delay=3600)
        held = queue.claim("emails", 2, lease=600, owner="worker-7@host-a")
        queue.nack(held[0], error="SMTP 550: mailbox unavailable", retry=False)
        queue.enqueue_many("reports", [b'{"report": "daily"}', b'{"report": "weekly"}'], priority=1)
        return {"dead": held[0].id, "in_flight": held[1].id}
