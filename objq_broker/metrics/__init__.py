"""Prometheus metrics of objq (the ``metrics`` extra: ``pip install 'objq-broker[metrics]'``).

Two collectors, for two kinds of process:

* :class:`StoreCollector` — what ``objq status`` shows, read from the store on every scrape:
  jobs per queue and state, the age of the oldest ready job, the state object's commit
  counter, size and last commit, and whether a broker holds the namespace. ``objq exporter``
  serves it; one exporter per store is enough, whatever the number of workers.
* :class:`CommitCollector` — one process's own commit counters (``Queue.metrics()``):
  operations, batches, state reads and writes, conflicts, storage errors. Register it in a
  long-running worker or producer (``objq worker --metrics-listen`` does); these numbers live
  in that process only.

Names follow Prometheus conventions: an ``objq_`` prefix, base units (seconds, bytes),
``_total`` on counters. ``docs/metrics.md`` lists every family and what to alert on.
"""

from __future__ import annotations

try:
    import prometheus_client  # noqa: F401  (the boundary of the optional extra)
except ImportError as exc:
    # ImportError, not only ModuleNotFoundError: a partial or broken install fails that way.
    raise ModuleNotFoundError(
        f"objq metrics need prometheus_client ({exc}); install it with: "
        "pip install 'objq-broker[metrics]'",
        name=exc.name,
    ) from exc

from objq_broker.metrics.commits import CommitCollector
from objq_broker.metrics.serving import MetricsServer, exporter_registry, worker_registry
from objq_broker.metrics.store import StoreCollector

__all__ = [
    "CommitCollector",
    "MetricsServer",
    "StoreCollector",
    "exporter_registry",
    "worker_registry",
]
