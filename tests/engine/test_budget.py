"""A write budget: at most N state writes per second for the whole namespace, every process
and the broker obeying the one setting; latency rises, nothing is lost, reads never wait."""

from __future__ import annotations

import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from objq_broker import ConfigurationError, Queue, builders


def _submit_many(queue: Queue, count: int) -> list[Future[Any]]:
    return [queue.submit(builders.enqueue("q", [f"{n}".encode()])) for n in range(count)]


@pytest.mark.parametrize("mode", ["off", "auto"])
def test_a_budget_spaces_state_writes_and_loses_nothing(tmp_path: Path, mode: str) -> None:
    with Queue(tmp_path.as_uri(), broker=mode) as queue:
        queue.declare("q")
        assert queue.set_write_budget(4.0) == 4.0
        queue.flush()
        writes = queue.metrics().state_writes
        started = time.monotonic()
        futures: list[Future[Any]] = []
        while time.monotonic() - started < 1.5:  # a steady trickle of single enqueues
            futures += _submit_many(queue, 5)
            time.sleep(0.01)
        for future in futures:
            future.result(10)
        took = time.monotonic() - started
        written = queue.metrics().state_writes - writes
        assert queue.stats("q").ready == len(futures)
    # At 4 writes a second, ~1.5-2 s of work takes about 6-8 writes, not one per trickle.
    assert written <= 4.0 * took + 2, (written, took)


@pytest.mark.parametrize("mode", ["off", "auto"])
def test_a_budget_keeps_a_grouped_queues_cap_and_loses_nothing(tmp_path: Path, mode: str) -> None:
    with Queue(tmp_path.as_uri(), broker=mode) as queue:
        # Given a queue of one job per tenant at a time, under a budget of 4 writes a second
        queue.declare("q", group_concurrency=1)
        queue.set_write_budget(4.0)
        futures = [
            queue.submit(builders.enqueue("q", [f"{n}".encode()], group=f"t{n % 3}"))
            for n in range(30)
        ]
        for future in futures:
            future.result(10)
        # When workers claim and finish them, a claim at a time
        done: list[bytes] = []
        while len(done) < 30:
            claimed = queue.claim("q", 10)
            assert claimed, "a claim found nothing while jobs were left"
            # Then no claim holds two jobs of one tenant
            groups = [d.job.group for d in claimed]
            assert len(groups) == len(set(groups)), groups
            for delivery in claimed:
                queue.ack(delivery)
                done.append(delivery.payload)
        # And every job ran once, each tenant's in order
        assert sorted(done) == sorted(f"{n}".encode() for n in range(30))
        for tenant in range(3):
            mine = [int(p) for p in done if int(p) % 3 == tenant]
            assert mine == sorted(mine)


def test_every_process_obeys_the_budget_another_set(tmp_path: Path) -> None:
    url = tmp_path.as_uri()
    with Queue(url, broker="off") as setter:
        setter.set_write_budget(2.0)
    with Queue(url, broker="off") as other:
        other.declare("q")  # reads the state: it now knows the budget
        started = time.monotonic()
        for n in range(4):
            other.enqueue("q", f"{n}".encode())  # each waits for the next allowed write
        took = time.monotonic() - started
        assert other.write_budget() == 2.0
    assert took >= 1.4, took  # 4 writes at 2 a second: at least 1.5 s (the first may be due)


def test_reads_never_wait_for_the_budget(tmp_path: Path) -> None:
    with Queue(tmp_path.as_uri(), broker="off") as queue:
        queue.declare("q")
        queue.set_write_budget(0.05)  # one write every 20 s
        started = time.monotonic()
        for _ in range(5):
            queue.stats("q")
            queue.config("q")
        assert time.monotonic() - started < 2.0
        assert queue.set_write_budget(None) is None  # nor does lifting it
        assert queue.write_budget() is None
        assert time.monotonic() - started < 2.0


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), True, "1", 1e6])
def test_a_budget_that_is_not_a_rate_is_refused(bad: object) -> None:
    with Queue("memory://budget-bad") as queue:
        with pytest.raises(ConfigurationError, match="writes_per_second"):
            queue.set_write_budget(bad)  # type: ignore[arg-type]
        assert queue.write_budget() is None
