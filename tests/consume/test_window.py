"""ClaimWindow against real queues: it widens under a backlog, hands every message out once and
loses none, gives back what waits too long for room and what is cached when it closes."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable

from objq_broker import Queue
from objq_broker.builders import Delivery
from objq_broker.consume import ClaimWindow
from tests.support.waiting import wait_for

#: Seconds any single wait in these tests may take before the test fails.
WITHIN = 10.0


def backlog(queue: Queue, count: int, name: str = "jobs", size: int = 0) -> list[bytes]:
    """Enqueue ``count`` numbered payloads (padded to ``size`` bytes) into ``name``."""
    queue.declare(name)
    payloads = [str(n).encode().ljust(size, b".") for n in range(count)]
    queue.enqueue_many(name, payloads)
    return payloads


def number(delivery: Delivery) -> int:
    return int(delivery.payload.rstrip(b"."))


def ack_all(queue: Queue, window: ClaimWindow, deliveries: list[Delivery]) -> None:
    for delivery in deliveries:
        settled = window.settle(delivery.token)
        assert settled is not None
        queue.ack(settled, wait=False)


def drain(
    queue: Queue, window: ClaimWindow, count: int, take: Callable[[], list[Delivery]]
) -> list[Delivery]:
    """Take and ack until ``count`` messages came, failing after ``WITHIN`` seconds."""
    seen: list[Delivery] = []
    deadline = time.monotonic() + WITHIN
    while len(seen) < count:
        assert time.monotonic() < deadline, f"{len(seen)} of {count} messages came"
        got = take()
        ack_all(queue, window, got)
        seen += got
        if not got:  # a claim is on its way
            window.wait(lambda: window.cached > 0, 0.05)
    return seen


def idle(queue: Queue, name: str = "jobs") -> tuple[int, int]:
    queue.flush()
    stats = queue.stats(name)
    return stats.ready, stats.in_flight


def test_a_backlog_widens_the_window_and_every_message_comes_once(
    queue: Queue, other: Queue
) -> None:
    # Given a backlog and a consumer that finishes each message at once
    backlog(other, 300)
    window = ClaimWindow(queue, ["jobs"], prefetch=4, max_window=64)
    widest = 0

    def take() -> list[Delivery]:
        nonlocal widest
        got = window.take(4 - window.in_hand, timeout=WITHIN)
        widest = max(widest, window.window)
        return got

    # When it drains the backlog
    seen = drain(queue, window, 300, take)
    window.close()
    # Then claims grew beyond the prefetch (within the ceiling), and each message came once
    assert 4 < widest <= 64
    assert sorted(map(number, seen)) == list(range(300))
    assert idle(queue) == (0, 0)


def test_two_consumers_share_a_backlog_without_duplicates_or_losses(
    queue: Queue, other: Queue
) -> None:
    backlog(queue, 400)
    seen: list[Delivery] = []
    lock = threading.Lock()

    def consume(handle: Queue) -> None:
        window = ClaimWindow(handle, ["jobs"], prefetch=3, max_window=32)
        deadline = time.monotonic() + WITHIN
        while time.monotonic() < deadline:
            got = window.take(3 - window.in_hand, timeout=0.2)
            ack_all(handle, window, got)
            with lock:
                seen.extend(got)
                if len(seen) >= 400:
                    break
        window.close()

    threads = [threading.Thread(target=consume, args=(h,)) for h in (queue, other)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WITHIN * 2)
    assert not any(thread.is_alive() for thread in threads)
    counts = Counter(number(d) for d in seen)
    assert sorted(counts) == list(range(400))  # none lost
    assert set(counts.values()) == {1}  # none twice
    other.flush()
    assert idle(queue) == (0, 0)


def test_messages_that_wait_for_room_too_long_are_given_back(queue: Queue, other: Queue) -> None:
    # Given a consumer with two messages running and more claimed ahead of it
    backlog(other, 50)
    window = ClaimWindow(queue, ["jobs"], prefetch=2, max_window=16, hoard_seconds=3600)
    running = window.take(1, timeout=WITHIN) + window.take(1, timeout=WITHIN)
    assert len(running) == 2

    def claimed_ahead() -> bool:
        """Messages are cached, and no claim is on its way (all claimed ones are cached)."""
        window.poll(0)  # (claims ahead while the consumer is full)
        return window.cached > 0 and other.stats("jobs").in_flight == 2 + window.cached

    wait_for(claimed_ahead, WITHIN, "claims made ahead")
    cached = window.cached
    # While the hoard time has not passed, nothing is given back
    assert window.poll(0) == [] and window.cached == cached
    # When cached messages have waited longer than the hoard time without room
    window.hoard_seconds = 0.1
    wait_for(lambda: (window.poll(0), window.cached == 0)[1], WITHIN, "the give-back")
    # Then only the running messages stay claimed, the window starts again from the prefetch,
    # and another consumer gets the rest, with no attempt counted for the give-back
    assert idle(queue) == (48, 2)
    assert window.window == 2
    rest = other.claim("jobs", 100)
    assert len(rest) == 48 and {d.job.attempts for d in rest} == {1}
    ack_all(queue, window, running)
    window.close()


def test_a_give_back_keeps_what_the_room_allows(queue: Queue, other: Queue) -> None:
    backlog(other, 30)
    window = ClaimWindow(queue, ["jobs"], prefetch=2, max_window=16, hoard_seconds=3600)
    running = window.take(1, timeout=WITHIN) + window.take(1, timeout=WITHIN)
    wait_for(lambda: (window.poll(0), window.cached)[1] >= 2, WITHIN, "a claim made ahead")
    ack_all(queue, window, running[:1])  # room for one
    window.hoard_seconds = 0.0
    [kept] = window.poll(1)
    assert window.cached == 0
    assert idle(queue)[1] == 2  # the one still running and the one just handed out
    ack_all(queue, window, [running[1], kept])
    window.close()


def test_closing_gives_back_what_is_cached_and_a_claim_still_landing(
    queue: Queue, other: Queue
) -> None:
    # Given a consumer running one message, with a claim ahead just submitted
    backlog(other, 20)
    window = ClaimWindow(queue, ["jobs"], prefetch=2, max_window=8)
    [running] = window.take(1, timeout=WITHIN)
    # When it closes
    window.close()
    # Then only the running message stays claimed, and the others are ready with no attempt
    assert idle(queue) == (19, 1)
    ready = [job for _, job in other.jobs("jobs", state="ready")]
    assert len(ready) == 19 and {job.attempts for job in ready} == {0}
    assert window.take(1, timeout=0.1) == [] and window.poll(1) == []  # claims nothing more
    ack_all(queue, window, [running])
    assert idle(queue) == (19, 0)


def test_release_held_gives_back_cached_and_handed_out_messages(queue: Queue, other: Queue) -> None:
    backlog(other, 10)
    window = ClaimWindow(queue, ["jobs"], prefetch=2, max_window=8)
    handed = window.take(2, timeout=WITHIN)
    assert window.release_held() >= len(handed)
    assert window.held() == [] and window.in_hand == 0
    assert idle(queue) == (10, 0)
    # The window goes on working afterwards (kombu's basic_recover)
    seen = drain(queue, window, 10, lambda: window.take(2 - window.in_hand, timeout=WITHIN))
    assert sorted(map(number, seen)) == list(range(10))
    window.close()


def test_dropped_deliveries_are_never_handed_out(queue: Queue, other: Queue) -> None:
    # Given a consumer holding one message and caching more
    backlog(other, 12)
    window = ClaimWindow(queue, ["jobs"], prefetch=2, max_window=8)
    [first] = window.take(1, timeout=WITHIN)
    lost = {d.token for d in window.held()}
    assert first.token in lost and len(lost) > 1
    # When the keeper reports their leases lost
    window.drop(lost)
    # Then none of them is handed out or heartbeated, and settling the running one says so
    assert not {d.token for d in window.held()} & lost
    assert window.settle(first.token) is None
    rest = drain(
        queue, window, 12 - len(lost), lambda: window.take(2 - window.in_hand, timeout=WITHIN)
    )
    assert not {d.token for d in rest} & lost
    window.close()


def test_a_polling_consumer_is_told_when_claims_land_and_rests_after_an_empty_one(
    queue: Queue, other: Queue
) -> None:
    landed = threading.Event()
    queue.declare("jobs")
    window = ClaimWindow(queue, ["jobs"], prefetch=4, max_window=8, on_claimed=landed.set)
    # An empty queue: the first poll submits a claim, which lands with nothing
    assert window.poll(4) == []
    assert landed.wait(WITHIN)
    landed.clear()
    # After an empty claim, polls claim nothing until asked to look again
    queue.flush()
    before = queue.metrics().ops
    assert window.poll(4) == []
    queue.flush()
    assert queue.metrics().ops == before + 1  # the flush alone
    other.enqueue("jobs", b"7")

    def delivered() -> list[Delivery]:
        # (this process's view of the state may be a fraction of a second old: look again)
        window.look_again()
        return window.poll(4)

    [delivery] = wait_for(delivered, WITHIN, "the message published elsewhere")
    assert number(delivery) == 7
    ack_all(queue, window, [delivery])
    window.close()


def test_payloads_kept_out_of_the_state_are_loaded_before_hand_out(
    queue: Queue, other: Queue
) -> None:
    # Payloads of 1 KiB live in bodies objects this consumer's process never wrote
    payloads = backlog(other, 40, size=1024)
    window = ClaimWindow(queue, ["jobs"], prefetch=4, max_window=16)
    by_poll = drain(queue, window, 20, lambda: window.poll(4 - window.in_hand))
    by_take = drain(queue, window, 20, lambda: window.take(4 - window.in_hand, timeout=WITHIN))
    assert sorted(d.payload for d in by_poll + by_take) == sorted(payloads)
    window.close()


def test_claims_take_turns_over_several_queues(queue: Queue, other: Queue) -> None:
    backlog(other, 10, "a")
    backlog(other, 10, "b")
    orders = [["a", "b"], ["b", "a"]]
    asked: list[list[str]] = []

    def in_turn() -> list[str]:
        asked.append(orders[len(asked) % 2])
        return asked[-1]

    window = ClaimWindow(queue, in_turn, prefetch=2, max_window=2)
    seen = drain(queue, window, 20, lambda: window.poll(2 - window.in_hand))
    window.close()
    assert Counter(d.job.queue for d in seen[:4]) == {"a": 2, "b": 2}
    assert Counter(d.job.queue for d in seen) == {"a": 10, "b": 10}
    assert len(asked) >= 10  # one call per claim


def test_better_jobs_claimed_later_are_handed_out_before_worse_ones_cached(
    queue: Queue, other: Queue
) -> None:
    # Given a consumer with a low-priority message claimed ahead and waiting in its cache
    other.declare("jobs")
    other.enqueue_many("jobs", [b"lo"] * 4, priority=10)
    window = ClaimWindow(queue, ["jobs"], prefetch=2, max_window=2, hoard_seconds=3600)
    running = window.take(1, timeout=WITHIN)
    wait_for(lambda: (window.poll(0), window.cached)[1] >= 2, WITHIN, "a claim made ahead")
    # When high-priority messages are sent after it, and the next claim made ahead takes one
    other.enqueue_many("jobs", [b"hi"] * 2, priority=0)
    running += window.poll(1)
    wait_for(lambda: (window.poll(0), window.cached)[1] >= 2, WITHIN, "the next claim")
    # Then the consumer gets the high-priority one first, as the queue would have given it
    handed = window.poll(None)
    assert [d.payload for d in running] == [b"lo", b"lo"]
    assert [d.payload for d in handed] == [b"hi", b"lo"]
    ack_all(queue, window, running + handed)
    window.close()
