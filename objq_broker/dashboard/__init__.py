"""``objq dashboard``: a web UI of one store (the ``dashboard`` extra:
``pip install 'objq-broker[dashboard]'``).

Pages of the queues (live depth and rate charts), a queue's jobs by state (paged), one job
(its payload, and a Dramatiq or Celery message decoded), the workers that hold jobs, dead
letters, the archive of finished jobs, and the elected broker; ``/metrics`` serves the
Prometheus families of :class:`~objq_broker.metrics.StoreCollector`. Every page reads the
store through the read-only snapshot that ``objq status`` reads. Retrying and purging dead
letters go through :class:`~objq_broker.Queue`, and only with a token (see
:mod:`~objq_broker.dashboard.security`).

The modules: :mod:`~objq_broker.dashboard.app` (the Starlette application),
:mod:`~objq_broker.dashboard.pages` and :mod:`~objq_broker.dashboard.actions` (its routes),
:mod:`~objq_broker.dashboard.reading` (what the pages show), :mod:`~objq_broker.dashboard.decode`
(payloads), :mod:`~objq_broker.dashboard.security` (token, logins, cross-site checks),
:mod:`~objq_broker.dashboard.server` (uvicorn in a thread).
"""

from __future__ import annotations

try:  # the boundary of the optional extra
    import jinja2  # noqa: F401
    import starlette  # noqa: F401
    import uvicorn  # noqa: F401
except ImportError as exc:
    # ImportError, not only ModuleNotFoundError: a partial or broken install fails that way.
    raise ModuleNotFoundError(
        f"the objq dashboard needs starlette, uvicorn and jinja2 ({exc}); install them with: "
        "pip install 'objq-broker[dashboard]'",
        name=exc.name,
    ) from exc

from objq_broker.dashboard.app import create_app
from objq_broker.dashboard.server import DashboardServer
from objq_broker.dashboard.settings import TOKEN_ENV, DashboardSettings

__all__ = ["TOKEN_ENV", "DashboardServer", "DashboardSettings", "create_app"]
