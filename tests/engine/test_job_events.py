"""What a process's operations did to jobs, counted in ``Queue.metrics()``: from results, so a
live idempotency key, a nack's retry or dead letter and an expired lease count as they were."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from objq_broker import Queue
from objq_broker.model.tally import JOB_EVENTS


@pytest.mark.parametrize("broker", ["off", "auto"])
def test_job_events_are_counted_from_what_the_state_decided(tmp_path: Path, broker: str) -> None:
    # Given one process, committing directly or through the broker it is elected as
    with Queue((tmp_path / "store").as_uri(), broker=broker) as queue:
        queue.declare("mail", max_attempts=5)
        # When it enqueues 4 jobs, and once more with a key that is still live
        queue.enqueue_many("mail", [b"a", b"b", b"c"])
        queue.enqueue("mail", b"d", key="once")
        queue.enqueue("mail", b"d again", key="once")
        # and claims them all: acks one, retries one, dead-letters one, gives one back
        first = queue.claim("mail", 4, lease=60)
        queue.ack(first[0])
        assert queue.nack(first[1], error="try again") == "retry"
        assert queue.nack(first[2], error="bad", retry=False) == "dead"
        queue.release([first[3]])
        # and a lease runs out: claimed, never extended, expired
        [stalled] = queue.claim("mail", 1, lease=0.2)
        time.sleep(0.4)
        assert queue.expire() == 1
        queue.flush()
        counts = queue.metrics().snapshot()

    # Then each event is counted once, as the state decided it
    events = {name: counts[name] for name in JOB_EVENTS}
    assert events == {
        "enqueued": 4,  # the repeated key enqueued nothing
        "claimed": 5,
        "acked": 1,
        "retried": 1,
        "failed": 0,  # said only by a framework's ack or note (tests/outcomes)
        "dead_lettered": 1,
        "released": 1,
        "expired": 1,
    }, stalled


@pytest.mark.parametrize("broker", ["off", "auto"])
def test_a_lease_that_runs_out_is_counted_by_the_commit_that_gives_it_back(
    tmp_path: Path, broker: str
) -> None:
    with Queue((tmp_path / "store").as_uri(), broker=broker) as queue:
        # Given a job whose holder stalled past its lease
        queue.enqueue("mail", b"a")
        queue.claim("mail", 1, lease=0.2)
        time.sleep(0.4)
        # When the next commit, for something else, returns it to its queue
        queue.enqueue("mail", b"b")
        queue.flush()
        assert queue.stats("mail").ready == 2
        counts = queue.metrics().snapshot()
    # Then it counts as expired, once
    assert (counts["expired"], counts["claimed"], counts["enqueued"]) == (1, 1, 2)
