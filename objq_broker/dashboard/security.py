"""Who may act: the token, the login session, and the checks against cross-site requests.

A dashboard started without a token is read-only: it offers no action and answers every
action with 403. With a token, acting takes, on every POST:

1. an ``Origin`` header naming this dashboard's own origin (or, where a browser sends none,
   a ``Referer`` on it): a form on another site cannot post here;
2. the session cookie that logging in with the token set (``SameSite=Strict``, so a browser
   does not send it with a request that another site starts, and ``HttpOnly``);
3. the session's CSRF token in a hidden field of the form (compared in constant time).

The token itself is compared in constant time, never logged, never stored anywhere but in
this process's memory, and travels only in the body of the login form. Sessions live in the
memory of the process: restarting the dashboard logs everybody out.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.requests import Request

#: The cookie that carries a session's id.
SESSION_COOKIE = "objq_dashboard_session"
#: The form field that carries a session's CSRF token.
CSRF_FIELD = "csrf"
#: Sessions kept at most; logging in past this ends the oldest (a bound on memory, whatever
#: the number of logins).
MAX_SESSIONS = 256
#: How long a failed login waits before it answers: guessing becomes slow.
FAILED_LOGIN_DELAY_SECONDS = 1.0


@dataclass
class Session:
    """One logged-in browser."""

    csrf: str
    expires_at: float
    #: A message for the next page this browser sees ("2 dead letters retried"), shown once.
    notice: str | None = None


class Sessions:
    """The logged-in browsers of one dashboard, by session id. Thread-safe."""

    def __init__(self, lifetime_seconds: float) -> None:
        self.lifetime_seconds = lifetime_seconds
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def open(self) -> tuple[str, Session]:
        """A new session: its id (for the cookie) and record."""
        now = time.time()
        session = Session(secrets.token_urlsafe(32), now + self.lifetime_seconds)
        session_id = secrets.token_urlsafe(32)
        with self._lock:
            for gone in [k for k, s in self._sessions.items() if s.expires_at <= now]:
                del self._sessions[gone]
            while len(self._sessions) >= MAX_SESSIONS:
                del self._sessions[min(self._sessions, key=lambda k: self._sessions[k].expires_at)]
            self._sessions[session_id] = session
        return session_id, session

    def get(self, session_id: str | None) -> Session | None:
        """The live session with this id; None for an unknown or expired one."""
        if not session_id:
            return None
        with self._lock:
            session = self._sessions.get(session_id)
            if session is not None and session.expires_at <= time.time():
                del self._sessions[session_id]
                return None
            return session

    def close(self, session_id: str | None) -> None:
        with self._lock:
            self._sessions.pop(session_id or "", None)


def token_matches(given: str, token: str) -> bool:
    """Whether ``given`` is the token, in time that does not depend on where they differ."""
    return hmac.compare_digest(given.encode(), token.encode())


def csrf_matches(given: str | None, session: Session) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), session.csrf.encode())


def own_origin(request: Request) -> str:
    """This dashboard's origin as the browser addressed it (``http://127.0.0.1:7702``)."""
    return f"{request.url.scheme}://{request.url.netloc}".lower()


def cross_site_refusal(request: Request) -> str | None:
    """Why ``request`` (a POST) is refused as cross-site, or None when it comes from one of
    this dashboard's own pages."""
    expected = own_origin(request)
    origin = request.headers.get("origin")
    if origin is not None:
        if origin.lower() != expected:
            return f"cross-site request refused: expected Origin {expected}, found {origin}"
        return None
    referer = request.headers.get("referer")
    if referer is None:
        return (
            f"cross-site request refused: expected an Origin or Referer of {expected}, found none"
        )
    parts = urlsplit(referer)
    if f"{parts.scheme}://{parts.netloc}".lower() != expected:
        return f"cross-site request refused: expected a Referer on {expected}, found {referer}"
    return None


def safe_next(path: str | None) -> str:
    """Where to go after logging in: a path of this dashboard, never another site."""
    if not path or not path.startswith("/") or path.startswith("//") or "\\" in path:
        return "/"
    return path
