"""A clock the test moves: what an engine, a queue or a result store reads as the time."""

from __future__ import annotations


class ManualClock:
    """Reads ``now``, which moves only when the test sets it (so a slow server or machine
    cannot make anything expire early or late).

    >>> clock = ManualClock(100.0)
    >>> clock.now += 1.5
    >>> clock()
    101.5
    """

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
