"""Queues are not created by accident: a claim or a worker on a queue nobody declared fails,
naming it, the queues there are, and how to declare it; ``implicit_queues`` keeps the old
behaviour; an enqueue still declares its queue by first use."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from objq_broker import AsyncQueue, Queue
from objq_broker.errors import QueueNotFound
from tests.cli.objq_cli import one_line_error, run_objq


def test_claim_from_an_unknown_queue_says_which_queues_exist_and_how_to_declare() -> None:
    with Queue("memory://lifecycle-unknown") as q:
        q.declare("emails")
        with pytest.raises(QueueNotFound) as caught:
            q.claim("emials")
        message = str(caught.value)
        assert message.startswith("queue 'emials' is not declared; declared: ['emails']")
        assert "Queue.declare('emials')" in message
        # Waiting does not change that: the error comes at once, not after the timeout.
        with pytest.raises(QueueNotFound, match="emials"):
            q.claim("emials", timeout=30)
        # One unknown queue among several is enough to refuse the claim.
        q.enqueue("emails", b"x")
        with pytest.raises(QueueNotFound, match="emials"):
            q.claim(["emails", "emials"])
        assert q.stats("emails").ready == 1  # and nothing was claimed on the way
        assert q.queues() == ["emails"]


def test_the_async_api_refuses_the_same() -> None:
    async def main() -> None:
        async with AsyncQueue("memory://lifecycle-unknown-aio") as q:
            with pytest.raises(QueueNotFound, match="'nope' is not declared"):
                await q.claim("nope", timeout=5)

    asyncio.run(main())


def test_enqueue_declares_by_first_use_and_then_claims_work() -> None:
    with Queue("memory://lifecycle-first-use") as q:
        q.enqueue("new", b"hello")
        [delivery] = q.claim("new")
        assert delivery.payload == b"hello"
        q.ack(delivery)


def test_implicit_queues_keeps_the_old_behaviour() -> None:
    with Queue("memory://lifecycle-implicit", implicit_queues=True) as q:
        assert q.claim("later", timeout=0.2) == []
        assert q.queues() == []  # a claim does not create the queue
        q.enqueue("later", b"x")
        assert len(q.claim("later")) == 1


def test_objq_worker_on_a_typo_fails_in_one_line(tmp_path: Path) -> None:
    url = (tmp_path / "store").as_uri()
    assert run_objq("declare", "real", url=url).code == 0
    ran = run_objq("worker", "--queue", "typo", url=url)
    one_line_error(
        ran, 1, "queue 'typo' is not declared", "declared: ['real']", "objq declare typo"
    )
    # And the typo was not created on the way.
    status = run_objq("--json", "status", url=url).json()
    assert [row["queue"] for row in status["queues"]] == ["real"]


def test_objq_worker_declare_creates_the_queue_as_before(tmp_path: Path) -> None:
    url = (tmp_path / "store").as_uri()
    ran = run_objq("worker", "--queue", "fresh", "--declare", "--burst", url=url)
    assert ran.code == 0, ran.stderr
    with Queue(url, broker="off") as q:
        assert q.queues() == ["fresh"]
