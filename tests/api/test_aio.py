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
