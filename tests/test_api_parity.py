"""The two faces of the API cannot drift, and only the engine touches the state object."""

from __future__ import annotations

import asyncio
import inspect
import re
from pathlib import Path

from objq_broker import AsyncQueue, Queue
from objq_broker.core import QueueCore

LIBRARY = Path(__file__).resolve().parent.parent / "objq_broker"
#: Queue methods that only make sense synchronously: its core's futures and payload filling
#: (what the coroutines are built on; the consumer core uses them through a Queue), and
#: ``on_arrivals``: a callback run on a commit thread, for an event loop of the sync world
#: (asyncio code awaits a claim).
SYNC_ONLY = {
    "submit",
    "submit_many",
    "submit_claim",
    "then_fill",
    "fill",
    "fill_deliveries",
    "next_poll_wait",
    "on_arrivals",
}


def _public(cls: type) -> dict[str, inspect.Signature]:
    """The public methods ``cls`` defines (each face is one class over the core it holds)."""
    assert cls.__bases__ == (object,), cls.__bases__
    return {
        name: inspect.signature(member)
        for name, member in vars(cls).items()
        if not name.startswith("_") and callable(member)
    }


def test_async_queue_has_every_method_of_queue_with_the_same_parameters() -> None:
    sync, coroutines = _public(Queue), _public(AsyncQueue)
    assert set(sync) - SYNC_ONLY == set(coroutines), set(sync) - SYNC_ONLY ^ set(coroutines)
    for name, signature in coroutines.items():
        # Waiting is what a coroutine does: the sync-only ``wait=`` switch has no async twin.
        expected = [p for p in sync[name].parameters if p != "wait"]
        assert list(signature.parameters) == expected, name
        member = getattr(AsyncQueue, name)
        if name not in {"keep_alive", "metrics"}:
            assert inspect.iscoroutinefunction(member), name


def test_the_sync_only_methods_are_the_cores_with_the_same_parameters() -> None:
    sync, core = _public(Queue), _public(QueueCore)
    for name in SYNC_ONLY:
        assert list(sync[name].parameters) == list(core[name].parameters), name


def test_the_sync_face_of_an_async_queue_shares_its_core() -> None:
    queue = AsyncQueue("memory://parity-core")
    try:
        assert queue.sync.core is queue.core and queue.sync.committer is queue.core.committer
        assert queue.sync is queue.sync  # made once, when first asked for
    finally:
        asyncio.run(queue.close())
    assert queue.sync.closed


def test_async_claim_wakes_on_a_local_commit_instead_of_polling() -> None:
    async def main() -> float:
        async with AsyncQueue("memory://parity-wake", poll_seconds=30) as q:
            await q.declare("q")
            waiting = asyncio.create_task(q.claim("q", timeout=20))
            await asyncio.sleep(0.2)  # the claim found nothing and waits
            loop = asyncio.get_running_loop()
            started = loop.time()
            await q.enqueue("q", b"x")
            [delivery] = await waiting
            await q.ack(delivery)
            return loop.time() - started

    # A poll would take 30 s; being woken by the commit takes one more claim's commit.
    assert asyncio.run(main()) < 10


def test_only_the_engine_reads_or_writes_the_state_object() -> None:
    touching = re.compile(r"\bSTATE_KEY\b|state\.json|\bdecode_state\b")
    offenders = [
        str(path.relative_to(LIBRARY))
        for path in LIBRARY.rglob("*.py")
        if path.parent.name not in {"engine", "model", "storage"}  # storage: examples only
        and any(touching.search(line) for line in path.read_text().splitlines()
                if not line.lstrip().startswith(("#", '"', "'")))
    ]  # fmt: skip
    assert offenders == []
