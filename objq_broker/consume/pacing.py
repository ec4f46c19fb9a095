"""How often to look again at something only another process changes (a queue, a result).

Object storage cannot tell a process that an object changed: a consumer finds a message, and a
caller its result, by reading again. Reading every few milliseconds for ever would cost a
request each time; reading at a fixed interval adds up to that interval to every round trip.
A :class:`Pacer` does both in turn: right after something happened it looks again within a few
milliseconds, and while nothing happens the pauses grow by a fixed factor up to a ceiling.
Growing by ``factor`` bounds how late a change is seen: at most ``factor - 1`` of the time
already waited (a factor of 1.25 finds a result that came after 100 ms by about 125 ms), where
doubling would allow the whole time again.

>>> pacer = Pacer(ceiling=0.02, first=0.005, factor=2.0)
>>> [pacer.next() for _ in range(4)]
[0.005, 0.01, 0.02, 0.02]
>>> pacer.reset(); pacer.next()
0.005
"""

from __future__ import annotations

#: The first pause after something happened: a local file or a nearby server answers in less.
FIRST_PAUSE_SECONDS = 0.002
#: How much each pause grows over the one before while nothing happens.
GROWTH = 1.25


class Pacer:
    """Pauses between reads: ``first`` after :meth:`reset`, then growing by ``factor`` up to
    ``ceiling`` (never below ``first``)."""

    def __init__(
        self, ceiling: float, first: float = FIRST_PAUSE_SECONDS, factor: float = GROWTH
    ) -> None:
        if factor < 1.0:
            raise ValueError(f"Pacer factor: expected 1.0 or more, got {factor!r}")
        self.first = first
        self.ceiling = max(ceiling, first)
        self.factor = factor
        self._pause = first

    def reset(self) -> None:
        """Something happened: look again soon."""
        self._pause = self.first

    def peek(self) -> float:
        """The pause :meth:`next` would return, without growing it."""
        return self._pause

    def next(self) -> float:
        """The pause before the next read; the one after it is longer."""
        pause = self._pause
        self._pause = min(pause * self.factor, self.ceiling)
        return pause
