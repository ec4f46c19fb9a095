"""One capped exponential backoff for everything that waits before trying again: a failed
job's next attempt, a commit that lost a compare-and-set race, a routing-table update."""

from __future__ import annotations


def backoff_seconds(attempt: int, base: float, cap: float, jitter: float) -> float:
    """``base * 2**(attempt - 1)``, capped at ``cap``, with "equal jitter": half of it fixed,
    half drawn from ``jitter`` (0 <= jitter < 1, made by the caller so that a replayed
    operation waits exactly as long)."""
    raw = min(cap, base * 2.0 ** max(attempt - 1, 0))
    return raw * (0.5 + 0.5 * jitter)
