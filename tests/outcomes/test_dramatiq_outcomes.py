"""A Dramatiq actor's runs as the archive records them, with a real in-process worker: a run
that raised and was sent again by the Retries middleware is archived as retried, a run that
raised with no such middleware as failed, and one whose retries are spent as dead."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator

import dramatiq
import pytest
from dramatiq import Worker
from dramatiq.middleware import Retries

from objq_broker.dramatiq import ObjqBroker
from objq_broker.engine.archive import iter_archive
from objq_broker.storage import MemoryStore


@pytest.fixture(autouse=True)
def quiet() -> Iterator[None]:
    # Dramatiq logs every failed run with its traceback; these fail on purpose.
    logging.disable(logging.CRITICAL)
    yield
    logging.disable(logging.NOTSET)


def _run(broker: ObjqBroker) -> None:
    worker = Worker(broker, worker_threads=2, worker_timeout=50)
    worker.start()
    try:
        broker.join("default", timeout=30_000)
    finally:
        worker.stop()
    broker.client.flush()


def test_a_retried_run_is_archived_as_retried_and_the_last_as_done_or_dead() -> None:
    store = MemoryStore()
    broker = ObjqBroker(store=store)
    dramatiq.set_broker(broker)
    runs: Counter[int] = Counter()

    @dramatiq.actor(max_retries=3, min_backoff=1, max_backoff=10)
    def second_time_lucky(n: int) -> None:
        runs[n] += 1
        if runs[n] == 1 or n == 0:
            raise ValueError(f"run {runs[n]} of {n}")

    for n in range(3):
        second_time_lucky.send(n)
    _run(broker)
    broker.close()
    # (A retry waits in the delay queue "default.DQ"; its hop from there is a job of its own.)
    outcomes = Counter(r.outcome for r in iter_archive(store) if r.job.queue == "default")
    # n=1 and n=2: one retried run, then done; n=0: three retried runs, then dead.
    assert outcomes == Counter({"retried": 2 + 3, "done": 2, "dead": 1})
    errors = {r.job.error for r in iter_archive(store) if r.outcome == "retried"}
    assert "ValueError: run 1 of 1" in errors


def test_a_run_that_raised_without_retries_is_archived_as_failed() -> None:
    store = MemoryStore()
    broker = ObjqBroker(store=store)
    for middleware in [m for m in broker.middleware if isinstance(m, Retries)]:
        broker.middleware.remove(middleware)
    dramatiq.set_broker(broker)

    @dramatiq.actor
    def odd_fails(n: int) -> None:
        if n % 2:
            raise RuntimeError(f"odd {n}")

    for n in range(4):
        odd_fails.send(n)
    _run(broker)
    broker.close()
    archived = sorted((r.outcome, r.job.error) for r in iter_archive(store))
    assert archived == [
        ("done", None),
        ("done", None),
        ("failed", "RuntimeError: odd 1"),
        ("failed", "RuntimeError: odd 3"),
    ]
