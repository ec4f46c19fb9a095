"""A write that bypassed the broker: a process that committed directly while the broker was
being elected (a Spark driver finds no broker and commits itself) changed the state under the
broker's cache. An inspection through the broker reads it again at once, so it shows the jobs,
and the claims parked at the broker take them, without waiting for the broker's own recheck."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from objq_broker import Delivery, Queue
from objq_broker.broker.elected import ElectedCommitter
from objq_broker.engine.loading import EXCLUSIVE_RECHECK_SECONDS


def test_an_inspection_at_the_broker_sees_a_direct_write_and_wakes_its_claims(
    tmp_path: Path,
) -> None:
    # Given a process that holds the broker, with a claim parked there for a job of "q"
    url = tmp_path.as_uri()
    with Queue(url, broker="auto") as broker:
        broker.declare("q")
        assert isinstance(broker.committer, ElectedCommitter)
        assert broker.committer.role == "leader"
        claimed: list[list[Delivery]] = []
        claimer = threading.Thread(target=lambda: claimed.append(broker.claim("q", timeout=20)))
        claimer.start()
        deadline = time.monotonic() + 10
        while broker.committer.parked_claims == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert broker.committer.parked_claims == 1

        # When another process commits a job directly, past the broker
        with Queue(url, broker="off") as direct:
            sent = direct.enqueue("q", b"job")
        asked = time.monotonic()
        stats = broker.stats("q")

        # Then the broker's answer has it, and the parked claim takes it, long before the
        # broker would have read the state again by itself
        claimer.join(10)
        assert stats.ready + stats.in_flight == 1
        assert [d.id for d in claimed[0]] == [sent.id]
        assert time.monotonic() - asked < EXCLUSIVE_RECHECK_SECONDS / 3
