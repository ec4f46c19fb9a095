"""The core that :class:`~objq_broker.queue.Queue` and :class:`~objq_broker.aio.AsyncQueue` each
hold: the committer it opens, operations submitted to it as futures, payloads loaded out of line
(poison jobs dead-lettered on the way), and the wake-ups of claimers when a commit may have
readied jobs. Both faces build their operations with :mod:`objq_broker.builders` and submit
them here; what differs between them (blocking or awaiting) stays in the faces.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from typing import Any, TypedDict, TypeVar, Unpack

from objq_broker import builders
from objq_broker.broker.settings import BrokerSettings, broker_settings
from objq_broker.builders import Delay, Delivery, default_owner
from objq_broker.engine.base import DEFAULT_COMMIT_DEADLINE_SECONDS
from objq_broker.engine.commit import Engine
from objq_broker.engine.options import (
    DEFAULT_MAX_POLL_SECONDS,
    DEFAULT_POLL_SECONDS,
    QUEUE_OPTIONS,
    EngineOptions,
    QueueSettings,
    engine_part,
    resolve_store,
)
from objq_broker.engine.port import Committer
from objq_broker.errors import (
    ConfigurationError,
    LeaseLost,
    PayloadInvalid,
    StateCorrupt,
    job_error,
)
from objq_broker.model.checks import Where, shown
from objq_broker.model.ops import Claim, Op
from objq_broker.model.records import Job
from objq_broker.model.settings import read_settings
from objq_broker.storage import ObjectStore
from objq_broker.storage.metered import MeteredStore
from objq_broker.storage.url import StoreOptions

T = TypeVar("T")
log = logging.getLogger("objq_broker.queue")

__all__ = [
    "DEFAULT_MAX_POLL_SECONDS",
    "DEFAULT_POLL_SECONDS",
    "QueueCore",
    "QueueOptions",
    "open_committer",
    "settle",
]


class QueueOptions(EngineOptions, StoreOptions, total=False):
    """The keywords of :class:`~objq_broker.queue.Queue`, :class:`~objq_broker.aio.AsyncQueue`
    and :class:`QueueCore` besides ``url`` and ``store``: the queue's own settings (these four,
    :class:`~objq_broker.engine.options.QueueSettings` has their defaults), the broker's
    (``broker`` and the ``broker_*`` options of :mod:`objq_broker.broker.settings`), the
    engine's and the storage adapter's. A test holds the keys to the settings structs."""

    owner: str | None
    poll_seconds: float
    max_poll_seconds: float
    implicit_queues: bool
    broker: str | BrokerSettings | None
    broker_listen: str
    broker_advertise: str | None
    broker_token: str | None
    broker_takeover_seconds: float


class ClaimOptions(TypedDict, total=False):
    """How a claim holds the jobs it takes, as keywords of each way to claim."""

    #: Seconds the lease lasts (default None: the queue's ``lease_seconds``).
    lease: Delay
    #: Who the jobs are held for (default None: the queue's ``owner``).
    owner: str | None
    #: Over several queues, take from each in the order given until enough are found (for
    #: a caller that orders them itself), instead of in turn (default False).
    ordered: bool


class QueueCore:
    """What a queue stands on, whichever face it shows (see the module's description); it
    takes the arguments of :class:`~objq_broker.queue.Queue`. Thread-safe.

    >>> core = QueueCore("memory://core-doc")
    >>> _ = core.submit(builders.enqueue("emails", [b"hi"])).result()
    >>> [delivery] = core.then_fill(core.submit_claim("emails")).result()
    >>> delivery.payload
    b'hi'
    >>> core.committer.close()
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        store: ObjectStore | None = None,
        **options: Unpack[QueueOptions],
    ) -> None:
        rest: dict[str, Any] = dict(options)
        broker = rest.pop("broker", None)
        settings = broker if isinstance(broker, BrokerSettings) else broker_settings(broker, rest)
        own = {name: rest.pop(name) for name in QUEUE_OPTIONS & set(rest)}
        read = read_settings(QueueSettings, own | engine_part(rest), where="Queue settings")
        opened, engine_options = resolve_store(url, store, rest, "Queue")
        #: The store, every request to it counted (``store.meter``) for the metrics.
        self.store = MeteredStore(opened)
        #: Where operations go: the local group-commit engine, or a broker that commits for
        #: every process of the namespace.
        self.committer: Committer = open_committer(self.store, settings, engine_options)
        self.owner = read.owner or default_owner()
        #: Claims from a queue nobody declared find nothing instead of raising.
        self.implicit_queues = read.implicit_queues
        self.poll_seconds = read.poll_seconds
        self.max_poll_seconds = max(read.max_poll_seconds, read.poll_seconds)
        self._poll_wait = read.poll_seconds  # grows while claims find nothing
        self._arrivals = threading.Condition()
        self._commits = 0  # batches committed; claimers wait for it to move
        self._waiting = 0  # claimers waiting in wait_until: a commit wakes them
        self._arrival_listeners: list[Callable[[], None]] = []
        self._readied_seen: object = None
        self.committer.on_commit(self._wake_claimers)

    # --- operations, as futures -----------------------------------------------------------

    def submit(self, op: Op[T]) -> Future[T]:
        """Submit an operation built by :mod:`objq_broker.builders`; the future resolves once
        it is durable."""
        return self.committer.submit(op)

    def submit_many(self, ops: Sequence[Op[Any]]) -> list[Future[Any]]:
        """Submit several operations at once: the next batch takes them together (one commit,
        or one session with a broker, unless they exceed one); a future for each."""
        futures: list[Future[Any]] = [Future() for _ in ops]
        self.committer.submit_to(list(zip(ops, futures, strict=True)))
        return futures

    def call(self, op: Op[T]) -> T:
        """Commit an operation built by :mod:`objq_broker.builders` and wait until it is
        durable; its result."""
        return self.committer.call(op)

    def claim_op(self, queues: str | Sequence[str], n: int, options: ClaimOptions) -> Claim:
        """The claim of up to ``n`` jobs from ``queues`` by ``options``' owner (default: this
        core's)."""
        names = _queue_names(queues)
        builders.known_keywords(options, ClaimOptions, Where("claim from {}", names, 120))
        return builders.claim(
            names,
            n,
            lease=options.get("lease"),
            owner=options.get("owner") or self.owner,
            strict=not self.implicit_queues,
            ordered=options.get("ordered", False),
        )

    def submit_claim(
        self, queues: str | Sequence[str], n: int = 1, **options: Unpack[ClaimOptions]
    ) -> Future[list[Delivery]]:
        """Lease up to ``n`` ready jobs, from one queue or several (in turn, or in the order
        given with ``ordered``: a consumer of many queues polls them all with one write, not
        one per queue)."""
        claim = self.submit(self.claim_op(queues, n, options))
        return _mapped(claim, builders.deliveries)

    def claim_filled(
        self,
        queues: str | Sequence[str],
        n: int,
        options: ClaimOptions,
        end: float | None,
    ) -> list[Delivery]:
        """One claim, payloads loaded, waiting for it. If it finds nothing and there is time
        left before ``end`` (a ``time.monotonic()``), a second one waits at the broker for jobs
        when there is one. (The first goes with this process's other operations, its acks say,
        in one request.)"""
        while True:
            jobs = self.call(self.claim_op(queues, n, options))
            claimed = builders.deliveries(jobs)
            found = self.filled(claimed)
            if found or not claimed:
                break
            # Every job it found was poison, dead-lettered (see fill_deliveries): look again,
            # rather than say the queue is empty.
        left = 0.0 if end is None else end - time.monotonic()
        if found or left <= 0:
            return found
        waited = self.committer.claim_waiting(self.claim_op(queues, n, options), left)
        return found if waited is None else self.filled(builders.deliveries(waited))

    def filled(self, claimed: list[Delivery]) -> list[Delivery]:
        """``claimed`` with their payloads loaded (bodies objects read in parallel)."""
        refs = [d.job.ref for d in claimed if d.job.ref is not None and not d.job.body]
        if refs:
            self.committer.bodies.prefetch(refs).result()
        return self.fill_deliveries(claimed)

    # --- payloads kept out of the state ----------------------------------------------------

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
                filled.append(delivery if job is delivery.job else Delivery(job, delivery.token))
            except (StateCorrupt, PayloadInvalid) as exc:
                log.warning("dead-lettering job %s: %s", delivery.id, exc)
                error = job_error(exc)
                self.submit(builders.nack(delivery, error=error, retry=False)).add_done_callback(
                    _log_failure(f"dead-lettering job {delivery.id}")
                )
        return filled

    # --- claimers' wake-ups ----------------------------------------------------------------

    def next_poll_wait(self, found: bool) -> float:
        """How long a claimer waits before looking again, after a claim that ``found`` jobs
        or not: doubles while claims find nothing, shared by every claimer of this core."""
        if found and self._poll_wait == self.poll_seconds:
            return self.poll_seconds  # nothing to reset (as if reset before any doubling)
        with self._arrivals:
            if found:
                self._poll_wait = self.poll_seconds
                return self._poll_wait
            # The first claim to find nothing after one that found jobs waits poll_seconds.
            wait = self._poll_wait
            self._poll_wait = min(wait * 2, self.max_poll_seconds)
            return wait

    @property
    def commits(self) -> int:
        """How many commits (or broker sessions) this core has learned of: a claimer notes it
        before claiming and waits for it to move past its own claim's."""
        return self._commits

    def committed_since(self, count: int) -> bool:
        return self._commits > count

    def wait_until(self, done: Callable[[], bool], timeout: float) -> bool:
        """Wait until ``done()`` holds, asking again after each commit, for at most
        ``timeout`` seconds; returns its last answer."""
        with self._arrivals:
            self._waiting += 1
            try:
                return self._arrivals.wait_for(done, timeout)
            finally:
                self._waiting -= 1

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

    def _wake_claimers(self) -> None:
        with self._arrivals:
            self._commits += 1
            if self._waiting:  # (a claimer that waits later sees the count under the lock)
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


def settle(
    core: QueueCore, op: Op[T], wait: bool, what: str, delivery: Delivery | None = None
) -> T | None:
    """Commit ``op``: its result if ``wait``; else None at once, and its failure logged when
    it comes (a lost lease only at INFO: at-least-once delivery expects those)."""
    if wait:
        return core.call(op)
    future = core.submit(op)

    def report(done: Future[T]) -> None:
        exc = done.exception()
        if exc is None:
            return
        level = logging.INFO if isinstance(exc, LeaseLost) else logging.ERROR
        log.log(level, "%s of %s failed: %s", what, delivery.id if delivery else "-", exc)

    future.add_done_callback(report)
    return None


def _queue_names(queues: object) -> list[str]:
    """A claim's queues, one name or many, as a list (each name is checked with the claim)."""
    if isinstance(queues, str):
        return [queues]
    if isinstance(queues, (bytes, dict)) or not isinstance(queues, Iterable):
        raise ConfigurationError(
            f"claim: queues: expected a queue name or a list of them, found {shown(queues)}"
        )
    return list(queues)
