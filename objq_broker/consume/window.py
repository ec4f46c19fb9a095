"""The claim-ahead window: how a consumer claims many messages per commit without hoarding them.

A consumer may hand its framework only so many messages at once (Dramatiq's prefetch, kombu's
QoS window): its *room*. Claiming only that room would cost one commit per few messages, so a
:class:`ClaimWindow` claims ahead of it and caches what it claimed:

* The first claim is the size of the consumer's prefetch (``prefetch``). Each time a full
  batch is handed out before the next one has committed (a backlog of short tasks), the window
  doubles, up to ``max_window``: commits, not the consumer, are then the limit.
* While cached messages are still being handed out and at most half the window is left, the
  next claim is submitted at once, so it commits together with the acks of the messages just
  handed out.
* Claims go through :meth:`Queue.then_fill <objq_broker.queue.Queue.then_fill>`: payloads kept
  out of the state are read in parallel, off the consumer's thread, before the claim lands.
* When cached messages wait :data:`HOARD_SECONDS` for room (slow tasks), everything beyond the
  room is given back (released, no attempt counted) and the window starts again from the
  prefetch, so other consumers can run those messages.
* Closing gives back what is cached, including a claim that lands after the close.

Every delivery the window claimed is held until the consumer settles it (:meth:`settle`), so
the window is the :class:`~objq_broker.consume.leases.LeaseHolder` of its consumer: cached and
handed-out deliveries are heartbeated alike.

Two ways in: :meth:`take` blocks up to a timeout when nothing is cached (a thread per consumer,
as Dramatiq and kombu's ``drain_events`` run), :meth:`poll` never blocks (an event loop, as
Celery's worker runs kombu); ``on_claimed`` tells such a loop that a claim has landed.

>>> from objq_broker import Queue
>>> with Queue("memory://window-doc") as q:
...     _ = q.enqueue_many("jobs", [b"a", b"b", b"c"])
...     window = ClaimWindow(q, ["jobs"], prefetch=2, max_window=8)
...     first = window.take(1, timeout=1.0)
...     for delivery in first:
...         q.ack(window.settle(delivery.token))
...     window.close()
...     [d.payload for d in first]
[b'a']
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence, Set
from concurrent.futures import Future

from objq_broker.builders import Delay, Delivery
from objq_broker.errors import ObjqError
from objq_broker.queue import Queue

log = logging.getLogger("objq_broker.consume")

#: Claimed messages that wait this long for room at their consumer are given back.
HOARD_SECONDS = 1.0

#: The queues a window claims from: fixed, or asked for at each claim (to take turns, say).
QueueNames = Sequence[str] | Callable[[], Sequence[str]]

__all__ = ["HOARD_SECONDS", "ClaimWindow", "QueueNames"]


class ClaimWindow:
    """Claims ahead of one consumer over one or several queues; thread-safe.

    ``room`` (an argument of :meth:`take` and :meth:`poll`) is how many messages the consumer
    can take now; None means no limit.

    Parameters:
      queue: the :class:`~objq_broker.queue.Queue` to claim from and settle on.
      queues: the queue names to claim from, or a callable returning them for each claim.
      prefetch: the consumer's own limit (None: none): the first window and the one it starts
        again from after a give-back.
      max_window: most messages claimed ahead of the consumer (cached plus being claimed).
      lease_seconds: the lease of claimed messages (None: each queue's setting).
      hoard_seconds: how long cached messages may wait for room before they are given back.
      on_claimed: called (on another thread, must not block) when a claim made ahead lands.
    """

    def __init__(
        self,
        queue: Queue,
        queues: QueueNames,
        *,
        prefetch: int | None,
        max_window: int,
        lease_seconds: Delay = None,
        hoard_seconds: float = HOARD_SECONDS,
        on_claimed: Callable[[], None] | None = None,
    ) -> None:
        self.queue = queue
        self.queues = queues
        self.prefetch = prefetch
        self.max_window = max(max_window, 1)
        self.lease_seconds = lease_seconds
        self.hoard_seconds = hoard_seconds
        self.on_claimed = on_claimed
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)  # a claim landed, or one was settled
        self._cache: collections.deque[Delivery] = collections.deque()  # claimed, not handed out
        self._in_hand: dict[str, Delivery] = {}  # lease token -> handed out, not settled
        self._lost: set[str] = set()  # tokens in hand whose leases were lost
        self._ahead: Future[list[Delivery]] | None = None  # the claim submitted ahead
        self._asked = 0  # how many it asked for
        self._unwanted = False  # give back what the claim ahead brings (a hoard was given back)
        self._failure: BaseException | None = None  # of the claim ahead, raised at the next take
        self._window = 0  # how many may be claimed ahead; 0 until the first claim
        self._taken_at = 0.0  # when a cached message was last taken (or the cache filled)
        self._idle = False  # the last claim found nothing: claim ahead again only when asked
        self._look_after = False  # asked to look again while a claim was on its way
        self._closed = False

    def __repr__(self) -> str:
        return (
            f"ClaimWindow({self.queue!r}, window={self.window}, cached={self.cached}, "
            f"in_hand={self.in_hand})"
        )

    # --- what the window holds -------------------------------------------------------------

    @property
    def window(self) -> int:
        """How many messages the next claim ahead may bring, cached ones included."""
        return self._window or self._floor()

    @property
    def cached(self) -> int:
        return len(self._cache)

    @property
    def in_hand(self) -> int:
        """How many deliveries are handed out and not settled (lost leases included)."""
        return len(self._in_hand)

    @property
    def closed(self) -> bool:
        return self._closed

    def held(self) -> list[Delivery]:
        """Every delivery whose lease this consumer keeps: cached, and handed out."""
        with self._lock:
            return [*self._cache, *(d for t, d in self._in_hand.items() if t not in self._lost)]

    def drop(self, tokens: Set[str]) -> None:
        """Stop holding deliveries whose leases were lost: cached ones are never handed out,
        handed-out ones are no longer heartbeated and :meth:`settle` says they are gone."""
        with self._lock:
            if any(d.token in tokens for d in self._cache):
                self._cache = collections.deque(d for d in self._cache if d.token not in tokens)
            self._lost.update(t for t in tokens if t in self._in_hand)

    def hold(self, deliveries: Iterable[Delivery]) -> None:
        """Hold deliveries claimed outside the window (a single ``get``) as handed out."""
        with self._lock:
            for delivery in deliveries:
                self._in_hand[delivery.token] = delivery

    def settle(self, token: str) -> Delivery | None:
        """The handed-out delivery with lease ``token``, no longer held: ack or nack it.
        None when it is not held (settled already, or its lease was lost)."""
        with self._lock:
            delivery = self._in_hand.pop(token, None)
            lost = token in self._lost
            self._lost.discard(token)
            self._changed.notify_all()
        return None if lost else delivery

    def give_back(self, tokens: Iterable[str], *, wait: bool = False) -> int:
        """Release held deliveries unprocessed (no attempt counted); returns how many."""
        wanted = set(tokens)
        with self._lock:
            found = [self._in_hand.pop(t) for t in wanted if t in self._in_hand]
            found = [d for d in found if d.token not in self._lost]
            self._lost -= wanted
            if any(d.token in wanted for d in self._cache):
                found += [d for d in self._cache if d.token in wanted]
                self._cache = collections.deque(d for d in self._cache if d.token not in wanted)
            self._changed.notify_all()
        if found:
            self.queue.release(found, wait=wait)
        return len(found)

    # --- taking ----------------------------------------------------------------------------

    def take(
        self, room: int | None, *, timeout: float, queues: Sequence[str] | None = None
    ) -> list[Delivery]:
        """Up to ``room`` messages: cached ones at once, else the claim ahead or a new claim,
        waiting up to ``timeout`` seconds for messages to arrive (with 0, one claim is made and
        waited for). ``queues`` overrides the window's queues for the claims of this call."""
        end = time.monotonic() + timeout
        with self._lock:
            self._raise_failure()
            if not self._cache and self._ahead is not None:
                self._changed.wait_for(self._ahead_landed, timeout)
                self._raise_failure()
            surplus = self._hoard(room)
            got = self._take_cached(room)
            starved = not got and room != 0 and not self._closed and self._ahead is None
            asked = self._size() if starved else 0
        self._release_quietly(surplus)
        if asked:
            names = self._names(queues)
            found = self._claim_now(names, asked, max(end - time.monotonic(), 0.0)) if names else []
            with self._lock:
                late = self._closed
                if not late:
                    self._file(found, asked)
                    got = self._take_cached(room)
            if late:
                self._release_quietly(found)
        self._top_up(_less(room, len(got)), queues, blocking=True)
        return got

    def poll(
        self,
        room: int | None,
        *,
        queues: Sequence[str] | None = None,
        unmetered: Set[str] = frozenset(),
    ) -> list[Delivery]:
        """Up to ``room`` cached messages, never blocking; keeps one claim in flight while the
        consumer could take more, and gives back a hoard while it cannot. Cached messages of
        the ``unmetered`` queues are taken whatever the room: they go to a consumer that has
        room of its own (a no-ack queue claimed along with this consumer's queues)."""
        with self._lock:
            self._raise_failure()
            surplus = self._hoard(room, unmetered)
            got = self._take_cached(room, unmetered)
        self._release_quietly(surplus)
        metered = sum(1 for d in got if d.job.queue not in unmetered)
        self._top_up(_less(room, metered), queues, blocking=False)
        return got

    def look_again(self) -> None:
        """Claim again even though the last claim found nothing (a poll timer, a new queue)."""
        with self._lock:
            self._idle = False
            # A claim on its way may have been made before what prompted this: if it finds
            # nothing, the next claim still goes out.
            self._look_after = self._ahead is not None

    def wait(self, predicate: Callable[[], bool], timeout: float | None) -> bool:
        """Wait until ``predicate()`` holds (checked whenever a delivery is settled, a claim
        lands or :meth:`notify` is called) or ``timeout`` passes; returns the predicate."""
        with self._changed:
            return self._changed.wait_for(predicate, timeout)

    def notify(self) -> None:
        """Wake :meth:`wait` (the consumer's own room changed)."""
        with self._changed:
            self._changed.notify_all()

    # --- giving back -----------------------------------------------------------------------

    def release_held(self, *, wait: bool = True) -> int:
        """Give back everything held, cached and handed out (a claim still landing included),
        unprocessed; returns how many. Storage errors are logged: those leases run out."""
        self._await_ahead()
        with self._lock:
            found = self.held()
            self._cache.clear()
            self._in_hand.clear()
            self._lost.clear()
            self._changed.notify_all()
        self._release_quietly(found, wait=wait)
        return len(found)

    def close(self) -> None:
        """Claim nothing more and give back what is cached, including a claim still landing.
        Deliveries handed out stay held until settled (their consumer finishes them)."""
        with self._lock:
            self._closed = True
            self._changed.notify_all()
        self._await_ahead()
        with self._lock:
            cached = list(self._cache)
            self._cache.clear()
        self._release_quietly(cached)

    # --- internals (called holding the lock unless said otherwise) -----------------------

    def _floor(self) -> int:
        return min(max(self.prefetch or self.max_window, 1), self.max_window)

    def _size(self) -> int:
        if not self._window:
            self._window = self._floor()
        return self._window

    def _names(self, queues: Sequence[str] | None) -> list[str]:
        source = self.queues if queues is None else queues
        return list(source() if callable(source) else source)

    def _ahead_landed(self) -> bool:
        return bool(self._cache) or self._ahead is None or self._closed

    def _raise_failure(self) -> None:
        failure, self._failure = self._failure, None
        if failure is not None:
            raise failure

    def _take_cached(self, room: int | None, unmetered: Set[str] = frozenset()) -> list[Delivery]:
        if unmetered and any(d.job.queue in unmetered for d in self._cache):
            got, kept, metered = [], collections.deque[Delivery](), 0
            for delivery in self._cache:  # in cache order: they go out as they were claimed
                if delivery.job.queue in unmetered:
                    got.append(delivery)
                elif room is None or metered < room:
                    got.append(delivery)
                    metered += 1
                else:
                    kept.append(delivery)
            self._cache = kept
        else:
            count = len(self._cache) if room is None else min(max(room, 0), len(self._cache))
            got = [self._cache.popleft() for _ in range(count)]
        if got:
            self._taken_at = time.monotonic()
            self._in_hand.update((d.token, d) for d in got)
        return got

    def _file(self, found: list[Delivery], asked: int) -> None:
        """Cache a claim's deliveries. A full batch arriving when the cache is already empty
        means commits, not the consumer, are the limit: claim more at once from now on."""
        starved = not self._cache
        if starved and found and len(found) >= asked:
            self._window = min(self._size() * 2, self.max_window)
        if starved:
            self._taken_at = time.monotonic()
        self._idle = not found and not self._look_after
        self._look_after = False
        if (
            self._cache
            and found
            and min(d.job.priority for d in found) < max(d.job.priority for d in self._cache)
        ):
            # A claim returns its jobs best first; one that landed later may hold better jobs
            # than those still cached (a high-priority message sent after a low one was
            # claimed ahead): hand those out first, as the queue itself would have.
            self._cache = collections.deque(
                sorted([*self._cache, *found], key=lambda d: d.job.priority)
            )
            return
        self._cache.extend(found)

    def _hoard(self, room: int | None, unmetered: Set[str] = frozenset()) -> list[Delivery]:
        """What to give back when nothing was taken for a while: the consumer, not commits,
        is the limit. Keeps what the room allows (and the ``unmetered`` queues' messages, which
        are handed out now); the window starts again from the prefetch."""
        if room is None or not self._cache:
            return []  # (no limit: the cache is handed out now)
        if unmetered:
            room += sum(1 for d in self._cache if d.job.queue in unmetered)
        if time.monotonic() - self._taken_at < self.hoard_seconds:
            return []
        self._window = self._floor()
        self._taken_at = time.monotonic()
        self._unwanted = self._ahead is not None
        keep = min(max(room, 0), len(self._cache))
        return [self._cache.pop() for _ in range(len(self._cache) - keep)]

    def _top_up(self, room: int | None, queues: Sequence[str] | None, *, blocking: bool) -> None:
        """Submit the next claim when at most half the window is left (takes the lock).
        ``room``: what the consumer can still take after this call."""
        with self._lock:
            if self._closed or self._idle or self._ahead is not None or self._failure:
                return
            # A blocking taker claims for itself once the cache is empty; a polling one needs
            # a claim in flight, unless its consumer has no room (an ack will poll again).
            if not self._cache and (blocking or room == 0):
                return
            window = self._size()
            free = window - len(self._cache)
            if free < max(1, window // 2):
                return
            names = self._names(queues)
            if not names:
                return
            # In the order the names come: the integration orders them (kombu's channel).
            claim = self.queue.submit_claim(names, free, lease=self.lease_seconds, ordered=True)
            self._ahead, self._asked = self.queue.then_fill(claim), free
            self._ahead.add_done_callback(self._landed)

    def _landed(self, claim: Future[list[Delivery]]) -> None:
        """The claim made ahead committed, payloads loaded (on the thread that finished it)."""
        surplus: list[Delivery] = []
        with self._lock:
            if claim is not self._ahead:
                return
            error = claim.exception()
            found = [] if error is not None else claim.result()
            self._ahead = None
            asked, self._asked = self._asked, 0
            unwanted, self._unwanted = self._unwanted, False
            if error is not None:
                self._failure = error
            elif self._closed or unwanted:
                surplus = found
            else:
                self._file(found, asked)
            self._changed.notify_all()
        self._release_quietly(surplus)
        if self.on_claimed is not None:
            self.on_claimed()

    def _await_ahead(self) -> None:
        """Wait (up to a commit's deadline) for the claim made ahead to land (takes the lock)."""
        with self._changed:
            self._changed.wait_for(lambda: self._ahead is None, self.queue.commit_deadline_seconds)

    def _claim_now(self, names: list[str], count: int, timeout: float) -> list[Delivery]:
        """Claim ``count`` and wait for them, up to ``timeout`` for any to arrive (no lock).
        ``Queue.claim`` is woken at once by this process's own commits (a local enqueue)."""
        wait = timeout if timeout > 0 else None
        return self.queue.claim(names, count, lease=self.lease_seconds, timeout=wait, ordered=True)

    def _release_quietly(self, deliveries: list[Delivery], *, wait: bool = False) -> None:
        """Release without raising (no lock): a release that fails leaves leases that run out."""
        if not deliveries:
            return
        try:
            self.queue.release(deliveries, wait=wait)
        except ObjqError as exc:
            n = len(deliveries)
            log.warning("could not give back %d messages (%s); their leases run out", n, exc)


def _less(room: int | None, taken: int) -> int | None:
    return None if room is None else max(room - taken, 0)
