"""What a dashboard is started with: its token, pacing and page size."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Annotated

import msgspec
from msgspec import Meta

from objq_broker.errors import ConfigurationError
from objq_broker.model.checks import PositiveSeconds
from objq_broker.model.settings import check_fields

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


class DashboardSettings(msgspec.Struct, frozen=True):
    """How one dashboard behaves. Without a ``token`` it is read-only: it offers no action and
    refuses every one. The token never appears in ``repr``, nor in a refusal.

    >>> DashboardSettings(token="s3cret-token-of-32-characters!!")
    DashboardSettings(token='***', refresh_seconds=3.0, page_size=50, session_seconds=28800.0)
    """

    #: The token that allows actions after logging in (None: read-only).
    token: Annotated[str | None, Meta(extra={"env": TOKEN_ENV, "secret": True})] = None
    #: How often the overview asks for new numbers.
    refresh_seconds: PositiveSeconds = DEFAULT_REFRESH_SECONDS
    #: Rows of a queue or archive page.
    page_size: Annotated[int, Meta(ge=1)] = DEFAULT_PAGE_SIZE
    #: How long a login lasts.
    session_seconds: PositiveSeconds = DEFAULT_SESSION_SECONDS
    #: Host names the dashboard answers to (the ``Host`` header); None: any. A dashboard on
    #: loopback answers to loopback names only, so a web page that rebinds its own name to
    #: 127.0.0.1 cannot read it through the browser of someone on this host.
    allowed_hosts: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        check_fields(self, where="dashboard")
        if self.token is not None and len(self.token) < MIN_TOKEN_CHARS:
            raise ConfigurationError(
                f"dashboard token: expected at least {MIN_TOKEN_CHARS} characters, found "
                f"{len(self.token)}; make one with {TOKEN_ADVICE}"
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
