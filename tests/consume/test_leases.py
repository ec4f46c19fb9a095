"""LeaseKeeper against real queues: held deliveries stay held while it beats, come back after the
lease once it stops, and a lost lease is reported to its holder once."""

from __future__ import annotations

import gc
import logging
import time

import pytest

from objq_broker import Queue
from objq_broker.builders import Delivery
from objq_broker.consume import LeaseKeeper, interval_for
from objq_broker.errors import ConfigurationError, LeaseLost
from objq_broker.storage import MemoryStore
from objq_broker.storage.faulty import FaultyStore
from tests.consume.holders import Holder
from tests.support.waiting import wait_for

#: A lease short enough to run out within a test, long enough for a loaded machine to beat it.
LEASE_SECONDS = 1.0
#: A keeper interval long enough that only the test's own ``beat()`` calls heartbeat.
BY_HAND = 3600.0


def claim_one(queue: Queue, payload: bytes = b"job", *, lease: float = LEASE_SECONDS) -> Delivery:
    queue.declare("jobs", lease_seconds=lease)
    queue.enqueue("jobs", payload)
    [delivery] = queue.claim("jobs")
    return delivery


def taken_elsewhere(other: Queue) -> list[Delivery]:
    """Wait until ``other`` can claim from "jobs" (a lease ran out); what it claimed, under a
    lease that outlasts the test."""
    return wait_for(
        lambda: other.claim("jobs", lease=60, timeout=0.1), 10 * LEASE_SECONDS, "a redelivery"
    )


def test_a_held_delivery_stays_held_while_the_keeper_runs_and_comes_back_after(
    queue: Queue, other: Queue
) -> None:
    # Given a delivery held under a short lease, and a keeper beating four times a lease
    delivery = claim_one(queue)
    assert delivery.job.lease is not None
    first_expiry = delivery.job.lease.expires_at
    keeper = LeaseKeeper(queue, interval_seconds=LEASE_SECONDS / 4, lease_seconds=LEASE_SECONDS)
    holder = Holder([delivery])  # (kept referenced: the keeper holds holders weakly)
    keeper.register(holder)
    try:
        # When another consumer keeps claiming for three leases
        stolen: list[Delivery] = []
        end = time.monotonic() + 3 * LEASE_SECONDS
        while time.monotonic() < end:
            stolen += other.claim("jobs", timeout=0.1)
        # Then it never gets the delivery, whose lease now ends well after the first one did
        assert stolen == []
        found = other.job(delivery.id)
        assert found is not None and found[0] == "in-flight"
        assert found[1].lease is not None and found[1].lease.expires_at > first_expiry
        assert holder.dropped == []
    finally:
        keeper.stop()
    # And once the keeper stops, the delivery comes back after its lease, to the other consumer
    [again] = taken_elsewhere(other)
    assert (again.id, again.job.attempts) == (delivery.id, 2)
    with pytest.raises(LeaseLost):
        queue.ack(delivery)  # the first holder's late ack is refused
    other.ack(again)


def test_a_lost_lease_is_reported_to_its_holder_once(
    queue: Queue, other: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a delivery whose lease ran out before any heartbeat, now held by another consumer
    delivery = claim_one(queue, lease=0.2)
    [taken] = taken_elsewhere(other)
    holder, keep = Holder([delivery]), Holder([])
    keeper = LeaseKeeper(queue, interval_seconds=BY_HAND)
    keeper.register(holder)
    keeper.register(keep)
    try:
        # When the keeper beats twice
        with caplog.at_level(logging.WARNING, logger="objq_broker.consume"):
            lost = [keeper.beat(), keeper.beat()]
    finally:
        keeper.stop()
    # Then the holder was told once, one line was logged, and the new holder kept its lease
    assert lost == [1, 0]
    assert holder.dropped == [{delivery.token}] and holder.held() == []
    assert keep.dropped == []
    logged = [r for r in caplog.records if "lost the leases" in r.getMessage()]
    assert len(logged) == 1 and delivery.id in logged[0].getMessage()
    other.ack(taken)


class SettledMeanwhile(Holder):
    """A holder that settles its delivery while the heartbeat is in flight."""

    def held(self) -> list[Delivery]:
        found = super().held()
        with self._lock:
            self.deliveries = []
        return found


def test_a_delivery_settled_during_the_heartbeat_is_not_reported_lost(
    queue: Queue, other: Queue
) -> None:
    delivery = claim_one(queue, lease=0.2)
    [taken] = taken_elsewhere(other)  # (the heartbeat will say the lease is not held)
    holder = SettledMeanwhile([delivery])
    keeper = LeaseKeeper(queue, interval_seconds=BY_HAND)
    keeper.register(holder)
    try:
        assert keeper.beat() == 0
    finally:
        keeper.stop()
    assert holder.dropped == []
    other.ack(taken)


def test_holders_are_held_weakly(queue: Queue, other: Queue) -> None:
    # Given two holders of lost leases, one of them dropped without unregistering
    first = claim_one(queue, b"first", lease=0.2)
    [first_taken] = taken_elsewhere(other)
    second = claim_one(queue, b"second", lease=0.2)
    [second_taken] = taken_elsewhere(other)
    kept, dropped = Holder([first]), Holder([second])
    keeper = LeaseKeeper(queue, interval_seconds=BY_HAND)
    keeper.register(kept)
    keeper.register(dropped)
    del dropped
    gc.collect()
    # Then only the live holder is heartbeated (a consumer dropped unclosed is as one that died)
    try:
        assert keeper.beat() == 1
    finally:
        keeper.stop()
    assert kept.dropped == [{first.token}]
    other.ack(first_taken)
    other.ack(second_taken)


def test_unregistered_holders_are_not_heartbeated(queue: Queue, other: Queue) -> None:
    delivery = claim_one(queue, lease=0.2)
    [taken] = taken_elsewhere(other)
    holder = Holder([delivery])
    keeper = LeaseKeeper(queue, interval_seconds=BY_HAND)
    keeper.register(holder)
    keeper.unregister(holder)
    try:
        assert keeper.beat() == 0
    finally:
        keeper.stop()
    assert holder.dropped == []
    other.ack(taken)


def test_the_keeper_starts_with_its_first_holder_and_stops_cleanly(queue: Queue) -> None:
    keeper = LeaseKeeper(queue, interval_seconds=BY_HAND, name="objq-test-heartbeat")
    holder = Holder([])
    running = [keeper.running]
    keeper.register(holder)
    running.append(keeper.running)
    keeper.stop()
    running.append(keeper.running)
    keeper.stop()  # idempotent
    keeper.register(holder)  # a stopped keeper stays stopped
    running.append(keeper.running)
    assert running == [False, True, False, False]


def test_a_failed_heartbeat_is_logged_and_the_keeper_beats_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given a held delivery and then a store that stops answering
    store = FaultyStore(MemoryStore("keeper-outage"), error_rate=0.0)
    with Queue(store=store, commit_deadline_seconds=0.2) as queue:
        delivery = claim_one(queue)
        holder = Holder([delivery])
        keeper = LeaseKeeper(queue, interval_seconds=BY_HAND)
        keeper.register(holder)
        store.error_rate = 1.0
        try:
            # When the keeper beats
            with caplog.at_level(logging.WARNING, logger="objq_broker.consume"):
                assert keeper.beat() == 0
            # Then the failure is logged, nothing is dropped, and the next beat succeeds
            store.error_rate = 0.0
            assert keeper.beat() == 0
        finally:
            keeper.stop()
        assert any("heartbeat of 1 leases failed" in r.getMessage() for r in caplog.records)
        assert holder.dropped == []
        queue.ack(delivery)


def test_intervals_are_a_third_of_the_lease_and_must_be_positive(queue: Queue) -> None:
    assert interval_for(30.0) == 10.0
    assert interval_for(0.01) > 0
    with pytest.raises(ConfigurationError, match="interval_seconds"):
        LeaseKeeper(queue, interval_seconds=0)
