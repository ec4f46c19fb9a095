"""``objq dashboard``: a web UI of a store, served until SIGTERM or SIGINT (then exit 0).

It reads the store as ``objq status`` does, on each page (never writing, and taking no part in
the broker election), and retries or purges dead letters only when started with a token
(``--token``, or ``$OBJQ_DASHBOARD_TOKEN``, which ``ps`` does not show). Without one it is
read-only. The token is never printed, logged or stored.

It listens on loopback unless told otherwise, as ``objq broker`` and ``objq exporter`` do:
its pages show every queue and payload of the store to whoever reaches them. Port 7702 sits
next to the broker's 7700 and the exporter's 7701.
"""

from __future__ import annotations

import logging

import click

from objq_broker.cli.commands import command, objq
from objq_broker.cli.context import Context
from objq_broker.cli.exporter import listen_option, serve_until, stop_on_signals
from objq_broker.errors import missing_extra

#: Where ``objq dashboard`` serves unless ``--listen`` says otherwise.
DEFAULT_LISTEN = "127.0.0.1:7702"
#: The top-level modules of the ``dashboard`` extra (it brings the ``metrics`` one).
_DASHBOARD_MODULES = frozenset({"starlette", "uvicorn", "jinja2", "prometheus_client"})


@command(objq, "dashboard", "a web UI of the store")
@listen_option(DEFAULT_LISTEN, "the pages")
@click.option(
    "--token",
    help="allow retrying and purging dead letters after logging in with this token (default: "
    "$OBJQ_DASHBOARD_TOKEN; none: read-only)",
)
def cmd_dashboard(ctx: Context) -> int:
    try:
        from objq_broker import dashboard
        from objq_broker.dashboard.settings import allowed_hosts_for, token_from
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        if missing not in _DASHBOARD_MODULES:
            raise
        found = exc.__cause__ or exc
        raise missing_extra("objq dashboard", missing, "dashboard", found) from exc
    logging.basicConfig(format="objq dashboard: %(message)s", level=logging.INFO)
    host, port = ctx.args.listen
    settings = dashboard.DashboardSettings(
        token=token_from(ctx.args.token), allowed_hosts=allowed_hosts_for(host)
    )
    stop = stop_on_signals()
    store = ctx.store()
    app = dashboard.create_app(store, settings)
    try:
        server = dashboard.DashboardServer.start(app, host, port)
    except OSError as exc:  # taken, not an address of this host, or a name that resolves to none
        raise OSError(exc.errno, exc.strerror or str(exc), f"--listen {host}:{port}") from exc
    mode = "read-only" if settings.read_only else "actions need the token"
    record = {
        "event": "serving",
        "url": store.url,
        "dashboard": server.url,
        "read_only": settings.read_only,
    }
    said = f"{store.url} at {server.url} ({mode})"
    return serve_until(ctx, "objq dashboard", stop, server, (record, said))
