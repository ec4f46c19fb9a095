"""How long commits take, as a histogram: the tail an operator alerts on, which a sum hides.

Fixed buckets from 1 ms (a local disk) to 10 s (a commit retrying storage errors), so
histograms of every process of a namespace add up bucket by bucket in Prometheus.

>>> durations = Durations()
>>> for seconds in (0.0004, 0.003, 0.003, 20.0):
...     durations.observe(seconds)
>>> durations.cumulative()[:4], durations.cumulative()[-1]
([(0.001, 1), (0.0025, 1), (0.005, 3), (0.01, 3)], (inf, 4))
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

#: Upper bounds of the buckets, in seconds (the last bucket, +Inf, takes the rest).
COMMIT_SECONDS_BOUNDS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip


@dataclass
class Durations:
    """Counts per bucket (not cumulative; the last is +Inf) and the sum, of one writer's
    observations; read from other threads, whose view may lag by one observation."""

    bounds: tuple[float, ...] = COMMIT_SECONDS_BOUNDS
    counts: list[int] = field(default_factory=list)
    total_seconds: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, seconds: float) -> None:
        # bisect_left: a duration equal to a bound belongs to that bound's bucket (le).
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.total_seconds += seconds

    def merged(self, other: Durations) -> Durations:
        """Both together (same bounds)."""
        counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        return Durations(self.bounds, counts, self.total_seconds + other.total_seconds)

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, observations at most that long)`` per bucket, ending with +Inf."""
        running, buckets = 0, []
        for bound, count in zip((*self.bounds, math.inf), self.counts, strict=True):
            running += count
            buckets.append((bound, running))
        return buckets
