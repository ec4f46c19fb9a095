"""How a job's run went, as the archive records it: an ack may say a run failed or was sent
again, and a framework that acked before running notes the outcome afterwards."""

from __future__ import annotations

import pytest

from objq_broker import Queue
from objq_broker.engine.archive import iter_archive
from objq_broker.errors import ConfigurationError, LeaseLost
from objq_broker.storage import MemoryStore


def _archived(store: MemoryStore) -> list[tuple[str, str, str | None]]:
    return sorted((r.outcome, r.job.id, r.job.error) for r in iter_archive(store))


@pytest.mark.parametrize("mode", ["off", "auto"])
def test_an_ack_archives_the_outcome_it_is_given(mode: str) -> None:
    store = MemoryStore()
    with Queue(store=store, broker=mode) as queue:
        queue.declare("q")
        [a, b, c] = [j.id for j in queue.enqueue_many("q", [b"a", b"b", b"c"])]
        held = {d.id: d for d in queue.claim("q", 3)}
        queue.ack(held[a])
        queue.ack(held[b], outcome="retried", error="TimeoutError: slow")
        queue.ack(held[c], outcome="failed", error="ValueError: bad")
        assert queue.stats("q").in_flight == 0
        events = queue.metrics()
    assert _archived(store) == sorted(
        [("done", a, None), ("retried", b, "TimeoutError: slow"), ("failed", c, "ValueError: bad")]
    )
    assert (events.acked, events.retried, events.failed) == (3, 1, 1)


@pytest.mark.parametrize("mode", ["off", "auto"])
def test_a_note_after_the_ack_adds_a_record_and_leaves_the_queue_alone(mode: str) -> None:
    store = MemoryStore()
    with Queue(store=store, broker=mode) as queue:
        queue.declare("q")
        [job, other] = queue.enqueue_many("q", [b"early-acked", b"waiting"])
        [delivery] = queue.claim("q")
        queue.ack(delivery)
        # The framework learns only now that the run failed.
        queue.note_outcome(
            job.id, "q", "failed", token=delivery.token, error="ZeroDivisionError: division by zero"
        )
        stats = queue.stats("q")
        assert (stats.ready, stats.in_flight, stats.dead) == (1, 0, 0)
        assert [job.id for _, job in queue.jobs("q")] == [other.id]
    assert _archived(store) == [
        ("done", job.id, None),
        ("failed", job.id, "ZeroDivisionError: division by zero"),
    ]
    [note] = [r for r in iter_archive(store) if r.outcome == "failed"]
    # A note is told from the job's own record by having no attempts and no body.
    assert (note.job.attempts, note.job.body, note.job.queue) == (0, "", "q")


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (lambda q, d: q.ack(d, outcome="dead"), "outcome"),
        (lambda q, d: q.ack(d, outcome="done", error=5), "error"),
        (lambda q, d: q.note_outcome(d.id, "q", "done", token=d.token), "outcome"),
        (lambda q, d: q.note_outcome(d.id, "", "failed", token=d.token), "queue"),
        (lambda q, d: q.note_outcome(d.id, "q", "failed", token=d.token, error=["x"]), "error"),
        (lambda q, d: q.note_outcome(d.id, "q", "failed", token=""), "token"),
    ],
)
def test_a_wrong_outcome_is_refused_before_anything_is_committed(call, expected) -> None:  # type: ignore[no-untyped-def]
    store = MemoryStore()
    with Queue(store=store) as queue:
        queue.enqueue("q", b"x")
        [delivery] = queue.claim("q")
        with pytest.raises(ConfigurationError, match=expected):
            call(queue, delivery)
        assert queue.stats("q").in_flight == 1
        queue.ack(delivery)
    assert [r.outcome for r in iter_archive(store)] == ["done"]


@pytest.mark.parametrize("mode", ["off", "auto"])
def test_a_note_needs_the_lease_of_the_delivery_that_ran_the_job(mode: str) -> None:
    store = MemoryStore()
    with Queue(store=store, broker=mode) as queue:
        queue.declare("q")
        [held_job, waiting] = queue.enqueue_many("q", [b"held", b"waiting"])
        [delivery] = queue.claim("q")
        # Nobody notes a failure on a job another worker holds, or one still waiting
        with pytest.raises(LeaseLost, match="stale"):
            queue.note_outcome(held_job.id, "q", "failed", token="forged", error="x")
        with pytest.raises(LeaseLost):
            queue.note_outcome(waiting.id, "q", "failed", token=delivery.token, error="x")
        # The holder may, before or after its ack
        queue.note_outcome(held_job.id, "q", "retried", token=delivery.token, error="slow")
        queue.ack(delivery)
        assert queue.stats("q").ready == 1
    assert _archived(store) == [("done", held_job.id, None), ("retried", held_job.id, "slow")]
