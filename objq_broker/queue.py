"""``Queue``: the thread-safe, synchronous API over a committer (the group-commit engine).

Every method builds one operation (:mod:`objq_broker.ops`, which checks the arguments) and
submits it to the next batch. Enqueues and claims return only once durable. Acks, nacks,
heartbeats and releases wait too by default (so a stale lease raises
:class:`~objq_broker.errors.LeaseLost` at the call); pass ``wait=False`` to return as soon as
the operation is submitted, as the framework integrations do: a lost ack in a crash only means
a redelivery, which at-least-once delivery allows. ``flush()`` and ``close()`` wait for
everything submitted.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

from objq_broker import ops
from objq_broker.broker.settings import BrokerSettings, broker_settings
from objq_broker.engine.base import DEFAULT_COMMIT_DEADLINE_SECONDS
from objq_broker.engine.batch import EngineMetrics
from objq_broker.engine.commit import Engine
from objq_broker.engine.options import (
    QueueLimits,
    check_engine_settings,
    engine_part,
    resolve_store,
)
from objq_broker.engine.port import Committer
from objq_broker.errors import ConfigurationError, LeaseLost, StateCorrupt, job_error
from objq_broker.model.checks import checked_timeout
from objq_broker.model.ops import (
    Claim,
    DeadLetters,
    Expire,
    FindJob,
    GetConfig,
    Op,
    QueueNames,
    Workers,
    WriteBudget,
)
from objq_broker.model.records import Job, JobState, NackResult, QueueConfig
from objq_broker.model.values import QueueStats, StagedBodies, StagedRun
from objq_broker.model.workers import Worker
from objq_broker.ops import Delay, Delivery, default_owner
from objq_broker.storage import ObjectStore
from objq_broker.storage.metered import MeteredStore

T = TypeVar("T")
log = logging.getLogger("objq_broker.queue")

#: How soon ``claim(timeout=...)`` looks at the state again when a claim found nothing. The
#: wait doubles while claims keep finding nothing, up to ``DEFAULT_MAX_POLL_SECONDS`` (each
#: look is a storage read in direct mode), and starts again from here when one finds a job. A
#: commit of this process (a local enqueue) wakes claimers at once whatever the wait.
DEFAULT_POLL_SECONDS = 0.5
DEFAULT_MAX_POLL_SECONDS = 1.0

__all__ = [
    "DEFAULT_MAX_POLL_SECONDS",
    "DEFAULT_POLL_SECONDS",
    "Delay",
    "Delivery",
    "Queue",
    "default_owner",
]


class Queue:
    """A handle on every queue of one namespace (a store URL). Thread-safe.

    >>> with Queue("memory://doc-example") as q:
    ...     job = q.enqueue("emails", b"hello")
    ...     [delivery] = q.claim("emails")
    ...     q.ack(delivery)
    ...     q.stats("emails").ready
    0

    An enqueue declares its queue by first use; a claim does not: claiming from a queue
    nobody declared raises :class:`~objq_broker.errors.QueueNotFound` (a typo must not wait
    for ever), unless ``implicit_queues=True``, with which it finds nothing until an enqueue
    creates the queue.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        store: ObjectStore | None = None,
        owner: str | None = None,
        poll_seconds: float = DEFAULT_POLL_SECONDS,
        max_poll_seconds: float = DEFAULT_MAX_POLL_SECONDS,
        broker: str | BrokerSettings | None = None,
        implicit_queues: bool = False,
        **options: Any,
    ) -> None:
        settings = (
            broker if isinstance(broker, BrokerSettings) else broker_settings(broker, options)
        )
        own = {
            "owner": owner,
            "poll_seconds": poll_seconds,
            "max_poll_seconds": max_poll_seconds,
            "implicit_queues": implicit_queues,
        }
        check_engine_settings(own | engine_part(options), QueueLimits)
        opened, engine_options = resolve_store(url, store, options, "Queue")
        #: The store, every request to it counted (``storage_meter``) for the metrics.
        self.store = MeteredStore(opened)
        self.storage_meter = self.store.meter
        #: Where operations go: the local group-commit engine, or a broker that commits for
        #: every process of the namespace.
        self.committer: Committer = open_committer(self.store, settings, engine_options)
        self.owner = owner or default_owner()
        #: Claims from a queue nobody declared find nothing instead of raising.
        self.implicit_queues = implicit_queues
        self.poll_seconds = poll_seconds
        self.max_poll_seconds = max(max_poll_seconds, poll_seconds)
        self._poll_wait = poll_seconds  # grows while claims find nothing
        self._arrivals = threading.Condition()
        self._commits = 0  # batches committed; claimers wait for it to move
        self._arrival_listeners: list[Callable[[], None]] = []
        self._readied_seen: object = None
        self.committer.on_commit(self._wake_claimers)

    def __repr__(self) -> str:
        return f"Queue({self.store.url!r})"

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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

    # --- queues ----------------------------------------------------------------------------

    def declare(self, queue: str, **config: Any) -> bool:
        """Declare ``queue`` (idempotent; declaring it again counts as using it). ``config``
        sets a new queue's defaults: max_attempts, backoff_base_seconds, backoff_cap_seconds,
        lease_seconds, dead_ttl_seconds, idempotency_seconds, and expires_seconds (delete the
        queue once nobody has claimed from it, heartbeated its jobs or declared it for that
        long, as kombu's ``x-expires``; None, the default: never)."""
        return self.submit(ops.declare(queue, config)).result()

    def configure(self, queue: str, **changes: float | None) -> QueueConfig:
        """Change the stored defaults of a declared queue."""
        return self.submit(ops.configure(queue, changes)).result()

    def config(self, queue: str) -> QueueConfig:
        return self.submit(GetConfig(ops.queue_name(queue))).result()

    def set_write_budget(self, writes_per_second: float | None) -> float | None:
        """Allow at most this many state writes per second, by every process of the
        namespace together (None: no limit). Latency rises to match; nothing is lost
        (``engine.budget``, ``objq budget``)."""
        return self.submit(ops.set_write_budget(writes_per_second)).result()

    def workers(self) -> list[Worker]:
        """Who holds jobs: each lease holder with its queues, jobs held, oldest claim and
        last heartbeat, and those whose leases ran out lately (``model.workers``)."""
        return self.submit(Workers()).result()

    def write_budget(self) -> float | None:
        """The namespace's write budget, in state writes per second (None: none)."""
        return self.submit(WriteBudget()).result()

    def purge(self, queue: str) -> int:
        """Delete the queue's ready and delayed jobs; returns how many."""
        return self.submit(ops.purge(queue)).result()

    def delete_queue(self, queue: str) -> int:
        """Remove the queue with its jobs and dead letters, and every kombu binding to it
        (once the commit landed); returns how many jobs went."""
        return self.submit(ops.delete_queue(queue)).result()

    # --- producing -------------------------------------------------------------------------

    def enqueue(
        self,
        queue: str,
        payload: bytes,
        *,
        priority: int = 0,
        delay: Delay = None,
        max_attempts: int | None = None,
        key: str | None = None,
    ) -> Job:
        """Add one job; durable when this returns. A ``key`` seen within the queue's
        idempotency window returns the earlier job instead of adding a duplicate."""
        op = ops.enqueue(
            queue,
            [payload],
            priority=priority,
            delay=delay,
            max_attempts=max_attempts,
            keys=None if key is None else [key],
        )
        [job] = self.submit(op).result()
        return self.fill(job)

    def enqueue_many(
        self,
        queue: str,
        payloads: Iterable[bytes],
        *,
        priority: int = 0,
        delay: Delay = None,
        max_attempts: int | None = None,
        keys: Sequence[str | None] | None = None,
    ) -> list[Job]:
        """Add many jobs in one commit: all of them are durable, or none."""
        op = ops.enqueue(
            queue, payloads, priority=priority, delay=delay, max_attempts=max_attempts, keys=keys
        )
        return [self.fill(job) for job in self.submit(op).result()]

    def enqueue_staged(
        self,
        queue: str,
        staged: Sequence[StagedBodies],
        *,
        write_id: str,
        priority: int = 0,
        delay: Delay = None,
        max_attempts: int | None = None,
    ) -> int | None:
        """Add one job per entry of bodies objects already written (by the partitions of a
        Spark write, say), all in one commit: every job is durable, or none.

        The objects must be in the format of ``bodies/`` objects (see
        :mod:`objq_broker.model.bodies`); the state counts their references and deletes them
        once their last job finished. A retry with the same ``write_id`` within the queue's
        idempotency window adds nothing and returns None; else the number of jobs added."""
        op = ops.enqueue_staged(
            queue,
            staged,
            write_id=write_id,
            priority=priority,
            delay=delay,
            max_attempts=max_attempts,
        )
        return self.submit(op).result()

    def enqueue_runs(self, queue: str, runs: Sequence[StagedRun], *, write_id: str) -> int | None:
        """Add the jobs of runs already written (by the tasks of a Spark write), in one
        commit that adds a reference per run: the jobs never pass through the state's head.

        Each run (:mod:`objq_broker.model.runs` format, jobs numbered from 0) refers to the
        entries of one bodies object written with it; both are deleted once their last job
        finished. The runs take their place in the queue after every job enqueued before, in
        the order given. Idempotent by ``write_id`` as :meth:`enqueue_staged`."""
        return self.submit(ops.enqueue_runs(queue, runs, write_id=write_id)).result()

    # --- consuming -------------------------------------------------------------------------

    def claim(
        self,
        queue: str | Sequence[str],
        n: int = 1,
        *,
        lease: Delay = None,
        owner: str | None = None,
        timeout: float | None = None,
    ) -> list[Delivery]:
        """Lease up to ``n`` ready jobs, best priority first, from one queue or several (each
        in the order given until ``n`` are found). With ``timeout``, wait up to that many
        seconds for at least one; without, return at once (maybe empty). Payloads kept out of
        line are read in parallel before this returns."""
        timeout = checked_timeout(timeout, f"claim from {queue!r}")
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            seen = self._commits
            found = self._claim_once(queue, n, lease, owner, end)
            pause = self.next_poll_wait(bool(found))
            if found or end is None:
                return found
            remaining = end - time.monotonic()
            if remaining <= 0:
                return found
            # Woken early by a later local commit (a local enqueue, say); else poll storage.
            with self._arrivals:
                self._arrivals.wait_for(
                    functools.partial(self._committed_since, seen + 1), min(remaining, pause)
                )

    def _claim_once(
        self,
        queue: str | Sequence[str],
        n: int,
        lease: Delay,
        owner: str | None,
        end: float | None,
    ) -> list[Delivery]:
        """One claim, payloads loaded. If it finds nothing and there is time left before
        ``end``, a second one waits at the broker for jobs when there is one. (The first goes
        with this process's other operations, its acks say, in one request.)"""
        found = self.then_fill(self.submit_claim(queue, n, lease=lease, owner=owner)).result()
        left = 0.0 if end is None else end - time.monotonic()
        if found or left <= 0:
            return found
        jobs = self.committer.claim_waiting(self._claim_op(queue, n, lease, owner), left)
        if jobs is None:
            return found
        claimed: Future[list[Delivery]] = Future()
        claimed.set_result(ops.deliveries(jobs))
        return self.then_fill(claimed).result()

    def ack(
        self,
        delivery: Delivery,
        *,
        outcome: str = "done",
        error: str | None = None,
        wait: bool = True,
    ) -> None:
        """Finish a delivery. Raises :class:`LeaseLost` if its lease was lost (when waiting).

        ``outcome`` is what the archive records: "done", or, for a framework that settles a
        failed run with an ack, "failed" (for good) or "retried" (sent again as a new job),
        with ``error``."""
        op = ops.ack(delivery, outcome=outcome, error=error)
        self._settle(self.submit(op), wait, "ack", delivery)

    def note_outcome(
        self,
        job_id: str,
        queue: str,
        outcome: str,
        *,
        error: str | None = None,
        wait: bool = True,
    ) -> None:
        """Archive that the run of job ``job_id`` of ``queue`` "failed" or was "retried" as a
        new job, for a framework that acked the job before running it (Celery's default). The
        job's own record keeps its outcome "done"; readers of the archive (``objq report``,
        the ``objq`` Spark source) take the note's."""
        op = ops.note_outcome(job_id, queue, outcome, error)
        self._settle(self.submit(op), wait, "note_outcome")

    def nack(
        self,
        delivery: Delivery,
        *,
        error: str | None = None,
        retry: bool = True,
        delay: Delay = None,
        wait: bool = True,
    ) -> NackResult | None:
        """Fail a delivery: retry after the queue's backoff (or ``delay``), or dead-letter it
        when ``retry`` is false or its attempts are spent. Returns 'retry' or 'dead'."""
        op = ops.nack(delivery, error=error, retry=retry, delay=delay)
        return self._settle(self.submit(op), wait, "nack", delivery)

    def heartbeat(
        self, deliveries: Sequence[Delivery], *, lease: Delay = None, wait: bool = True
    ) -> list[bool] | None:
        """Extend the leases of many deliveries in one operation; says which are still held."""
        return self._settle(self.submit(ops.heartbeat(deliveries, lease=lease)), wait, "heartbeat")

    def release(self, deliveries: Sequence[Delivery], *, wait: bool = True) -> list[bool] | None:
        """Give back unprocessed deliveries; no attempt is counted. Says which were held."""
        return self._settle(self.submit(ops.release(deliveries)), wait, "release")

    def _settle(
        self, future: Future[T], wait: bool, what: str, delivery: Delivery | None = None
    ) -> T | None:
        if wait:
            return future.result()

        def report(done: Future[T]) -> None:
            exc = done.exception()
            if exc is None:
                return
            level = logging.INFO if isinstance(exc, LeaseLost) else logging.ERROR
            log.log(level, "%s of %s failed: %s", what, delivery.id if delivery else "-", exc)

        future.add_done_callback(report)
        return None

    @contextlib.contextmanager
    def keep_alive(
        self, deliveries: Sequence[Delivery], *, every: float | None = None
    ) -> Iterator[None]:
        """Heartbeat ``deliveries`` in the background while the block runs a long job."""
        if not deliveries:
            yield
            return
        stop = threading.Event()
        interval = heartbeat_interval(deliveries, every)

        def beat() -> None:
            while not stop.wait(interval):
                try:
                    self.heartbeat(deliveries)
                except Exception as exc:  # keep beating: the next try may reach storage
                    log.warning("heartbeat failed: %s", exc)

        thread = threading.Thread(target=beat, name="objq-heartbeat", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    # --- payloads kept out of the state --------------------------------------------------

    def fill(self, job: Job, *, lenient: bool = False) -> Job:
        """``job`` with its payload loaded, if the state keeps it out of line; ``lenient``:
        as it is if that payload cannot be read (see ``BodyCache.fill``)."""
        return self.committer.bodies.fill(job, lenient=lenient)

    def fill_deliveries(self, deliveries: list[Delivery]) -> list[Delivery]:
        """``deliveries`` with their payloads loaded. One whose payload is missing or
        unreadable is dead-lettered at once, saying why, and left out: the others are
        delivered, and no attempt of theirs is spent on it. (The dead-lettering is not
        waited for: this may run on the writer thread, as a claim's callback. If it fails,
        the lease runs out and the job comes back, to the same end.)"""
        filled = []
        for delivery in deliveries:
            try:
                filled.append(Delivery(self.fill(delivery.job), delivery.token))
            except StateCorrupt as exc:
                log.warning("dead-lettering job %s: %s", delivery.id, exc)
                error = job_error(exc)
                self.submit(ops.nack(delivery, error=error, retry=False)).add_done_callback(
                    _log_failure(f"dead-lettering job {delivery.id}")
                )
        return filled

    # --- dead letters ----------------------------------------------------------------------

    def dead_letters(self, queue: str) -> list[Job]:
        dead = self.submit(DeadLetters(ops.queue_name(queue))).result()
        return [self.fill(job, lenient=True) for job in dead]

    def retry_dead(self, queue: str, ids: Sequence[str] | None = None) -> list[str]:
        """Move dead letters (all, or these ids) back to the queue with fresh attempts."""
        return self.submit(ops.retry_dead(queue, ids)).result()

    def purge_dead(self, queue: str, ids: Sequence[str] | None = None) -> int:
        """Delete dead letters (all, or these ids) for good; returns how many."""
        return self.submit(ops.purge_dead(queue, ids)).result()

    # --- inspecting ------------------------------------------------------------------------

    def queues(self) -> list[str]:
        return self.submit(QueueNames()).result()

    def stats(self, queue: str) -> QueueStats:
        [found] = self.stats_many([queue])
        return found

    def stats_many(self, queues: Sequence[str]) -> list[QueueStats]:
        """Counts of several queues from one state: a job moving between them (a delay queue
        and its queue, say) is never counted twice or missed."""
        return self.submit(ops.stats(queues)).result()

    def job(self, job_id: str) -> tuple[JobState, Job] | None:
        """A job's state ('ready', 'delayed', 'in-flight', 'dead') and record, if in the state."""
        found = self.submit(FindJob(job_id)).result()
        return None if found is None else (found[0], self.fill(found[1], lenient=True))

    def jobs(
        self, queue: str, *, state: JobState | None = None, limit: int | None = None
    ) -> list[tuple[JobState, Job]]:
        """Jobs of ``queue`` in claim order (dead letters last), optionally one state only."""
        rows = self.submit(ops.list_jobs(queue, state, limit)).result()
        return [(where, self.fill(job, lenient=True)) for where, job in rows]

    def expire(self) -> int:
        """Return stale leases to their queues now (commits also do this on their own)."""
        return self.submit(Expire()).result()

    def metrics(self) -> EngineMetrics:
        return self.committer.metrics

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every operation submitted so far is durable (and the objects its
        commits freed are deleted)."""
        self.committer.flush(timeout)

    def close(self) -> None:
        """Commit what is pending and stop the writer. The store stays usable by others."""
        self.committer.close()


def open_committer(
    store: ObjectStore, settings: BrokerSettings, options: dict[str, Any]
) -> Committer:
    """The local engine (mode ``off``), or a committer that goes through the namespace's
    broker (:mod:`objq_broker.broker.settings` lists the modes)."""
    if settings.mode == "off" or (settings.implicit and not _brokered_by_default(store, options)):
        return Engine(store, **options)
    try:  # needs grpcio: imported only when a broker is asked for
        from objq_broker.broker.elected import ElectedCommitter
    except ModuleNotFoundError as exc:
        raise ConfigurationError(
            f"Queue: broker mode {settings.mode!r} needs grpcio ({exc}): "
            "pip install grpcio, or pass broker='off'"
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
    the engine's own broker-side options, or when grpcio is missing (it then commits
    directly, as with ``broker="off"``)."""
    if store.url.startswith("memory://") or {"epoch", "exclusive"} & set(options):
        return False
    if importlib.util.find_spec("grpc") is None:
        log.info("%s: grpcio is not installed; committing directly (broker mode off)", store.url)
        return False
    return True


def heartbeat_interval(deliveries: Sequence[Delivery], every: float | None) -> float:
    """How often to extend these leases: a third of what is left of the first one."""
    if every is not None:
        return every
    lease = deliveries[0].job.lease if deliveries else None
    span = (lease.expires_at - time.time()) if lease is not None else 30.0
    return max(span / 3.0, 0.05)


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
