"""One heartbeat for every delivery a process holds.

A delivery stays leased only while someone extends its lease; a consumer that stops (killed,
hung, lost host) stops extending, and its deliveries come back to the queue once their leases
run out. A :class:`LeaseKeeper` is the one thread per process (or connection) that extends them:
every interval it asks each registered :class:`LeaseHolder` what it holds (prefetched, running,
waiting for an ETA), extends all of it in **one** ``Queue.heartbeat`` operation, and tells each
holder which of its leases were lost (expired before a heartbeat, so another consumer may have
the job now) so that the holder stops holding them. A lost lease is logged once, then dropped.

Holders are kept by weak reference: a consumer that is dropped without being closed stops being
heartbeated, and its deliveries come back after the lease, as if its process had died.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Sequence, Set
from typing import Protocol

from objq_broker.builders import Delay, Delivery
from objq_broker.errors import ConfigurationError, QueueClosed
from objq_broker.queue import Queue

log = logging.getLogger("objq_broker.consume")

#: Shortest interval between two heartbeats, whatever the lease.
MIN_INTERVAL_SECONDS = 0.05
#: How many ids of lost leases one log line shows.
_LOGGED_IDS = 20

__all__ = ["MIN_INTERVAL_SECONDS", "LeaseHolder", "LeaseKeeper", "interval_for"]


class LeaseHolder(Protocol):
    """Something that holds deliveries: a consumer, a channel, a worker.

    Both methods are called from the keeper's thread and must be thread-safe and quick.
    """

    def held(self) -> Sequence[Delivery]:
        """The deliveries whose leases must be extended now."""
        ...

    def drop(self, tokens: Set[str]) -> None:
        """Stop holding the deliveries with these lease tokens: their leases were lost, and a
        later ack or nack of them would be refused."""
        ...


def interval_for(lease_seconds: float) -> float:
    """How often to extend leases of ``lease_seconds``: a third of them, so two heartbeats in
    a row may fail before a lease runs out."""
    return max(lease_seconds / 3.0, MIN_INTERVAL_SECONDS)


def heartbeat_every(lease: float, every: float | None, where: str, names: tuple[str, str]) -> float:
    """How often a holder extends leases of ``lease`` seconds: ``every``, or a third of the
    lease. ``names`` are the two settings' names as the caller's user gives them (lease,
    interval), for the error: a lease too short for a third of it to be a number of seconds
    (a float's smallest, say) is refused as the lease, not as an interval nobody gave."""
    lease_name, every_name = names
    interval = every or lease / 3.0
    if not interval > 0:
        raise ConfigurationError(
            f"{where}: {lease_name}: expected a lease long enough to extend every third of it, "
            f"found {lease!r} s"
        )
    if interval >= lease:
        raise ConfigurationError(
            f"{where}: {every_name}: expected less than {lease_name} ({lease:g} s), "
            f"found {interval:g}"
        )
    return interval


class LeaseKeeper:
    """Extends, every ``interval_seconds``, the leases of everything its holders hold, in one
    operation on ``queue``.

    ``lease_seconds``: the new lease of each delivery (None: each queue's own setting).

    >>> from objq_broker import Queue
    >>> with Queue("memory://lease-keeper-doc") as q:
    ...     _ = q.enqueue("jobs", b"work")
    ...     held = q.claim("jobs")
    ...     class Worker:
    ...         def held(self): return held
    ...         def drop(self, tokens): held.clear()
    ...     worker = Worker()
    ...     keeper = LeaseKeeper(q, interval_seconds=10.0, name="doc-heartbeat")
    ...     keeper.register(worker)
    ...     keeper.beat()  # what the thread does every interval
    ...     keeper.stop()
    0
    """

    def __init__(
        self,
        queue: Queue,
        *,
        interval_seconds: float,
        lease_seconds: Delay = None,
        name: str = "objq-heartbeat",
    ) -> None:
        if not interval_seconds > 0:
            raise ConfigurationError(
                f"LeaseKeeper: interval_seconds: expected a positive number of seconds, "
                f"found {interval_seconds!r}"
            )
        self.queue = queue
        self.interval_seconds = max(interval_seconds, MIN_INTERVAL_SECONDS)
        self.lease_seconds = lease_seconds
        self.name = name
        # Weak references by identity (a holder need not be hashable, a dataclass say).
        self._holders: list[weakref.ref[LeaseHolder]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"LeaseKeeper({self.queue!r}, every {self.interval_seconds:g} s)"

    def register(self, holder: LeaseHolder) -> None:
        """Extend ``holder``'s leases from now on (until :meth:`unregister`, or until it is
        garbage collected); starts the thread if it is not running."""
        with self._lock:
            if not any(ref() is holder for ref in self._holders):
                self._holders.append(weakref.ref(holder))
        self.start()

    def unregister(self, holder: LeaseHolder) -> None:
        with self._lock:
            self._holders = [
                ref for ref in self._holders if (kept := ref()) is not None and kept is not holder
            ]

    @property
    def running(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive() and not self._stop.is_set()

    def start(self) -> None:
        """Start the heartbeat thread (no-op while it runs, or once stopped)."""
        with self._lock:
            if self._thread is not None or self._stop.is_set():
                return
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop beating and wait for a heartbeat in progress (up to ``timeout``). The held
        leases then run out on their own unless their holders settle or release them."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_seconds):
            try:
                self.beat()
            except Exception:  # the thread must outlive a bug: the next beat may succeed
                log.exception("%s: heartbeat failed unexpectedly", self.name)

    def beat(self) -> int:
        """One heartbeat now: extend every held lease, drop the lost ones; returns how many
        leases were lost."""
        with self._lock:
            self._holders = [ref for ref in self._holders if ref() is not None]
            holders = [holder for holder in (ref() for ref in self._holders) if holder is not None]
        held = [(holder, list(holder.held())) for holder in holders]
        every = [delivery for _, deliveries in held for delivery in deliveries]
        if not every:
            return 0
        try:
            alive = self.queue.heartbeat(every, lease=self.lease_seconds) or []
        except QueueClosed:
            return 0  # the consumer is shutting down; its stop() follows
        except Exception as exc:  # keep beating: storage may come back before the leases end
            log.warning("%s: heartbeat of %d leases failed: %s", self.name, len(every), exc)
            return 0
        lost_ids: list[str] = []
        flags = iter(alive)
        for holder, deliveries in held:
            lost = {d.token for d, ok in zip(deliveries, flags, strict=False) if not ok}
            if not lost:
                continue
            # A delivery settled since the heartbeat was read lost its lease by being settled.
            lost &= {d.token for d in holder.held()}
            if lost:
                holder.drop(lost)
                lost_ids += [d.id for d in deliveries if d.token in lost]
        if lost_ids:
            log.warning(
                "%s: lost the leases of %d deliveries (expired before a heartbeat; another "
                "consumer may have them): %s",
                self.name,
                len(lost_ids),
                lost_ids[:_LOGGED_IDS],
            )
        return len(lost_ids)
