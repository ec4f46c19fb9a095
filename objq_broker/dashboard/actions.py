"""The actions (POST): logging in and out, retrying and purging dead letters.

Each one passes the checks of :mod:`~objq_broker.dashboard.security` first; a refused one
answers 403 and changes nothing. Retry and purge go through the public
:class:`~objq_broker.Queue` API (``retry_dead``, ``purge_dead``), as ``objq dead retry`` and
``objq dead purge`` do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from urllib.parse import parse_qs, quote

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from objq_broker.dashboard.pages import dashboard_of
from objq_broker.dashboard.security import (
    CSRF_FIELD,
    FAILED_LOGIN_DELAY_SECONDS,
    SESSION_COOKIE,
    Login,
    cross_site_refusal,
    csrf_matches,
    safe_next,
    token_matches,
)
from objq_broker.queue import Queue

#: The largest form body read; the forms here are a few hundred bytes.
MAX_FORM_BYTES = 64 * 1024
_FORM_TYPE = "application/x-www-form-urlencoded"

Form = dict[str, list[str]]


def routes() -> list[Route]:
    actions = {
        "/login": login,
        "/logout": logout,
        "/queues/{queue}/dead/retry": retry_dead,
        "/queues/{queue}/dead/purge": purge_dead,
    }
    return [Route(path, action, methods=["POST"]) for path, action in actions.items()]


class Refused(Exception):
    """An action refused (403): read-only, cross-site, not logged in, or no CSRF token."""


async def login(request: Request) -> Response:
    dashboard = dashboard_of(request)
    token = dashboard.settings.token
    if token is None:
        return _refuse(request, "this dashboard is read-only: it was started without a token")
    reason = cross_site_refusal(request)
    if reason is not None:
        return _refuse(request, reason)
    form = await _form(request)
    target = safe_next(_one(form, "next"))
    if not token_matches(_one(form, "token") or "", token):
        await asyncio.sleep(FAILED_LOGIN_DELAY_SECONDS)  # guessing becomes slow
        context = {"next": target, "error": "That is not the token this dashboard was given."}
        return dashboard.render(request, "login.html", context, 403)
    login_id, _ = dashboard.logins.open()
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        login_id,
        max_age=int(dashboard.settings.session_seconds),
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


async def logout(request: Request) -> Response:
    try:
        await _authorized(request)
    except Refused as exc:
        return _refuse(request, str(exc))
    dashboard_of(request).logins.close(request.cookies.get(SESSION_COOKIE))
    response = RedirectResponse("/", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict")
    return response


async def retry_dead(request: Request) -> Response:
    def retry(queue: Queue, name: str, ids: list[str] | None) -> str:
        done = queue.retry_dead(name, ids)
        return f"{_letters(len(done))} of {name} moved back to the queue"

    return await _on_dead(request, retry)


async def purge_dead(request: Request) -> Response:
    def purge(queue: Queue, name: str, ids: list[str] | None) -> str:
        return f"{_letters(queue.purge_dead(name, ids))} of {name} deleted"

    return await _on_dead(request, purge)


async def _on_dead(
    request: Request, act: Callable[[Queue, str, list[str] | None], str]
) -> Response:
    """Retry or purge the dead letters the form names: ``id`` fields, or ``scope=all``."""
    try:
        login, form = await _authorized(request)
    except Refused as exc:
        return _refuse(request, str(exc))
    name = request.path_params["queue"]
    ids = form.get("id", [])
    every = _one(form, "scope") == "all"
    if not ids and not every:
        raise ValueError("expected the ids of dead letters (id=...) or scope=all, found neither")
    dashboard = dashboard_of(request)
    login.notice = await run_in_threadpool(act, dashboard.queue(), name, None if every else ids)
    back = safe_next(_one(form, "back") or f"/queues/{quote(name, safe='')}?state=dead")
    return RedirectResponse(back, status_code=303)


async def _authorized(request: Request) -> tuple[Login, Form]:
    """The login and form of an action that passed every check; :class:`Refused` else."""
    dashboard = dashboard_of(request)
    if dashboard.settings.read_only:
        raise Refused("this dashboard is read-only: it was started without a token")
    reason = cross_site_refusal(request)
    if reason is not None:
        raise Refused(reason)
    login = dashboard.login(request)
    if login is None:
        raise Refused("not logged in (or the login expired): log in with the token first")
    form = await _form(request)
    if not csrf_matches(_one(form, CSRF_FIELD), login):
        raise Refused(
            "the form's CSRF token is missing or is not this login's: reload the page and try again"
        )
    return login, form


async def _form(request: Request) -> Form:
    """The fields of a urlencoded form body (the only kind these forms send)."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != _FORM_TYPE:
        raise ValueError(f"form: expected content type {_FORM_TYPE}, found {kind or 'none'!r}")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise ValueError(f"form: expected at most {MAX_FORM_BYTES:,} bytes, found more")
    return parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)


def _one(form: Form, name: str) -> str | None:
    """The form's one ``name`` field. Two are refused: a proxy, a browser and this server
    may each take another of them (the first, the last), and the token, the CSRF token and
    the address to go to next must mean one thing to all."""
    values = form.get(name)
    if values and len(values) > 1:
        raise ValueError(f"form: expected at most one {name!r} field, found {len(values)}")
    return values[0] if values else None


def _refuse(request: Request, reason: str) -> Response:
    context = {"status": 403, "title": "Refused", "detail": reason}
    return dashboard_of(request).render(request, "error.html", context, 403)


def _letters(count: int) -> str:
    return f"{count:,} dead letter" + ("" if count == 1 else "s")
