"""The pages (GET): every one reads the store once, through :mod:`~objq_broker.dashboard.reading`,
in a worker thread (storage calls block), and renders a template."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from objq_broker.dashboard.archived import read_archived_job, search_archive
from objq_broker.dashboard.reading import (
    STATES,
    dead_counts,
    read_job,
    read_overview,
    read_queue_page,
    read_workers,
)
from objq_broker.dashboard.security import safe_next
from objq_broker.engine.archive import TAIL_KEY
from objq_broker.engine.snapshot import Snapshot
from objq_broker.errors import ConfigurationError, JobNotFound, ObjqError, QueueNotFound
from objq_broker.model.durations import parse_time
from objq_broker.model.records import JobState
from objq_broker.model.workers import GONE_SECONDS
from objq_broker.storage import ObjectStore

if TYPE_CHECKING:
    from objq_broker.dashboard.app import Dashboard

Endpoint = Callable[[Request], Awaitable[Response]]

#: What the archive search looks at when no range is given.
DEFAULT_ARCHIVE_SINCE = "1h"


def dashboard_of(request: Request) -> Dashboard:
    return cast("Dashboard", request.app.state.dashboard)


def routes() -> list[Route]:
    pages: dict[str, Endpoint] = {
        "/": overview,
        "/api/overview": overview_json,
        "/workers": workers_page,
        "/api/workers": workers_json,
        "/queues/{queue}": queue_page,
        "/jobs/{job_id}": job_page,
        "/dead": dead_page,
        "/archive": archive_page,
        "/archive/job": archived_job_page,
        "/broker": broker_page,
        "/metrics": metrics,
        "/login": login_page,
    }
    return [Route(path, page, methods=["GET"]) for path, page in pages.items()]


def _store_page(template: str, read: Callable[[ObjectStore], Any], name: str) -> Endpoint:
    """A page that renders ``template`` with what ``read`` finds in the store as ``name``."""

    async def page(request: Request) -> Response:
        dashboard = dashboard_of(request)
        view = await run_in_threadpool(read, dashboard.store)
        return dashboard.render(request, template, {name: view})

    return page


overview = _store_page("overview.html", read_overview, "overview")
dead_page = _store_page("dead.html", dead_counts, "counts")
broker_page = _store_page("broker.html", read_overview, "overview")


async def overview_json(request: Request) -> Response:
    """The overview's numbers, which the overview page asks for every few seconds."""
    view = await run_in_threadpool(read_overview, dashboard_of(request).store)
    return JSONResponse(view.as_json())


async def workers_page(request: Request) -> Response:
    dashboard = dashboard_of(request)
    view = await run_in_threadpool(read_workers, dashboard.store)
    context = {"view": view, "gone_seconds": GONE_SECONDS}
    return dashboard.render(request, "workers.html", context)


async def workers_json(request: Request) -> Response:
    """The workers page's rows, as ``objq workers --json`` gives them."""
    view = await run_in_threadpool(read_workers, dashboard_of(request).store)
    return JSONResponse(view.as_json())


async def queue_page(request: Request) -> Response:
    dashboard = dashboard_of(request)
    queue = request.path_params["queue"]
    state = _state(request.query_params.get("state", "ready"))
    page = _page_number(request.query_params.get("page", "1"))
    size = dashboard.settings.page_size
    view = await run_in_threadpool(read_queue_page, dashboard.store, queue, state, page, size)
    return dashboard.render(request, "queue.html", {"view": view, "states": STATES})


async def job_page(request: Request) -> Response:
    dashboard = dashboard_of(request)
    job_id = request.path_params["job_id"]
    detail = await run_in_threadpool(read_job, dashboard.store, job_id)
    if detail is None:
        raise JobNotFound(
            f"job {job_id!r}: not in the state of {dashboard.store.url}; a finished job is in "
            "the archive (search it by the time it finished)"
        )
    return dashboard.render(request, "job.html", {"detail": detail})


async def archive_page(request: Request) -> Response:
    dashboard = dashboard_of(request)
    params = request.query_params
    form = {
        "queue": params.get("queue", "").strip(),
        "since": params.get("since", DEFAULT_ARCHIVE_SINCE).strip(),
        "until": params.get("until", "").strip(),
    }
    now = time.time()
    since = parse_time(form["since"], now, "since") if form["since"] else None
    until = parse_time(form["until"], now, "until") if form["until"] else None
    if since is not None and until is not None and until <= since:
        raise ConfigurationError(f"archive search: expected until later than since, found {form}")

    def search() -> tuple[Any, list[str]]:
        found = search_archive(
            dashboard.store,
            queue=form["queue"] or None,
            since=since,
            until=until,
            cursor=params.get("cursor"),
            page_size=dashboard.settings.page_size,
        )
        return found, Snapshot.read(dashboard.store).queue_names()

    found, queues = await run_in_threadpool(search)
    context = {"found": found, "form": form, "queues": queues, "cursor": params.get("cursor")}
    return dashboard.render(request, "archive.html", context)


async def archived_job_page(request: Request) -> Response:
    dashboard = dashboard_of(request)
    key, job_id = request.query_params.get("key", ""), request.query_params.get("id", "")
    if not (key.startswith("archive/") or key == TAIL_KEY) or not job_id:
        raise ConfigurationError(
            f"archived job: expected ?key=archive/...&id=JOB (or key={TAIL_KEY}, the state's "
            f"archive tail), found key {key!r} and id {job_id!r}"
        )
    detail = await run_in_threadpool(read_archived_job, dashboard.store, key, job_id)
    if detail is None:
        where = (
            "in the state's archive tail (written out to an archive object since: search for it)"
            if key == TAIL_KEY
            else f"in the archive object {key}"
        )
        raise JobNotFound(f"job {job_id!r}: not {where}")
    return dashboard.render(request, "job.html", {"detail": detail})


async def metrics(request: Request) -> Response:
    """The Prometheus families of ``objq exporter``, read from the store on each scrape."""
    registry = dashboard_of(request).metrics_registry()
    body = await run_in_threadpool(generate_latest, registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


async def login_page(request: Request) -> Response:
    dashboard = dashboard_of(request)
    if dashboard.settings.read_only:
        raise HTTPException(404, "this dashboard is read-only: it was started without a token")
    context = {"next": safe_next(request.query_params.get("next")), "error": None}
    return dashboard.render(request, "login.html", context)


def _state(text: str) -> JobState:
    if text not in STATES:
        raise ConfigurationError(f"state: expected one of {', '.join(STATES)}, found {text!r}")
    return text


def _page_number(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise ConfigurationError(f"page: expected a whole number from 1, found {text!r}")
    return int(text)


# --- errors ------------------------------------------------------------------------------


async def _error(request: Request, exc: Exception) -> Response:
    status, title = _status_of(exc)
    detail = exc.detail if isinstance(exc, HTTPException) else " ".join(str(exc).split())
    context = {"status": status, "title": title, "detail": detail}
    return dashboard_of(request).render(request, "error.html", context, status)


def _status_of(exc: Exception) -> tuple[int, str]:
    if isinstance(exc, HTTPException):
        return exc.status_code, "Not found" if exc.status_code == 404 else "Refused"
    if isinstance(exc, QueueNotFound | JobNotFound):
        return 404, "Not found"
    if isinstance(exc, ConfigurationError | ValueError):
        return 400, "Bad request"
    return 503, "The store could not be read"


#: Errors shown as a page: a missing queue or job (404), bad input (400), a store that could
#: not be read (503: unreachable, access denied, a corrupt state, which is left as it is).
EXCEPTION_HANDLERS: Any = {
    HTTPException: _error,
    QueueNotFound: _error,
    JobNotFound: _error,
    ConfigurationError: _error,
    ValueError: _error,
    ObjqError: _error,
}
