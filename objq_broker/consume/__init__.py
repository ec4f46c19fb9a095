"""What every consumer needs, whatever framework it serves: lease keeping, the claim-ahead
window, payload filling, and the parsing of its settings.

* :mod:`~objq_broker.consume.leases`: :class:`LeaseKeeper`, one thread per process (or
  connection) that extends every held lease in one operation per interval and drops the ones
  that were lost.
* :mod:`~objq_broker.consume.window`: :class:`ClaimWindow`, the claims made ahead of a
  consumer (payloads loaded off its thread), their doubling under a backlog and their give-back
  after :data:`HOARD_SECONDS` without room.
* the parsing of positive seconds and counts from the environment or an option bag, refused
  with a :class:`~objq_broker.errors.ConfigurationError` that says which (it lives in
  :mod:`objq_broker.model.settings`, since the broker's options use it too).

The integrations (:mod:`objq_broker.dramatiq`, :mod:`objq_broker.kombu`, ``objq worker``)
translate between their framework and these; nothing here knows a framework.
"""

from __future__ import annotations

from objq_broker.consume.leases import LeaseHolder, LeaseKeeper, interval_for
from objq_broker.consume.window import HOARD_SECONDS, ClaimWindow
from objq_broker.model.settings import (
    option_count,
    option_seconds,
    positive_count,
    positive_seconds,
    seconds_from_env,
)

__all__ = [
    "HOARD_SECONDS",
    "ClaimWindow",
    "LeaseHolder",
    "LeaseKeeper",
    "interval_for",
    "option_count",
    "option_seconds",
    "positive_count",
    "positive_seconds",
    "seconds_from_env",
]
