"""AsyncQueue as a user drives it: the same operations as Queue, awaited."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from objq_broker import AsyncQueue


def test_async_queue_round_trip(tmp_path: Path) -> None:
    async def scenario() -> list[bytes]:
        async with AsyncQueue(tmp_path.as_uri()) as q:
            await q.declare("q", max_attempts=1)
            await q.enqueue_many("q", [b"a", b"b", b"c"])
            got = await q.claim("q", 3, timeout=2)
            async with q.keep_alive(got[:1], every=0.05):
                await asyncio.sleep(0.1)  # kept: heartbeats run while the job is held
            await q.ack(got[0])
            assert await q.nack(got[1], error="x") == "dead"
            await q.release(got[2:])
            stats = await q.stats("q")
            assert (stats.ready, stats.dead, stats.in_flight) == (1, 1, 0)
            assert [j.payload for j in await q.dead_letters("q")] == [b"b"]
            assert await q.purge_dead("q") == 1
            return [d.payload for d in got]

    assert asyncio.run(scenario()) == [b"a", b"b", b"c"]


def test_async_claim_timeout_returns_empty(tmp_path: Path) -> None:
    async def scenario() -> float:
        async with AsyncQueue(tmp_path.as_uri(), poll_seconds=0.05) as q:
            await q.declare("q")
            started = time.monotonic()
            assert await q.claim("q", timeout=0.2) == []
            return time.monotonic() - started

    assert asyncio.run(scenario()) >= 0.2


def _batched(url: str, *, cancel: bool, **options: object) -> tuple[int, list[str], str, int]:
    """Fifty coroutines enqueue at once, one of them a bad payload; with ``cancel``, one more
    is cancelled before its operation was committed. Returns the state writes they took, the
    jobs enqueued, the bad one's error and the queue's ready count."""

    async def scenario() -> tuple[int, list[str], str, int]:
        async with AsyncQueue(url, **options) as q:  # type: ignore[arg-type]
            await q.declare("q")
            # (A state write is counted before the operations it holds are settled; the
            # count of batches is not.)
            before = q.metrics().state_writes
            cancelled = asyncio.ensure_future(q.enqueue("q", b"never")) if cancel else None
            good = [asyncio.ensure_future(q.enqueue("q", f"job {i}".encode())) for i in range(49)]
            bad = asyncio.ensure_future(q.enqueue("q", "not bytes"))  # type: ignore[arg-type]
            await asyncio.sleep(0)  # every one has submitted its operation
            if cancelled is not None:
                cancelled.cancel()  # the loop has not committed it yet: it is its own thread
            results = await asyncio.gather(*good, bad, return_exceptions=True)
            jobs = [r.payload.decode() for r in results if not isinstance(r, BaseException)]
            [error] = [str(r) for r in results if isinstance(r, BaseException)]
            writes = q.metrics().state_writes - before
            return writes, jobs, error, (await q.stats("q")).ready

    return asyncio.run(scenario())


def test_a_loops_operations_commit_together_in_its_thread_on_memory() -> None:
    writes, jobs, error, ready = _batched("memory://aio-batched", cancel=True)
    # One commit for the forty-nine (the bad payload is refused before it is submitted),
    # and the cancelled enqueue never committed
    assert writes == 1
    assert jobs == [f"job {i}" for i in range(49)]
    assert "bytes" in error
    assert ready == 49


def test_a_loops_operations_reach_the_writer_together_on_a_folder(tmp_path: Path) -> None:
    writes, jobs, error, ready = _batched(
        tmp_path.as_uri(), cancel=False, broker="off", fsync=False
    )
    # Handed to the writer thread, and back through one wake-up of the loop per commit
    assert 1 <= writes <= 3
    assert jobs == [f"job {i}" for i in range(49)]
    assert "bytes" in error
    assert ready == 49


def test_an_operation_on_a_closed_async_queue_fails_with_why() -> None:
    async def scenario() -> str:
        q = AsyncQueue("memory://aio-closed")
        await q.declare("q")
        await q.close()
        try:
            await q.enqueue("q", b"late")
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return "no error"

    assert asyncio.run(scenario()).startswith("QueueClosed")


def test_a_lone_coroutine_committing_at_once_still_gives_the_loop_its_turns() -> None:
    """On memory, a lone coroutine's operation commits at once (nothing else could join its
    batch), and awaiting a future already done does not yield: the loop must still get its
    turns, or a claim-and-ack loop over a backlog would stop its timers and sockets."""

    async def scenario() -> tuple[int, int]:
        async with AsyncQueue("memory://aio-turns") as q:
            await q.declare("q")
            await q.enqueue_many("q", [b"job"] * 1000)
            ticks = 0

            async def clock() -> None:  # woken by a timer, never ready in the same turn
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.001)
                    ticks += 1

            ticking = asyncio.create_task(clock())
            await asyncio.sleep(0.01)
            started, done = ticks, 0
            while deliveries := await q.claim("q"):
                await q.ack(deliveries[0])
                done += 1
            during = ticks - started
            ticking.cancel()
            return done, during

    done, during = asyncio.run(scenario())
    assert done == 1000
    # Two operations a job, a turn of the loop at least every sixteen: the clock ticked
    assert during >= 20, during
