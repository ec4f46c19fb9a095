"""``AsyncQueue``: the asyncio face of :class:`~objq_broker.queue.Queue`, with the same methods.

Both build their operations with :mod:`objq_broker.builders` and submit them through a
:class:`~objq_broker.core.QueueCore` of their own, so they cannot drift apart; a test holds their
method lists equal. The engine's writer is a thread either way: storage calls are synchronous
SDK calls (one boto3 client, one commit loop). What a loop's coroutines submit in one turn of
the loop goes together: committed in the loop's thread on a store that never waits (memory)
when the engine is idle, else handed to the writer, whose outcomes come back to the loop with
one wake-up per commit. A claim with a timeout wakes on the next local commit, as
``Queue.claim`` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterable, Sequence, Sized
from typing import Any, TypeVar, Unpack

from objq_broker import builders
from objq_broker.builders import Delay, Delivery, JobOptions, heartbeat_interval
from objq_broker.core import ClaimOptions, QueueCore, QueueOptions
from objq_broker.engine.batch import EngineMetrics
from objq_broker.engine.port import Committer
from objq_broker.errors import QueueError
from objq_broker.model import ops
from objq_broker.model.checks import Where, checked_timeout
from objq_broker.model.records import Job, JobState, NackResult, QueueConfig
from objq_broker.model.values import QueueStats, StagedBodies, StagedRun
from objq_broker.model.workers import Worker
from objq_broker.queue import Queue
from objq_broker.storage import ObjectStore
from objq_broker.storage.metered import never_waits

T = TypeVar("T")
log = logging.getLogger("objq_broker.aio")


def _out_of_line(jobs: Iterable[Job]) -> bool:
    return any(job.ref is not None and not job.body for job in jobs)


class _Mailbox:
    """Outcomes for one event loop's futures, settled on the commit thread and handed to the
    loop together: one wake-up of the loop per commit, not one per operation (a wake-up is a
    write to the loop's self-pipe, and the loop's turn at the GIL)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._settled: list[tuple[asyncio.Future[Any], bool, Any]] = []

    def put(self, future: asyncio.Future[Any], ok: bool, value: Any) -> None:
        """From any thread: settle ``future`` on its loop, soon."""
        with self._lock:
            self._settled.append((future, ok, value))
            if len(self._settled) > 1:
                return  # a hand-over is already on its way
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            self._loop.call_soon_threadsafe(self._hand_over)

    def _hand_over(self) -> None:
        with self._lock:
            settled, self._settled = self._settled, []
        for future, ok, value in settled:
            _settle(future, ok, value)


#: Most operations a lone coroutine commits in a row without the loop getting a turn: a
#: coroutine awaiting a future that is already done does not yield, so without a bound a
#: claim-and-ack loop over a backlog would keep the loop's other tasks waiting.
MAX_AT_ONCE = 16


class _LoopBatch:
    """The operations one event loop's coroutines submitted in one turn of the loop, handed
    on together at the end of the turn: to the writer thread, or, on a store that never waits
    (``here``), committed in the loop's own thread when the engine is idle, as the writer
    would have batched them."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, committer: Committer, *, here: bool
    ) -> None:
        self._loop, self._committer, self._here = loop, committer, here
        self._mailbox = _Mailbox(loop)
        self._ops: list[tuple[ops.Op[Any], asyncio.Future[Any]]] = []
        # The loop's callbacks ready to run in this turn (asyncio's own loop; another loop,
        # such as uvloop's, shows none, and its operations always wait for the turn's end).
        self._ready: Sized | None = getattr(loop, "_ready", None)
        #: Operations committed at once since the loop last had a turn (see :meth:`add`).
        self._at_once = 0

    def add(self, op: ops.Op[Any], future: asyncio.Future[Any]) -> None:
        if (
            self._here
            and not self._ops
            and self._ready is not None
            and not self._ready
            and self._at_once < MAX_AT_ONCE
            and self._committer.commit_here([(op, _LoopOutcome(future))])
        ):
            # Nothing else runs in this turn of the loop, so no other coroutine can submit
            # before its end: waiting for it would only cost the turn. Now and then the loop
            # still gets its turn, for its timers and sockets.
            self._at_once += 1
            return
        self._ops.append((op, future))
        if len(self._ops) == 1:
            # After the coroutines ready now: those the last commit released submit theirs.
            self._loop.call_soon(self._commit)

    def _commit(self) -> None:
        batch, self._ops = self._ops, []
        self._at_once = 0
        try:
            if self._here and self._committer.commit_here(
                [(op, _LoopOutcome(future)) for op, future in batch]
            ):
                return
            # Else the writer thread takes them, together.
            mailbox = self._mailbox
            self._committer.submit_to([(op, _LoopOutcome(future, mailbox)) for op, future in batch])
        except Exception as exc:  # closed, say: every coroutine learns why
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)


class _LoopOutcome:
    """An operation's outcome for a coroutine (:class:`~objq_broker.engine.batch.Settles`):
    settled on the coroutine's future in its loop's thread (``mailbox`` None: this is that
    thread), or handed to that thread through the loop's :class:`_Mailbox`."""

    __slots__ = ("_done", "_future", "_mailbox")

    def __init__(self, future: asyncio.Future[Any], mailbox: _Mailbox | None = None) -> None:
        self._future, self._mailbox = future, mailbox
        self._done = False

    def set_running_or_notify_cancel(self) -> bool:
        # A coroutine cancelled before its operation was committed drops it, as a
        # cancelled future does.
        return not self._future.cancelled()

    def done(self) -> bool:
        return self._done

    def set_result(self, result: Any) -> None:
        self._settle(True, result)

    def set_exception(self, exception: BaseException | None) -> None:
        self._settle(False, exception or QueueError("an operation failed"))

    def _settle(self, ok: bool, value: Any) -> None:
        self._done = True
        if self._mailbox is None:
            _settle(self._future, ok, value)
        else:
            self._mailbox.put(self._future, ok, value)


def _settle(future: asyncio.Future[Any], ok: bool, value: Any) -> None:
    """In ``future``'s loop: its outcome, unless it was cancelled meanwhile."""
    if future.done():
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


class AsyncQueue:
    """Like :class:`Queue`, with ``async`` methods and the same keywords
    (:class:`~objq_broker.core.QueueOptions`).

    >>> async def main() -> int:
    ...     async with AsyncQueue("memory://aio-doc") as q:
    ...         await q.enqueue("emails", b"hi")
    ...         [delivery] = await q.claim("emails")
    ...         await q.ack(delivery)
    ...         return (await q.stats("emails")).ready
    >>> asyncio.run(main())
    0
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        store: ObjectStore | None = None,
        **options: Unpack[QueueOptions],
    ) -> None:
        #: The committer, its futures, payload loading and claimers' wake-ups.
        self.core = QueueCore(url, store=store, **options)
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()
        self._lock = threading.Lock()
        #: Each event loop's operations, gathered a turn of the loop at a time.
        self._loops: dict[asyncio.AbstractEventLoop, _LoopBatch] = {}
        # After the core's own listener, which counts the commit the waiters look for.
        self.core.committer.on_commit(self._on_commit)

    @functools.cached_property
    def sync(self) -> Queue:
        """A synchronous queue on the same core, for code of this process that blocks (a
        thread, or a metrics collector): closing either closes both."""
        return Queue.from_core(self.core)

    def __repr__(self) -> str:
        return f"AsyncQueue({self.core.store.url!r})"

    async def __aenter__(self) -> AsyncQueue:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _run(self, op: ops.Op[T]) -> asyncio.Future[T]:
        """``op`` submitted with this turn of the loop's others: the future of its result.
        (A future, not a coroutine: one frame less to build and to resume per operation.)"""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        batch = self._loops.get(loop)
        if batch is None:
            with self._lock:
                for closed in [other for other in self._loops if other.is_closed()]:
                    del self._loops[closed]
                here = never_waits(self.core.store)
                batch = self._loops.setdefault(
                    loop, _LoopBatch(loop, self.core.committer, here=here)
                )
        batch.add(op, future)
        return future

    async def _filled(self, jobs: list[Job]) -> list[Job]:
        if not _out_of_line(jobs):
            return jobs
        return await asyncio.to_thread(lambda: [self.core.fill(job) for job in jobs])

    def _on_commit(self) -> None:
        """On the writer thread after each commit: wake the claims waiting for one."""
        if not self._waiters:
            # A claim that starts waiting after this look sees the commit already counted
            # (the core's listener ran first): it does not wait for it.
            return
        with self._lock:
            waiters = list(self._waiters)
        for loop, event in waiters:
            with contextlib.suppress(RuntimeError):  # that loop has closed meanwhile
                loop.call_soon_threadsafe(event.set)

    # --- queues ----------------------------------------------------------------------------

    async def declare(self, queue: str, **config: Any) -> bool:
        return await self._run(builders.declare(queue, config))

    async def configure(self, queue: str, **changes: float | None) -> QueueConfig:
        return await self._run(builders.configure(queue, changes))

    async def config(self, queue: str) -> QueueConfig:
        return await self._run(ops.GetConfig(builders.queue_name(queue)))

    async def set_write_budget(self, writes_per_second: float | None) -> float | None:
        return await self._run(builders.set_write_budget(writes_per_second))

    async def workers(self) -> list[Worker]:
        return await self._run(ops.Workers())

    async def write_budget(self) -> float | None:
        return await self._run(ops.WriteBudget())

    async def purge(self, queue: str) -> int:
        return await self._run(builders.purge(queue))

    async def delete_queue(self, queue: str) -> int:
        return await self._run(builders.delete_queue(queue))

    # --- producing -------------------------------------------------------------------------

    async def enqueue(
        self,
        queue: str,
        payload: bytes,
        *,
        key: str | None = None,
        **options: Unpack[JobOptions],
    ) -> Job:
        op = builders.enqueue(queue, [payload], keys=None if key is None else [key], **options)
        jobs = await self._run(op)
        # (Filled off the loop only when a payload is out of line: no coroutine otherwise.)
        [job] = await self._filled(jobs) if _out_of_line(jobs) else jobs
        return job

    async def enqueue_many(
        self,
        queue: str,
        payloads: Iterable[bytes],
        *,
        keys: Sequence[str | None] | None = None,
        **options: Unpack[JobOptions],
    ) -> list[Job]:
        op = builders.enqueue(queue, payloads, keys=keys, **options)
        return await self._filled(await self._run(op))

    async def enqueue_staged(
        self,
        queue: str,
        staged: Sequence[StagedBodies],
        *,
        write_id: str,
        **options: Unpack[JobOptions],
    ) -> int | None:
        return await self._run(builders.enqueue_staged(queue, staged, write_id=write_id, **options))

    async def enqueue_runs(
        self, queue: str, runs: Sequence[StagedRun], *, write_id: str
    ) -> int | None:
        return await self._run(builders.enqueue_runs(queue, runs, write_id=write_id))

    # --- consuming -------------------------------------------------------------------------

    async def claim(
        self,
        queue: str | Sequence[str],
        n: int = 1,
        *,
        timeout: float | None = None,
        **options: Unpack[ClaimOptions],
    ) -> list[Delivery]:
        timeout = checked_timeout(timeout, Where("claim from {}", queue))
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            seen = self.core.commits
            jobs = await self._run(self.core.claim_op(queue, n, options))
            claimed = builders.deliveries(jobs)
            if _out_of_line(d.job for d in claimed):
                # Payloads to read from storage: off the loop, in parallel.
                found = await asyncio.to_thread(self.core.filled, claimed)
            else:
                found = self.core.fill_deliveries(claimed)
            if not found and claimed:
                continue  # every job it found was poison, dead-lettered: look again
            pause = self.core.next_poll_wait(bool(found))
            if found or end is None or time.monotonic() >= end:
                return found
            await self._next_commit(seen + 1, min(end, time.monotonic() + pause))

    async def _next_commit(self, after: int, until: float) -> None:
        """Wait for a commit past ``after`` (a later local enqueue, say) or until ``until``
        (the next look for another process's commit, or the claim's timeout)."""
        event = asyncio.Event()
        waiter = (asyncio.get_running_loop(), event)
        with self._lock:
            self._waiters.add(waiter)
        try:
            while not self.core.committed_since(after):
                remaining = until - time.monotonic()
                if remaining <= 0:
                    return
                event.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), remaining)
        finally:
            with self._lock:
                self._waiters.discard(waiter)

    async def ack(
        self, delivery: Delivery, *, outcome: str = "done", error: str | None = None
    ) -> None:
        await self._run(builders.ack(delivery, outcome=outcome, error=error))

    async def note_outcome(
        self, job_id: str, queue: str, outcome: str, *, token: str, error: str | None = None
    ) -> None:
        await self._run(builders.note_outcome(job_id, queue, outcome, error, token))

    async def nack(
        self,
        delivery: Delivery,
        *,
        error: str | None = None,
        retry: bool = True,
        delay: Delay = None,
    ) -> NackResult:
        return await self._run(builders.nack(delivery, error=error, retry=retry, delay=delay))

    async def heartbeat(self, deliveries: Sequence[Delivery], *, lease: Delay = None) -> list[bool]:
        return await self._run(builders.heartbeat(deliveries, lease=lease))

    async def release(self, deliveries: Sequence[Delivery]) -> list[bool]:
        return await self._run(builders.release(deliveries))

    @contextlib.asynccontextmanager
    async def keep_alive(
        self, deliveries: Sequence[Delivery], *, every: float | None = None
    ) -> AsyncIterator[None]:
        """Heartbeat ``deliveries`` from a background task while the block runs."""
        interval = heartbeat_interval(deliveries, every)

        async def beat() -> None:
            while True:
                await asyncio.sleep(interval)
                try:
                    await self.heartbeat(deliveries)
                except Exception as exc:  # keep beating: the next try may reach storage
                    log.warning("heartbeat failed: %s", exc)

        task = asyncio.create_task(beat()) if deliveries else None
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    # --- dead letters ----------------------------------------------------------------------

    async def dead_letters(self, queue: str) -> list[Job]:
        return await self._filled(await self._run(ops.DeadLetters(builders.queue_name(queue))))

    async def retry_dead(self, queue: str, ids: Sequence[str] | None = None) -> list[str]:
        return await self._run(builders.retry_dead(queue, ids))

    async def purge_dead(self, queue: str, ids: Sequence[str] | None = None) -> int:
        return await self._run(builders.purge_dead(queue, ids))

    # --- inspecting ------------------------------------------------------------------------

    async def queues(self) -> list[str]:
        return await self._run(ops.QueueNames())

    async def stats(self, queue: str) -> QueueStats:
        [found] = await self.stats_many([queue])
        return found

    async def stats_many(self, queues: Sequence[str]) -> list[QueueStats]:
        return await self._run(builders.stats(queues))

    async def job(self, job_id: str) -> tuple[JobState, Job] | None:
        found = await self._run(builders.find_job(job_id))
        if found is None:
            return None
        [job] = await self._filled([found[1]])
        return found[0], job

    async def jobs(
        self, queue: str, *, state: JobState | None = None, limit: int | None = None
    ) -> list[tuple[JobState, Job]]:
        rows = await self._run(builders.list_jobs(queue, state, limit))
        filled = await self._filled([job for _, job in rows])
        return [(where, job) for (where, _), job in zip(rows, filled, strict=True)]

    async def expire(self) -> int:
        return await self._run(ops.Expire())

    def metrics(self) -> EngineMetrics:
        return self.core.committer.metrics

    async def flush(self, timeout: float | None = None) -> None:
        await asyncio.to_thread(self.core.committer.flush, timeout)

    async def close(self) -> None:
        await asyncio.to_thread(self.core.committer.close)
