"""``objq broker``: a dedicated broker for a namespace, or its standby.

It takes part in the election like any process of an ``auto`` namespace, but does nothing
else: when no broker holds the namespace it takes over and commits for every client
(``Queue(url, broker="auto")`` or ``"client"``, or ``broker="host:port"`` to name it); when one
does, it stands by and takes over once that one has been unreachable for the takeover time.
It runs until SIGTERM or SIGINT, then commits what is pending and clears its record.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

import click

from objq_broker.broker.settings import BrokerOptions
from objq_broker.cli.commands import command, objq
from objq_broker.cli.context import Context
from objq_broker.cli.exporter import metrics_module, serve_metrics
from objq_broker.cli.output import printable
from objq_broker.cli.values import LISTEN, setting
from objq_broker.errors import ConfigurationError, ObjqError
from objq_broker.model.settings import env_names
from objq_broker.queue import Queue

#: Where a dedicated broker listens unless told (a fixed port, for clients to name).
DEFAULT_LISTEN = "127.0.0.1:7700"
#: How often a standby checks that the broker still answers.
STANDBY_CHECK_SECONDS = 1.0


@command(objq, "broker", "commit for other processes (or stand by)")
@click.option(
    "--listen",
    help="host:port to serve on ($OBJQ_BROKER_LISTEN, else 127.0.0.1:7700); beyond loopback needs "
    "$OBJQ_BROKER_TOKEN",
)
@click.option(
    "--advertise",
    help="host:port other hosts reach this broker at (default: the address listened on)",
)
@click.option(
    "--takeover-seconds",
    type=setting(BrokerOptions, "broker_takeover_seconds"),
    help="how long the broker may be unreachable before a standby takes over (5)",
)
@click.option(
    "--metrics-listen",
    type=LISTEN,
    metavar="HOST:PORT",
    help="serve the broker's Prometheus metrics at http://HOST:PORT/metrics",
)
def cmd_broker(ctx: Context) -> int:
    try:
        from objq_broker.broker.elected import ElectedCommitter
        from objq_broker.broker.settings import BrokerOptions, broker_settings
    except ModuleNotFoundError as exc:
        raise ConfigurationError(f"objq broker needs pyzmq ({exc}): pip install pyzmq") from exc
    logging.basicConfig(format="objq broker: %(message)s", level=logging.INFO)
    ctx.snapshot(create=True)  # a missing bucket or a corrupt state fails here, in one line
    # A dedicated broker listens on a fixed port unless told, for clients to name it.
    listen_env = env_names(BrokerOptions)["broker_listen"]
    listen = ctx.args.listen or os.environ.get(listen_env) or DEFAULT_LISTEN
    options = {"broker_listen": listen, "broker_advertise": ctx.args.advertise}
    if ctx.args.takeover_seconds is not None:
        options["broker_takeover_seconds"] = ctx.args.takeover_seconds
    settings = broker_settings("auto", {k: v for k, v in options.items() if v is not None})
    # A queue whose committer is the elected one: its store counts requests for the metrics.
    queue = Queue(store=ctx.store(create=True), broker=settings)
    committer = queue.committer
    if not isinstance(committer, ElectedCommitter):  # "auto" always elects
        raise AssertionError(f"objq broker: expected an elected committer, found {committer!r}")
    stop = threading.Event()
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda *_: stop.set())
    server = None
    if ctx.args.metrics_listen is not None:
        registry = metrics_module("objq broker --metrics-listen").worker_registry(queue)
        server = serve_metrics(registry, ctx.args.metrics_listen, "--metrics-listen")
    metrics_url = None if server is None else server.url
    role = ""
    try:
        while not stop.is_set():
            try:
                committer.check()  # a standby finds a lost broker here
            except ObjqError as exc:
                logging.getLogger("objq_broker.broker").warning("%s", exc)
            if committer.role != role:
                role = committer.role
                _announce(ctx, committer.role, committer.record, metrics_url)
            stop.wait(STANDBY_CHECK_SECONDS)
    finally:
        queue.close()
        if server is not None:
            server.stop()
    return 0


def _announce(ctx: Context, role: str, record: object, metrics_url: str | None) -> None:
    address = getattr(record, "address", None)
    event = "serving" if role == "leader" else "standby"
    epoch = getattr(record, "epoch", None)
    said = {"event": event, "address": address, "epoch": epoch, "url": ctx.store().url}
    # The address comes from the broker record in the store: shown escaped, as any stored text.
    shown = printable(
        f"objq broker: {event} {ctx.store().url}: broker at {address} (epoch {epoch})"
    )
    if metrics_url is not None:
        said["metrics"] = metrics_url
        shown += f"; metrics at {metrics_url}"
    ctx.emit(said, shown)
    sys.stdout.flush()
