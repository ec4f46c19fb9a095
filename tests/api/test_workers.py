"""Who is working: each lease holder with its queues, jobs held, oldest claim and last
heartbeat; holders whose leases ran out are shown as gone for an hour, then dropped."""

from __future__ import annotations

import os

from objq_broker import Queue
from objq_broker.model.workers import GONE_SECONDS, owner_parts
from tests.support.clock import ManualClock


def test_holders_are_listed_with_what_they_hold_and_when_they_last_renewed() -> None:
    clock = ManualClock(1_800_000_000.0)
    url = "memory://workers-listed"
    with (
        Queue(url, broker="off", owner="web-1:101:dramatiq", clock=clock) as one,
        Queue(url, broker="off", owner="web-2:202", clock=clock) as two,
    ):
        one.enqueue_many("emails", [b"a", b"b", b"c"])
        one.enqueue("reports", b"r")
        held = one.claim("emails", 2)
        clock.now += 10
        one.claim("reports")
        two.claim("emails")
        clock.now += 5
        one.heartbeat(held)
        rows = {w.owner: w for w in two.workers()}
    first, second = rows["web-1:101:dramatiq"], rows["web-2:202"]
    assert (first.status, first.host, first.pid, first.framework) == (
        "working",
        "web-1",
        101,
        "dramatiq",
    )
    assert first.queues == ["emails", "reports"] and first.jobs_held == 3
    assert first.oldest_claimed_at == 1_800_000_000.0
    assert first.last_seen_at == 1_800_000_015.0  # the heartbeat
    assert (second.jobs_held, second.framework, second.last_seen_at) == (1, None, 1_800_000_010.0)


def test_a_holder_whose_leases_ran_out_is_gone_for_an_hour_then_dropped() -> None:
    clock = ManualClock(1_800_000_000.0)
    url = "memory://workers-gone"
    with (
        Queue(url, broker="off", owner="dead:1:celery", clock=clock) as dead,
        Queue(url, broker="off", owner="alive:2", clock=clock) as alive,
    ):
        dead.enqueue_many("q", [b"a", b"b"])
        dead.claim("q", lease=30)
        clock.now += 60  # the dead worker never heartbeats
        assert alive.expire() == 1
        [gone] = alive.workers()
        assert (gone.owner, gone.status, gone.last_seen_at) == ("dead:1:celery", "gone", clock.now)
        [taken] = alive.claim("q")  # its job runs elsewhere
        assert {w.owner: w.status for w in alive.workers()} == {
            "alive:2": "working",
            "dead:1:celery": "gone",
        }
        alive.ack(taken)
        clock.now += GONE_SECONDS + 1
        alive.enqueue("q", b"later")  # any commit drops what is past the hour
        assert alive.workers() == []


def test_integrations_name_their_holders_by_host_process_and_framework() -> None:
    from objq_broker.dramatiq import ObjqBroker

    broker = ObjqBroker(url="memory://workers-dramatiq")
    try:
        host, pid, framework = owner_parts(broker.client.owner)
        assert (pid, framework) == (os.getpid(), "dramatiq") and host
    finally:
        broker.close()


def test_an_idle_holder_is_not_listed_and_a_released_one_leaves() -> None:
    with Queue("memory://workers-idle", broker="off", owner="w:3") as queue:
        queue.enqueue("q", b"x")
        [delivery] = queue.claim("q")
        assert [w.owner for w in queue.workers()] == ["w:3"]
        queue.release([delivery])  # given back, not expired: it left cleanly
        assert queue.workers() == []
