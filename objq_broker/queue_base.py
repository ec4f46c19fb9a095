"""What :class:`~objq_broker.queue.Queue` is built on: the committer it opens, futures that
resolve once an operation is durable, payloads loaded out of line, and the wake-ups of claimers
when a commit may have readied jobs. :class:`~objq_broker.aio.AsyncQueue` and the consumer core
(:mod:`objq_broker.consume`) build on these too; the API's methods are in
:mod:`objq_broker.queue`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

from objq_broker import ops
from objq_broker.broker.settings import BrokerSettings
from objq_broker.engine.base import DEFAULT_COMMIT_DEADLINE_SECONDS
from objq_broker.engine.commit import Engine
from objq_broker.engine.port import Committer
from objq_broker.errors import ConfigurationError, PayloadInvalid, StateCorrupt, job_error
from objq_broker.model.ops import (
    Claim,
    Op,
)
from objq_broker.model.records import Job
from objq_broker.ops import Delay, Delivery
from objq_broker.storage import ObjectStore
from objq_broker.storage.metered import MeteredStore

T = TypeVar("T")
log = logging.getLogger("objq_broker.queue")


class QueueBase:
    """The layer of :class:`~objq_broker.queue.Queue` between its methods and its committer
    (see the module's description). ``Queue.__init__`` sets every attribute."""

    store: MeteredStore
    committer: Committer
    owner: str
    implicit_queues: bool
    poll_seconds: float
    max_poll_seconds: float
    _poll_wait: float  # grows while claims find nothing
    _arrivals: threading.Condition
    _commits: int  # batches committed; claimers wait for it to move
    _arrival_listeners: list[Callable[[], None]]
    _readied_seen: object

    @property
    def closed(self) -> bool:
        return self.committer.closed

    @property
    def commit_deadline_seconds(self) -> float:
        return self.committer.commit_deadline_seconds

    # --- futures (shared with AsyncQueue and the consumer core) --------------------------

    def submit(self, op: Op[T]) -> Future[T]:
        """Submit an operation built by :mod:`objq_broker.ops`; the future resolves once it
        is durable."""
        return self.committer.submit(op)

    def submit_claim(
        self,
        queues: str | Sequence[str],
        n: int = 1,
        *,
        lease: Delay = None,
        owner: str | None = None,
    ) -> Future[list[Delivery]]:
        """Lease up to ``n`` ready jobs, from one queue or several (taking from each in the
        order given until ``n`` are found: a consumer of many queues polls them all with one
        write, not one per queue)."""
        claim = self.submit(self._claim_op(queues, n, lease, owner))
        return _mapped(claim, ops.deliveries)

    def _claim_op(
        self, queues: str | Sequence[str], n: int, lease: Delay, owner: str | None
    ) -> Claim:
        names = [queues] if isinstance(queues, str) else list(queues)
        return ops.claim(
            names, n, lease=lease, owner=owner or self.owner, strict=not self.implicit_queues
        )

    def then_fill(self, claim: Future[list[Delivery]]) -> Future[list[Delivery]]:
        """The deliveries of ``claim`` with their payloads loaded, without blocking: bodies
        objects that are not cached are read in parallel once the claim has committed, so a
        consumer's thread or event loop never waits on storage reads."""
        filled: Future[list[Delivery]] = Future()

        def fill(_: object) -> None:
            try:
                filled.set_result(self.fill_deliveries(claim.result()))
            except BaseException as exc:  # handed to whoever waits on the future
                filled.set_exception(exc)

        def claimed(_: object) -> None:
            if claim.exception() is not None:
                fill(None)
                return
            refs = [d.job.ref for d in claim.result() if d.job.ref is not None and not d.job.body]
            self.committer.bodies.prefetch(refs).add_done_callback(fill)

        claim.add_done_callback(claimed)
        return filled

    def next_poll_wait(self, found: bool) -> float:
        """How long a claimer waits before looking again, after a claim that ``found`` jobs
        or not: doubles while claims find nothing, shared by every claimer of this queue."""
        with self._arrivals:
            if found:
                self._poll_wait = self.poll_seconds
                return self._poll_wait
            # The first claim to find nothing after one that found jobs waits poll_seconds.
            wait = self._poll_wait
            self._poll_wait = min(wait * 2, self.max_poll_seconds)
            return wait

    def _committed_since(self, count: int) -> bool:
        return self._commits > count

    def _wake_claimers(self) -> None:
        with self._arrivals:
            self._commits += 1
            self._arrivals.notify_all()
            listeners = list(self._arrival_listeners) if self._jobs_readied() else []
        for listener in listeners:
            try:
                listener()
            except Exception:  # a listener must not fail the commit thread that calls it
                log.exception("an arrival listener failed")

    def _jobs_readied(self) -> bool:
        """Whether the commit just learned of may have made jobs claimable (holding
        ``_arrivals``): the committer's readiness mark moved. Committers call after every
        commit or session, including claims that found nothing; those must not count, or an
        arrival listener that claims would set off the next call itself."""
        mark = self.committer.readied
        if mark == self._readied_seen:
            return False
        self._readied_seen = mark
        return True

    def on_arrivals(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener`` whenever jobs may have become claimable, as far as this process
        can know without reading: after its own commits that readied jobs and, in broker mode,
        after every such commit of the broker (which tells its clients). It runs on a commit
        or notice thread and must not block. Returns the function that stops the calls.

        An event loop that claims without blocking uses it to claim at once instead of at
        its next poll. Jobs another process committed directly are found by polling, except
        on a local folder (on Linux), whose writes the kernel reports: those call it too."""
        with self._arrivals:
            self._arrival_listeners.append(listener)

        def stop() -> None:
            with self._arrivals, contextlib.suppress(ValueError):
                self._arrival_listeners.remove(listener)

        return stop

    # --- payloads kept out of the state --------------------------------------------------

    def fill(self, job: Job, *, lenient: bool = False) -> Job:
        """``job`` with its payload loaded, if the state keeps it out of line; ``lenient``:
        as it is if that payload cannot be read (see ``BodyCache.fill``)."""
        return self.committer.bodies.fill(job, lenient=lenient)

    def fill_deliveries(self, deliveries: list[Delivery]) -> list[Delivery]:
        """``deliveries`` with their payloads loaded. One whose payload is missing, unreadable
        or cannot be decoded (a poison job: marked base64, and not) is dead-lettered at once,
        saying why, and left out, so no consumer ever sees it: the others are
        delivered, and no attempt of theirs is spent on it. (The dead-lettering is not
        waited for: this may run on the writer thread, as a claim's callback. If it fails,
        the lease runs out and the job comes back, to the same end.)"""
        filled = []
        for delivery in deliveries:
            try:
                job = self.fill(delivery.job)
                if job.b64:
                    job.payload  # noqa: B018  (decodes, or raises PayloadInvalid)
                filled.append(Delivery(job, delivery.token))
            except (StateCorrupt, PayloadInvalid) as exc:
                log.warning("dead-lettering job %s: %s", delivery.id, exc)
                error = job_error(exc)
                self.submit(ops.nack(delivery, error=error, retry=False)).add_done_callback(
                    _log_failure(f"dead-lettering job {delivery.id}")
                )
        return filled


def open_committer(
    store: ObjectStore, settings: BrokerSettings, options: dict[str, Any]
) -> Committer:
    """The local engine (mode ``off``), or a committer that goes through the namespace's
    broker (:mod:`objq_broker.broker.settings` lists the modes)."""
    if settings.mode == "off" or (settings.implicit and not _brokered_by_default(store, options)):
        return Engine(store, **options)
    try:  # needs pyzmq: imported only when a broker is asked for
        from objq_broker.broker.elected import ElectedCommitter
    except ModuleNotFoundError as exc:
        raise ConfigurationError(
            f"Queue: broker mode {settings.mode!r} needs pyzmq ({exc}): "
            "pip install pyzmq, or pass broker='off'"
        ) from exc
    refused = sorted(set(options) & {"epoch", "exclusive"})
    if refused:
        raise ConfigurationError(
            f"Queue: engine options {refused} are the broker's own; expected none of them "
            f"with broker mode {settings.mode!r}"
        )
    deadline = options.pop("commit_deadline_seconds", DEFAULT_COMMIT_DEADLINE_SECONDS)
    return ElectedCommitter(
        store, settings, commit_deadline_seconds=deadline, engine_options=options
    )


def _brokered_by_default(store: ObjectStore, options: dict[str, Any]) -> bool:
    """Whether a queue that did not ask for a mode goes through the namespace's broker: not
    when no other process can see its store (``memory://``, wrapped or not), when it asks for
    the engine's own broker-side options, or when pyzmq is missing (it then commits
    directly, as with ``broker="off"``)."""
    if store.url.startswith("memory://") or {"epoch", "exclusive"} & set(options):
        return False
    if importlib.util.find_spec("zmq") is None:
        log.info("%s: pyzmq is not installed; committing directly (broker mode off)", store.url)
        return False
    return True


def _mapped(future: Future[Any], convert: Any) -> Future[Any]:
    """A future holding ``convert(result)`` of ``future`` (or its error)."""
    mapped: Future[Any] = Future()

    def done(_: object) -> None:
        exc = future.exception()
        if exc is not None:
            mapped.set_exception(exc)
            return
        try:
            mapped.set_result(convert(future.result()))
        except BaseException as error:  # handed to whoever waits on the future
            mapped.set_exception(error)

    future.add_done_callback(done)
    return mapped


def _log_failure(what: str) -> Callable[[Future[Any]], None]:
    """A future's callback that logs its failure, for a submission nobody waits for."""

    def done(future: Future[Any]) -> None:
        if future.exception() is not None:
            log.warning("%s failed: %s", what, future.exception())

    return done
