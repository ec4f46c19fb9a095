"""What a dashboard is started with: its token, pacing and page size."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from objq_broker.errors import ConfigurationError

#: The environment variable that gives the token (``--token`` takes precedence): a command
#: line is visible to every user of the host in ``ps``, the environment is not.
TOKEN_ENV = "OBJQ_DASHBOARD_TOKEN"
#: A shorter token could be guessed over the network; 16 characters of
#: ``secrets.token_urlsafe`` carry 96 bits.
MIN_TOKEN_CHARS = 16
#: How often the overview asks for new numbers (each time one read of the state object).
DEFAULT_REFRESH_SECONDS = 3.0
#: Rows of a queue or archive page.
DEFAULT_PAGE_SIZE = 50
#: How long a login lasts.
DEFAULT_SESSION_SECONDS = 8 * 3600.0
#: How to make a good token, said when one is refused.
TOKEN_ADVICE = 'python -c "import secrets; print(secrets.token_urlsafe(32))"'


@dataclass(frozen=True)
class DashboardSettings:
    """How one dashboard behaves. Without a ``token`` it is read-only: it offers no action and
    refuses every one. The token never appears in ``repr``.

    >>> DashboardSettings(token="s3cret-token-of-32-characters!!")
    DashboardSettings(token='***', refresh_seconds=3.0, page_size=50, session_seconds=28800.0)
    """

    token: str | None = None
    refresh_seconds: float = DEFAULT_REFRESH_SECONDS
    page_size: int = DEFAULT_PAGE_SIZE
    session_seconds: float = DEFAULT_SESSION_SECONDS
    #: Host names the dashboard answers to (the ``Host`` header); None: any. A dashboard on
    #: loopback answers to loopback names only, so a web page that rebinds its own name to
    #: 127.0.0.1 cannot read it through the browser of someone on this host.
    allowed_hosts: tuple[str, ...] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.token is not None and len(self.token) < MIN_TOKEN_CHARS:
            raise ConfigurationError(
                f"dashboard token: expected at least {MIN_TOKEN_CHARS} characters, found "
                f"{len(self.token)}; make one with {TOKEN_ADVICE}"
            )
        if self.refresh_seconds <= 0 or self.session_seconds <= 0:
            raise ConfigurationError(
                "dashboard: expected positive refresh_seconds and session_seconds, found "
                f"{self.refresh_seconds} and {self.session_seconds}"
            )
        if self.page_size < 1:
            raise ConfigurationError(
                f"dashboard page_size: expected 1 or more, found {self.page_size}"
            )

    def __repr__(self) -> str:
        token = None if self.token is None else "***"
        return (
            f"DashboardSettings(token={token!r}, refresh_seconds={self.refresh_seconds}, "
            f"page_size={self.page_size}, session_seconds={self.session_seconds})"
        )

    @property
    def read_only(self) -> bool:
        return self.token is None


def token_from(given: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The token: ``given`` (``--token``), else ``$OBJQ_DASHBOARD_TOKEN``, else None."""
    if given is not None:
        return given
    return (os.environ if environ is None else environ).get(TOKEN_ENV)


#: Host names that reach a loopback address.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


def allowed_hosts_for(listen_host: str) -> tuple[str, ...] | None:
    """Loopback names for a dashboard that listens on loopback only; None (any) otherwise."""
    if listen_host in LOOPBACK_HOSTS or listen_host.startswith("127."):
        return (*LOOPBACK_HOSTS, listen_host)
    return None
