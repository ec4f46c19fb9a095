"""``objq exporter``: Prometheus metrics of a whole store, served at ``/metrics``.

Every scrape reads the store once, as ``objq status`` does (it never writes, and takes no part
in the broker election): jobs per queue and state, the oldest ready job's age, the state's
commit counter, size and last commit. A scrape whose read fails answers ``objq_up 0`` (and
counts ``objq_scrape_errors_total``) and logs one line; the exporter keeps serving, and the
next scrape reads again. It runs until SIGTERM or SIGINT, then exits 0.

It listens on loopback unless told otherwise, as ``objq broker`` does: the endpoint has no
authentication and names every queue of the store, so serving it to other hosts is a choice
(``--listen 0.0.0.0:7701``). Port 7701 sits next to ``objq broker``'s 7700; not 9464, the
default of the OpenTelemetry Prometheus exporter, which a Python worker on the same host may
already serve (the exporter range 9100-9999 of Prometheus's port list is fully allocated).
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any, Protocol

import click

from objq_broker.cli.commands import F, command, objq
from objq_broker.cli.context import Context
from objq_broker.cli.values import LISTEN
from objq_broker.errors import missing_extra

#: Where ``objq exporter`` serves unless ``--listen`` says otherwise.
DEFAULT_LISTEN = "127.0.0.1:7701"
#: How often the waiting main thread looks at its stop flag (a signal also wakes it).
STOP_CHECK_SECONDS = 1.0
#: The top-level module of the ``metrics`` extra.
_PROMETHEUS_MODULE = "prometheus_client"


def metrics_module(needs: str) -> ModuleType:
    """``objq_broker.metrics``, or the error saying ``needs`` wants the ``metrics`` extra."""
    try:
        from objq_broker import metrics
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] != _PROMETHEUS_MODULE:
            raise
        found = exc.__cause__ or exc
        raise missing_extra(needs, _PROMETHEUS_MODULE, "metrics", found) from exc
    return metrics


def serve_metrics(registry: Any, address: tuple[str, int], option: str) -> Any:
    """A started :class:`~objq_broker.metrics.MetricsServer`; an address that cannot be
    listened on is an ``OSError`` naming ``option``."""
    from objq_broker.metrics import MetricsServer

    host, port = address
    try:
        return MetricsServer.start(registry, host, port)
    except OSError as exc:  # taken, not an address of this host, or a name that resolves to none
        raise OSError(exc.errno, exc.strerror or str(exc), f"{option} {host}:{port}") from exc


class Server(Protocol):
    def stop(self) -> None: ...


def stop_on_signals() -> threading.Event:
    """An event SIGTERM and SIGINT set. Made before listening: a SIGTERM from a supervisor
    that starts and stops at once still ends the command cleanly, with status 0."""
    stop = threading.Event()
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda *_: stop.set())
    return stop


def serve_until(
    ctx: Context,
    command: str,
    stop: threading.Event,
    server: Server,
    serving: tuple[dict[str, Any], str],
) -> int:
    """Say that ``server`` is serving (``serving``: the record, and the line after the
    command's name), wait for ``stop``, then stop it and say so; the command's status."""
    record, said = serving
    try:
        ctx.emit(record, f"{command}: {said}")
        while not stop.wait(STOP_CHECK_SECONDS):
            pass
    finally:
        server.stop()
    ctx.emit({"event": "stopped", "url": record["url"]}, f"{command}: stopped")
    return 0


def listen_option(default: str, what: str) -> Callable[[F], F]:
    """``--listen HOST:PORT`` of a command that serves ``what`` over HTTP."""
    return click.option(
        "--listen",
        type=LISTEN,
        default=default,
        metavar="HOST:PORT",
        help=f"where to serve {what} ({default}); other hosts need 0.0.0.0:PORT",
    )


@command(objq, "exporter", "serve Prometheus metrics of the store")
@listen_option(DEFAULT_LISTEN, "/metrics")
def cmd_exporter(ctx: Context) -> int:
    metrics = metrics_module("objq exporter")
    logging.basicConfig(format="objq exporter: %(message)s", level=logging.INFO)
    stop = stop_on_signals()
    store = ctx.store()
    server = serve_metrics(metrics.exporter_registry(store), ctx.args.listen, "--listen")
    record = {"event": "serving", "url": store.url, "metrics": server.url}
    said = f"serving the metrics of {store.url} at {server.url}"
    return serve_until(ctx, "objq exporter", stop, server, (record, said))
