"""The engine's defaults: what :class:`~objq_broker.engine.commit.Engine` uses for a setting
its caller leaves out. Each setting is kept by the part of the engine that uses it (see
:mod:`~objq_broker.engine.commit`)."""

from __future__ import annotations

#: Most operations one commit applies.
DEFAULT_MAX_BATCH_OPS = 5000
#: Most payload bytes one commit adds.
DEFAULT_MAX_BATCH_BYTES = 16 * 1024 * 1024
#: How long a batch keeps retrying storage errors and conflicts before its ops fail.
DEFAULT_COMMIT_DEADLINE_SECONDS = 30.0
#: How old the cached state may be before a claim or a read fetches it again.
DEFAULT_MAX_STALENESS_SECONDS = 0.2
#: How often an idle consumer engine looks for stale leases to expire (at first: the interval
#: doubles while nothing happens, up to ``engine.loop.MAX_IDLE_TICK_SECONDS``).
DEFAULT_IDLE_TICK_SECONDS = 1.0
#: Ready (or delayed) jobs a queue keeps in the state's head before they move to a run; dead
#: letters and idempotency keys likewise (``docs/runs.md``).
DEFAULT_SPILL_AT = 1_000
#: While the state is smaller than this, payloads larger than the model's inline limit stay in
#: it too: a bodies object would cost a second write per commit and a read per consumer, more
#: than the bytes cost while the state is small. Past it, they go out of line (``bodies/``).
DEFAULT_INLINE_STATE_BYTES = 64 * 1024
