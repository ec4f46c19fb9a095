"""Claims that wait at the broker: a claimer that found nothing parks here until a commit makes
a job claimable in one of its queues, instead of polling or being woken by every commit.

A commit that readied *k* jobs in a queue wakes the *k* claimers of that queue that parked first,
so one enqueue sends one claim, not one per idle worker. A parked claimer also wakes when the
next delayed, backing-off or leased job of its queues comes due (nothing else would commit
then), when the state was read again (its counts start over: a direct writer's jobs, a takeover)
and when the broker stops. A claimer is registered *before* its claim is committed, so a job
readied while that claim was on its way wakes it too: it never sleeps past a job it missed.

The claims themselves are ordinary operations committed by the broker's engine; parking only
decides when to commit them again. Each try is its own session of the claimer's lane (a client id
used by one waiting claim at a time): try *k* of the request numbered *n* is numbered *n + k*, and
a lane numbers its requests :data:`LANE_STRIDE` apart. A claim that found nothing may still have
changed the state (expired a lease on its way), so a try is never sent again under the number
of one before it; and a request sent again after its broker was lost is answered from the
mark of whichever try took jobs, never applied twice.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Sequence

from objq_broker.engine.commit import Engine, Readiness
from objq_broker.model.ops import Claim, Outcomes, Session

#: How far apart a lane numbers its requests: room for this many tries of each.
LANE_STRIDE = 1 << 20
#: Most claimers parked at once. Each holds a thread of the broker's server while it waits;
#: past this many, a claim that finds nothing returns at once (its client waits on its own).
DEFAULT_MAX_PARKED = 128


class _Parked:
    """One claimer: the queues it claims from, and whether a job for it has come."""

    def __init__(self, queues: Sequence[str]) -> None:
        self.queues = list(queues)
        self.poked = False


class ClaimPark:
    """The claimers parked at ``engine`` (a broker's own), woken by its commits."""

    def __init__(self, engine: Engine, *, max_parked: int = DEFAULT_MAX_PARKED) -> None:
        self.engine = engine
        self.max_parked = max_parked
        self._cv = threading.Condition()
        self._parked: list[_Parked] = []  # registered claimers, first come first
        self._state = 0  # which state object the counts below belong to
        self._counts: dict[str, int] = {}  # jobs readied per queue, as of the last commit
        self._due: dict[str, float] = {}  # next timed job per queue (wall clock)
        self._closed = False
        engine.on_commit(self._committed)

    def __len__(self) -> int:
        with self._cv:
            return len(self._parked)

    def claim(self, session: Session, wait_seconds: float) -> Outcomes:
        """Commit ``session`` (one claim) and try again, parking between tries, until it
        finds jobs (or is refused) or ``wait_seconds`` pass; the last try's outcome."""
        (claim,) = session.ops
        queues = claim.queues if isinstance(claim, Claim) else []
        deadline = time.monotonic() + wait_seconds
        tries = itertools.count()

        def attempt() -> Outcomes:
            k = min(next(tries), LANE_STRIDE - 1)
            again = Session(session.client, session.seq + k, session.ops)
            return self.engine.submit(again).result()

        with self._cv:
            no_room = self._closed or len(self._parked) >= self.max_parked or not queues
            if not no_room:
                me = _Parked(queues)
                self._parked.append(me)
        if no_room:
            # Outside the lock: the commit that answers may first run the commit listener of
            # an earlier batch, which takes the lock (:meth:`_committed`).
            return attempt()
        try:
            while True:
                result = attempt()
                if _found(result):
                    return result
                with self._cv:
                    if not self._park(me, deadline):
                        return result
        finally:
            with self._cv:
                self._parked.remove(me)
                if me.poked:  # woken for a job it did not take: the next in line may
                    self._poke_next(me.queues)

    def close(self) -> None:
        """Wake every parked claimer for its last try, and park no more."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()

    def _park(self, me: _Parked, deadline: float) -> bool:
        """Wait (holding ``_cv``) until poked, due or closed; False once out of time."""
        while not me.poked:
            now = time.monotonic()
            if self._closed or now >= deadline:
                return False
            timeout = deadline - now
            due = min((self._due[q] for q in me.queues if q in self._due), default=None)
            if due is not None:
                until_due = due - self.engine.clock()
                if until_due > 0:  # a due job the last claim did not take is no reason to spin
                    timeout = min(timeout, until_due + 0.001)
            if not self._cv.wait(timeout) and due is not None and time.monotonic() < deadline:
                return True  # the due time came: look again
        me.poked = False
        return True

    def _committed(self) -> None:
        """After each of the engine's commits (on its thread): poke as many claimers of each
        queue as it got jobs, first parked first."""
        with self._cv:
            if not self._parked:
                return
            names = {q for parked in self._parked for q in parked.queues}
            now = self.engine.readiness(names)
            if now.state != self._state:
                self._restart(now)
                return
            for name in names:
                before = self._counts.get(name)
                count = now.readied.get(name, 0)
                self._counts[name] = count
                if before is not None:
                    for _ in range(count - before):
                        if not self._poke_next([name]):
                            break
            self._note_due(now)

    def _restart(self, now: Readiness) -> None:
        """A state read anew: counts start over, and every claimer looks again."""
        self._state = now.state
        self._counts = dict(now.readied)
        self._note_due(now)
        for parked in self._parked:
            parked.poked = True
        self._cv.notify_all()

    def _note_due(self, now: Readiness) -> None:
        self._due = dict(now.due)

    def _poke_next(self, queues: Sequence[str]) -> bool:
        """Poke the first claimer of any of ``queues`` not poked yet (holding ``_cv``)."""
        for parked in self._parked:
            if not parked.poked and any(q in parked.queues for q in queues):
                parked.poked = True
                self._cv.notify_all()
                return True
        return False


def _found(outcomes: Outcomes) -> bool:
    """Whether a try is the last: it took jobs, or was refused."""
    ok, value = outcomes[0]
    return not ok or bool(value)
