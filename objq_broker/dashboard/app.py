"""The dashboard's Starlette application: routes, templates, static files and the response
headers every page gets.

>>> from objq_broker.storage import MemoryStore
>>> app = create_app(MemoryStore("doc-dashboard"))
>>> sorted({route.path for route in app.routes})[:3]
['/', '/api/overview', '/api/workers']
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterator
from typing import Any

import jinja2
from prometheus_client.registry import CollectorRegistry
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from objq_broker.broker.settings import broker_settings
from objq_broker.dashboard import actions, pages
from objq_broker.dashboard.security import SESSION_COOKIE, Login, Logins
from objq_broker.dashboard.settings import DashboardSettings
from objq_broker.metrics import exporter_registry
from objq_broker.model.shown import age, size, when
from objq_broker.queue import Queue
from objq_broker.storage import ObjectStore

#: Every response says: scripts, styles and images come from this dashboard only; no other
#: site may frame it (clickjacking) or receive its URLs in a Referer.
SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        b"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]


class Dashboard:
    """What the routes share: the store, the settings, the logins, and the queue API that
    actions go through (opened at the first action, as a broker client that never becomes
    the broker: a dashboard must not take over a namespace)."""

    def __init__(self, store: ObjectStore, settings: DashboardSettings) -> None:
        self.store = store
        self.settings = settings
        self.logins = Logins(settings.session_seconds)
        self.templates = Jinja2Templates(env=_environment())
        self._queue: Queue | None = None
        self._registry: CollectorRegistry | None = None
        self._lock = threading.Lock()

    def queue(self) -> Queue:
        with self._lock:
            if self._queue is None:
                client = broker_settings(None, {}, default="client")
                self._queue = Queue(store=self.store, broker=client)
            return self._queue

    def metrics_registry(self) -> CollectorRegistry:
        """What ``/metrics`` serves: what ``objq exporter`` serves for the same store."""
        with self._lock:
            if self._registry is None:
                self._registry = exporter_registry(self.store)
            return self._registry

    def close(self) -> None:
        with self._lock:
            if self._queue is not None:
                self._queue.close()
                self._queue = None

    def login(self, request: Request) -> Login | None:
        """The logged-in login of ``request``; None when read-only or not logged in."""
        if self.settings.read_only:
            return None
        return self.logins.get(request.cookies.get(SESSION_COOKIE))

    def render(
        self, request: Request, template: str, context: dict[str, Any], status: int = 200
    ) -> Response:
        login = self.login(request)
        notice = None
        if login is not None:
            notice, login.notice = login.notice, None
        shared = {
            "store_url": self.store.url,
            "read_only": self.settings.read_only,
            "login": login,
            "notice": notice,
            "refresh_seconds": self.settings.refresh_seconds,
            "path": request.url.path,
        }
        return self.templates.TemplateResponse(
            request, template, {**shared, **context}, status_code=status
        )


def create_app(store: ObjectStore, settings: DashboardSettings | None = None) -> Starlette:
    """The dashboard of ``store``. The caller keeps the store (and closes it); the app closes
    the queue it opened for actions when it shuts down."""
    dashboard = Dashboard(store, settings or DashboardSettings())

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        dashboard.close()

    middleware = [Middleware(SecurityHeaders)]
    if dashboard.settings.allowed_hosts is not None:
        hosts = list(dashboard.settings.allowed_hosts)
        middleware.append(Middleware(TrustedHostMiddleware, allowed_hosts=hosts))
    app = Starlette(
        routes=[
            *pages.routes(),
            *actions.routes(),
            Mount("/static", StaticFiles(packages=[("objq_broker.dashboard", "static")])),
        ],
        middleware=middleware,
        lifespan=lifespan,
        exception_handlers=pages.EXCEPTION_HANDLERS,
    )
    app.state.dashboard = dashboard
    return app


#: The body of an answer to a request that failed unexpectedly (the log has the traceback).
_SERVER_ERROR = b"Internal Server Error"


class SecurityHeaders:
    """Adds :data:`SECURITY_HEADERS` to every HTTP response, a 500 for an unexpected error
    included."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        started = False

        async def with_headers(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        try:
            await self.app(scope, receive, with_headers)
        except Exception:
            if started:
                raise
            # Starlette's error middleware wraps every other one: its own 500 would go out
            # without these headers. Answer here; it sees the answer started and only logs.
            await with_headers(
                {
                    "type": "http.response.start",
                    "status": 500,
                    "headers": [
                        (b"content-type", b"text/plain; charset=utf-8"),
                        (b"content-length", str(len(_SERVER_ERROR)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": _SERVER_ERROR})
            raise


# --- templates -----------------------------------------------------------------------------


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("objq_broker.dashboard", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,  # a misspelt name fails the test, not the page
    )
    env.filters.update(when=when, age=age, number=number, size=size)
    return env


def number(count: int) -> str:
    return f"{count:,}"
