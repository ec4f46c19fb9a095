"""Claims that wait at the broker: a claimer that found nothing parks here until a commit makes
a job claimable in one of its queues, instead of polling or being woken by every commit.

A parked claimer's next try *stands* at the broker's engine: the commit that readies a job in
its queues applies that try too, after its own operations, and answers it with the job. Its
job costs the claimer no commit of its own, and reaches it one write sooner. A commit that
readied *k* jobs in a queue takes the standing tries of that queue's claimers that parked
first, until they ask for *k* jobs. Claimers it could not serve that way (one that was between
tries, one whose try would need a run read first) are woken instead and claim again.

A parked claimer also wakes when the next delayed, backing-off or leased job of its queues
comes due (nothing else would commit then), when the state was read again (its counts start
over: a direct writer's jobs, a takeover) and when the broker stops. A claimer is registered
*before* its claim is committed, so a job readied while that claim was on its way wakes it too:
it never sleeps past a job it missed.

Each try is its own session of the claimer's lane (a client id used by one waiting claim at a
time): try *k* of the request numbered *n* is numbered *n + k*, and a lane numbers its requests
:data:`LANE_STRIDE` apart. A claim that found nothing may still have changed the state (expired
a lease on its way), so a try is never sent again under the number of one before it; a standing
try that no commit took was never applied, and the next try takes its number. A request sent
again after its broker was lost is answered from the mark of whichever try took jobs, never
applied twice.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from objq_broker.engine.batch import Readiness
from objq_broker.engine.commit import Engine
from objq_broker.model.ops import Claim, Op, Outcomes, Session

#: How far apart a lane numbers its requests: room for this many tries of each.
LANE_STRIDE = 1 << 20
#: Most claimers parked at once. Each holds a thread of the broker's server while it waits;
#: past this many, a claim that finds nothing returns at once (its client waits on its own).
DEFAULT_MAX_PARKED = 128


class _Parked:
    """One claimer: the queues it claims from, whether a job for it has come, and its next
    try while that stands at the engine."""

    def __init__(self, queues: Sequence[str], count: int) -> None:
        self.queues = list(queues)
        self.count = count  # jobs it asks for
        self.poked = False
        self.standing: Session | None = None  # the next try, for a commit to take
        self.answer: Future[Outcomes] | None = None  # its outcome, once a commit took it


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
        self._taken: dict[str, int] = {}  # jobs standing tries were given, since the last commit
        self._closed = False
        engine.on_commit(self._committed)
        engine.take_waiting_claims(self)

    def __len__(self) -> int:
        with self._cv:
            return len(self._parked)

    @property
    def standing(self) -> int:
        """How many parked claimers have a try standing at the engine now."""
        with self._cv:
            return sum(p.standing is not None and p.answer is None for p in self._parked)

    def claim(self, session: Session, wait_seconds: float) -> Outcomes:
        """Commit ``session`` (one claim) and try again, parking between tries, until it
        finds jobs (or is refused) or ``wait_seconds`` pass; the last try's outcome."""
        (claim,) = session.ops
        queues, count = (claim.queues, len(claim.tokens)) if isinstance(claim, Claim) else ([], 1)
        deadline = time.monotonic() + wait_seconds

        def numbered(k: int) -> Session:
            return Session(session.client, session.seq + min(k, LANE_STRIDE - 1), session.ops)

        def attempt(k: int) -> Outcomes:
            return self.engine.submit(numbered(k)).result()

        with self._cv:
            no_room = self._closed or len(self._parked) >= self.max_parked or not queues
            if not no_room:
                me = _Parked(queues, count)
                self._parked.append(me)
        if no_room:
            # Outside the lock: the commit that answers may first run the commit listener of
            # an earlier batch, which takes the lock (:meth:`_committed`).
            return attempt(0)
        try:
            result, tried = attempt(0), 0
            while not _found(result):
                tried += 1
                with self._cv:
                    me.standing = numbered(tried)
                    waited = self._park(me, deadline)
                    answer, me.standing, me.answer = me.answer, None, None
                if answer is not None:  # a commit took the standing try: its outcome
                    result = answer.result()
                elif not waited:
                    return result
                else:  # under the standing try's number: no commit applied that one
                    result = attempt(tried)
            return result
        finally:
            with self._cv:
                self._parked.remove(me)
                if me.poked:  # woken for a job it did not take: the next in line may
                    self._poke_next(me.queues)

    def waiting_on(self) -> set[str]:
        """The queues of the standing tries (on the engine's thread, at each commit)."""
        with self._cv:
            return {
                q
                for p in self._parked
                if p.standing is not None and p.answer is None
                for q in p.queues
            }

    def take(
        self, readied: Mapping[str, int], fits: Callable[[Op[Any]], bool]
    ) -> list[tuple[Op[Any], Future[Any]]]:
        """The standing tries a commit that readied ``readied`` jobs per queue applies, first
        parked first, until they ask for as many jobs as it readied (on the engine's thread)."""
        taken: list[tuple[Op[Any], Future[Any]]] = []
        with self._cv:
            left = dict(readied)
            for parked in self._parked:
                if parked.standing is None or parked.answer is not None:
                    continue
                name = next((q for q in parked.queues if left.get(q, 0) > 0), None)
                if name is None or not fits(parked.standing):
                    continue
                given = min(parked.count, left[name])
                left[name] -= given
                self._taken[name] = self._taken.get(name, 0) + given
                parked.answer = Future()
                taken.append((parked.standing, parked.answer))
                if not any(n > 0 for n in left.values()):
                    break
            if taken:
                self._cv.notify_all()  # each taker now waits for its answer instead
        return taken

    def close(self) -> None:
        """Wake every parked claimer for its last try, and park no more."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()

    def _park(self, me: _Parked, deadline: float) -> bool:
        """Wait (holding ``_cv``) until a commit took the standing try, or poked, due or
        closed; False once out of time."""
        while not me.poked and me.answer is None:
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
        if me.answer is None:
            me.poked = False
        return True

    def _committed(self) -> None:
        """After each of the engine's commits (on its thread): poke as many claimers of each
        queue as it got jobs and did not give to standing tries, first parked first."""
        with self._cv:
            taken, self._taken = self._taken, {}
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
                    for _ in range(count - before - taken.get(name, 0)):
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
            if parked.poked or parked.answer is not None:
                continue  # (one a commit took is answered already)
            if any(q in parked.queues for q in queues):
                parked.poked = True
                self._cv.notify_all()
                return True
        return False


def _found(outcomes: Outcomes) -> bool:
    """Whether a try is the last: it took jobs, or was refused."""
    ok, value = outcomes[0]
    return not ok or bool(value)
