"""A writer never stores a state its own readers would refuse: the operation that would make
it too large is refused alone, the rest of its batch commits, and a full namespace still
takes what makes room. Real file stores, one batch built from concurrent submissions, and
through a real broker the same with sessions."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from objq_broker import Queue, builders
from objq_broker.broker.elected import ElectedCommitter
from objq_broker.builders import Delivery
from objq_broker.engine.batch import Pending
from objq_broker.engine.oversize import StateTooLarge, refuse_largest
from objq_broker.errors import StateFull

LIMIT = 256 * 1024
#: Jobs stay in the state's head (no spilling into runs), as a namespace with many queues
#: keeps them, so enqueues grow it.
OPTIONS: dict[str, Any] = {"max_state_bytes": LIMIT, "inline_state_bytes": LIMIT, "spill_at": None}
#: Jobs of this many bytes each stay in the state (they are small: no bodies object)...
BODY = b"b" * 100
#: ... so this many in one enqueue make a state past LIMIT on their own.
TOO_MANY = 4000


def _one_batch(queue: Queue, built: list[Any]) -> list[Future[Any]]:
    """Submit ``built`` so they meet in one commit: the writer is held busy by a flush
    while they are queued behind it."""
    return [queue.submit(op) for op in built]


def _outcome(future: Future[Any]) -> Any:
    try:
        return future.result(timeout=30)
    except Exception as exc:
        return exc


@pytest.mark.parametrize("broker", ["off", "auto"])
def test_the_operation_that_would_overfill_the_state_is_refused_alone(
    tmp_path: Path, broker: str
) -> None:
    url = (tmp_path / "ns").as_uri()
    with Queue(url, broker=broker, **OPTIONS) as queue:
        queue.enqueue("q", b"held")
        (held,) = queue.claim("q")
        good = [builders.enqueue("q", [f"good {n}".encode()]) for n in range(20)]
        flood = builders.enqueue("q", [BODY] * TOO_MANY)
        futures = _one_batch(queue, [*good[:10], flood, builders.ack(held), *good[10:]])
        outcomes = [_outcome(f) for f in futures]

        refused = outcomes[10]
        assert isinstance(refused, StateFull), refused
        assert "max_state_bytes" in str(refused) and "Enqueue" in str(refused)
        assert not any(isinstance(o, Exception) for i, o in enumerate(outcomes) if i != 10), [
            o for o in outcomes if isinstance(o, Exception)
        ]
        assert queue.stats("q").ready == 20
        assert queue.stats("q").in_flight == 0

    # And every reader with the same limit still reads the namespace
    with Queue(url, broker="off", max_state_bytes=LIMIT) as reader:
        assert reader.stats("q").ready == 20
    assert (tmp_path / "ns" / "state.json").stat().st_size <= LIMIT


def test_a_full_namespace_refuses_what_grows_it_and_takes_what_makes_room(
    tmp_path: Path,
) -> None:
    url = (tmp_path / "ns").as_uri()
    with Queue(url, broker="off", **OPTIONS) as queue:
        # Fill it in many commits, each of which fits, until the next one cannot
        added = 0
        with pytest.raises(StateFull):
            while True:
                queue.enqueue_many("q", [BODY] * 100)
                added += 100
        assert queue.stats("q").ready == added > 0
        # Then the jobs are there to work off, and working them off makes room again
        deliveries: list[Delivery] = queue.claim("q", 50)
        for delivery in deliveries:
            queue.ack(delivery)
        queue.enqueue("q", b"fits again")
        assert queue.stats("q").ready == added - 50 + 1


def test_a_session_through_the_broker_loses_only_its_overfilling_operation(
    tmp_path: Path,
) -> None:
    url = (tmp_path / "ns").as_uri()
    with (
        Queue(url, broker="auto", **OPTIONS) as leader,
        Queue(url, broker="client", **OPTIONS) as client,
    ):
        leader.declare("q")
        committer = client.committer
        assert isinstance(committer, ElectedCommitter)
        futures = _one_batch(
            client,
            [
                builders.enqueue("q", [b"before"]),
                builders.enqueue("q", [BODY] * TOO_MANY),
                builders.enqueue("q", [b"after"]),
            ],
        )
        before, flood, after = (_outcome(f) for f in futures)
        assert isinstance(flood, StateFull), flood
        assert not isinstance(before, Exception) and not isinstance(after, Exception)
        assert sorted(job.payload for _, job in leader.jobs("q")) == [b"after", b"before"]


def test_several_floods_in_one_batch_are_refused_and_no_small_operation_with_them() -> None:
    # Given a try whose state grew far past the limit, nearly all of it from four floods,
    # each adding more to the state than it carries (each job's times and attempts: four
    # such floods measured 257 bytes a job in the state, 240 in the operation)
    refusals: list[Future[object]] = [Future() for _ in range(4)]
    floods = [Pending(builders.enqueue("q", [BODY] * TOO_MANY), f) for f in refusals]
    good = [Pending(builders.enqueue("q", [f"good {n}".encode()]), Future()) for n in range(10)]
    live = [good[0], *floods[:2], *good[1:], *floods[2:]]
    before = 2_000
    grown = 4 * TOO_MANY * 257 + 10 * 257
    too_large = StateTooLarge(before + grown, LIMIT, before)

    # When the loop refuses what grew it
    refused = refuse_largest(live, too_large, "file:///ns")

    # Then the four floods are refused, each with its error, and every small enqueue stays
    assert refused == 4
    assert live == good
    assert all(isinstance(f.exception(timeout=0), StateFull) for f in refusals)
    assert not any(p.future.done() for p in good)
