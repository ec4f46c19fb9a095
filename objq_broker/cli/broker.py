"""``objq broker``: run a dedicated broker for a namespace (preview).

The broker commits every operation its clients send (``Queue(url, broker="host:port")``), so
many processes share a namespace without racing each other's compare-and-set writes. It runs
until SIGTERM or SIGINT, then finishes the requests in progress and commits what is pending.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

from objq_broker.cli.context import Context
from objq_broker.errors import ConfigurationError

#: Environment variable holding the shared token clients present.
TOKEN_ENV = "OBJQ_BROKER_TOKEN"


def cmd_broker(ctx: Context) -> int:
    try:
        from objq_broker.broker.server import serve
    except ModuleNotFoundError as exc:
        raise ConfigurationError(
            f"objq broker needs grpcio ({exc}): pip install 'objq-broker[broker]'"
        ) from exc
    logging.basicConfig(format="objq broker: %(message)s", level=logging.INFO)
    ctx.snapshot(create=True)  # a missing bucket or a corrupt state fails here, in one line
    token = os.environ.get(TOKEN_ENV) or None
    server = serve(ctx.store(create=True), listen=ctx.args.listen, token=token)
    stop = threading.Event()
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda *_: stop.set())
    ctx.emit(
        {"event": "serving", "address": server.address, "url": ctx.store().url},
        f"objq broker: serving {ctx.store().url} on {server.address}",
    )
    sys.stdout.flush()
    stop.wait()
    server.stop()
    return 0
