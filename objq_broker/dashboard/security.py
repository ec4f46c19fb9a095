"""Who may act: the token, the login login, and the checks against cross-site requests.

A dashboard started without a token is read-only: it offers no action and answers every
action with 403. With a token, acting takes, on every POST:

1. an ``Origin`` header naming this dashboard's own origin (or, where a browser sends none,
   a ``Referer`` on it): a form on another site cannot post here;
2. the login cookie that logging in with the token set (``SameSite=Strict``, so a browser
   does not send it with a request that another site starts, and ``HttpOnly``);
3. the login's CSRF token in a hidden field of the form (compared in constant time).

The token itself is compared in constant time, never logged, never stored anywhere but in
this process's memory, and travels only in the body of the login form. Logins live in the
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

#: The cookie that carries a login's id.
SESSION_COOKIE = "objq_dashboard_session"
#: The form field that carries a login's CSRF token.
CSRF_FIELD = "csrf"
#: Logins kept at most; logging in past this ends the oldest (a bound on memory, whatever
#: the number of logins).
MAX_LOGINS = 256
#: How long a failed login waits before it answers: guessing becomes slow.
FAILED_LOGIN_DELAY_SECONDS = 1.0


@dataclass
class Login:
    """One logged-in browser."""

    csrf: str
    expires_at: float
    #: A message for the next page this browser sees ("2 dead letters retried"), shown once.
    notice: str | None = None


class Logins:
    """The logged-in browsers of one dashboard, by login id. Thread-safe."""

    def __init__(self, lifetime_seconds: float) -> None:
        self.lifetime_seconds = lifetime_seconds
        self._logins: dict[str, Login] = {}
        self._lock = threading.Lock()

    def open(self) -> tuple[str, Login]:
        """A new login: its id (for the cookie) and record."""
        now = time.time()
        login = Login(secrets.token_urlsafe(32), now + self.lifetime_seconds)
        login_id = secrets.token_urlsafe(32)
        with self._lock:
            for gone in [k for k, s in self._logins.items() if s.expires_at <= now]:
                del self._logins[gone]
            while len(self._logins) >= MAX_LOGINS:
                del self._logins[min(self._logins, key=lambda k: self._logins[k].expires_at)]
            self._logins[login_id] = login
        return login_id, login

    def get(self, login_id: str | None) -> Login | None:
        """The live login with this id; None for an unknown or expired one."""
        if not login_id:
            return None
        with self._lock:
            login = self._logins.get(login_id)
            if login is not None and login.expires_at <= time.time():
                del self._logins[login_id]
                return None
            return login

    def close(self, login_id: str | None) -> None:
        with self._lock:
            self._logins.pop(login_id or "", None)


def token_matches(given: str, token: str) -> bool:
    """Whether ``given`` is the token, in time that does not depend on where they differ."""
    return hmac.compare_digest(given.encode(), token.encode())


def csrf_matches(given: str | None, login: Login) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), login.csrf.encode())


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
