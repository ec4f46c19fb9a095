"""A Dramatiq broker on objq: change the broker line, keep every actor and middleware.

>>> import dramatiq
>>> from objq_broker.dramatiq import ObjqBroker
>>> broker = ObjqBroker(url="memory://dramatiq-doc")
>>> dramatiq.set_broker(broker)

Each Dramatiq queue ``Q`` is an objq queue ``Q`` (and its delay queue ``Q.DQ`` another); the
messages a worker process holds are leases that one heartbeat per broker extends. What maps to
what, the settings, results and rate limits: ``docs/dramatiq.md``.

Checked before anything is stored (a :class:`~objq_broker.errors.ConfigurationError`, a
``ValueError``, names what was refused): the broker's settings when it is built, an actor's
``broker_priority`` when it is declared, and a message's ``broker_priority`` (a whole number
within ±(2**31 - 1); ``True``, ``1.5``, ``"3"`` refused) and ``delay`` (finite milliseconds,
at most about a century either way) when it is sent.
"""

from __future__ import annotations

try:
    import dramatiq  # noqa: F401  (checked here: every module of this package needs it)
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the environment
    raise ModuleNotFoundError(
        "objq_broker.dramatiq needs Dramatiq: pip install 'objq-broker[dramatiq]'"
    ) from exc

from objq_broker.dramatiq.broker import (
    DEFAULT_DEAD_MESSAGE_TTL_MS,
    DEFAULT_MAX_CLAIM,
    DEFAULT_MAX_DELIVERIES,
    LEASE_ENV,
    ObjqBroker,
)
from objq_broker.model.records import DEFAULT_LEASE_SECONDS

# The result and rate-limiter backends are importable from here, with the broker.
from objq_broker.results.dramatiq import ObjqRateLimiterBackend, ObjqResultBackend

__all__ = [
    "DEFAULT_DEAD_MESSAGE_TTL_MS",
    "DEFAULT_LEASE_SECONDS",
    "DEFAULT_MAX_CLAIM",
    "DEFAULT_MAX_DELIVERIES",
    "LEASE_ENV",
    "ObjqBroker",
    "ObjqRateLimiterBackend",
    "ObjqResultBackend",
]
