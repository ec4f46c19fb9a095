"""The one seam between the API and whatever commits its operations.

:class:`~objq_broker.queue.Queue`, :class:`~objq_broker.aio.AsyncQueue` and the consumer core
(:mod:`objq_broker.consume`) talk to a :class:`Committer` and nothing else: they submit
operations (:mod:`objq_broker.model.ops`, plain data) and wait on futures. The local group-commit
loop (:class:`~objq_broker.engine.commit.Engine`) is one implementation; a client that forwards
operations to the process elected to commit for a namespace is another. Nothing above this seam
knows which one it has.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol, TypeVar

from objq_broker.engine.batch import EngineMetrics, Settles
from objq_broker.engine.bodies import BodyCache
from objq_broker.model.ops import Claim, Op
from objq_broker.model.records import Job

T = TypeVar("T")


class Committer(Protocol):
    """Takes operations and returns futures that resolve once each is durable (or failed)."""

    @property
    def bodies(self) -> BodyCache:
        """Payload bodies kept out of the state, read (and cached) by reference."""
        ...

    @property
    def commit_deadline_seconds(self) -> float:
        """How long one commit keeps retrying before its operations fail."""
        ...

    @property
    def metrics(self) -> EngineMetrics:
        """Counters of what was committed and what it cost."""
        ...

    def submit(self, op: Op[T]) -> Future[T]:
        """Queue ``op`` for a commit. Raises :class:`~objq_broker.errors.QueueClosed` once
        closed. The future holds the result, or the error that refused this op alone."""
        ...

    def submit_to(self, items: list[tuple[Op[Any], Settles]]) -> None:
        """Queue each op of ``items`` for a commit (all at once: the next batch takes them
        together), and settle its outcome with its result (or the error that refused it)
        once it is durable: what :meth:`submit` does with a future of its own, for a caller
        that waits its own way (an event loop)."""
        ...

    def commit_here(self, items: list[tuple[Op[Any], Settles]]) -> bool:
        """Commit ``items`` as one batch in the caller's thread, each outcome settled, when
        this committer can and nothing else is pending (True); else do nothing (False)."""
        ...

    def call(self, op: Op[T]) -> T:
        """Commit ``op`` and wait until it is durable: its result, or the error that refused
        it. Blocks the caller (which may commit it itself, when nothing else is pending)."""
        ...

    def claim_waiting(self, claim: Claim, wait_seconds: float) -> list[Job] | None:
        """Commit ``claim`` and, while it finds nothing, let it wait up to ``wait_seconds``
        where the commits happen (a broker), so one new job wakes one claimer and nobody
        polls. Blocks the caller. None if this committer cannot: the caller submits the claim
        and waits for commits itself."""
        ...

    def flush(self, timeout: float | None = None) -> None:
        """Wait until everything submitted so far is durable (or failed)."""
        ...

    def close(self, timeout: float | None = None) -> None:
        """Commit what is pending, then stop; later submits raise ``QueueClosed``."""
        ...

    def on_commit(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after each commit (from any thread; it must not block). A claimer
        waiting for jobs uses it to look again at once instead of polling."""
        ...

    @property
    def readied(self) -> object:
        """A mark that moves whenever a commit this committer learned of made jobs claimable
        (never for a claim that found nothing, or an ack): compared between two
        :meth:`on_commit` calls, it says whether looking for jobs again is worth a claim."""
        ...

    @property
    def closed(self) -> bool: ...
