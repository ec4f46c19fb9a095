"""A worker of two queues, one of them holding 20,000 jobs: the other queue's jobs start
within a second of being sent, with Celery (a worker on ``-Q a,b``) and with Dramatiq (a
worker of two actors' queues)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import dramatiq
import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker
from dramatiq import Worker

import objq_broker.kombu  # noqa: F401  (registers the objq+... URLs)
from objq_broker import Queue
from objq_broker.dramatiq import ObjqBroker

BACKLOG = 20_000
SENT = 10
#: How long after being sent each of the quiet queue's jobs must start.
WITHIN_SECONDS = 1.0


def _waits(record: list[float], sent: int, within: float) -> list[float]:
    deadline = time.monotonic() + within
    while len(record) < sent and time.monotonic() < deadline:
        time.sleep(0.05)
    return list(record)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_celery_worker_of_two_queues_starts_the_quiet_ones_jobs_at_once(tmp_path: Path) -> None:
    url = (tmp_path / "broker").as_uri()
    app = Celery("across", broker=f"objq+{url}")
    app.conf.broker_transport_options = {"visibility_timeout": 60.0, "polling_interval": 0.1}
    app.conf.worker_hijack_root_logger = False
    app.conf.task_ignore_result = True
    waited: list[float] = []

    def busy() -> None:
        time.sleep(0.001)

    def quiet(sent_at: float) -> None:
        waited.append(time.time() - sent_at)

    # (Registered by call, not as decorators: Celery's decorator is not annotated.)
    app.task(name="across.busy", shared=False)(busy)
    app.task(name="across.quiet", shared=False)(quiet)
    # Given queue "a" holding 20,000 tasks (copies of one sent message, enqueued in bulk)
    app.send_task("across.busy", queue="a")
    with Queue(url) as queue:
        [(_, sent)] = queue.jobs("a")
        for _ in range(0, BACKLOG - 1, 1000):
            queue.enqueue_many("a", [sent.payload] * 1000)
        queue.declare("b")
    # When a worker of queues a and b runs, and ten tasks are sent to b
    with start_worker(
        app, pool="solo", perform_ping_check=False, shutdown_timeout=30, queues=["a", "b"]
    ):
        time.sleep(1.0)  # it is busy with a's backlog
        for _ in range(SENT):
            app.send_task("across.quiet", (time.time(),), queue="b")
            time.sleep(0.05)
        seen = _waits(waited, SENT, 30.0)
    app.close()
    # Then each of b's tasks started within a second of being sent
    assert len(seen) == SENT, f"only {len(seen)} of b's tasks ran: {seen}"
    assert max(seen) < WITHIN_SECONDS, seen


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_dramatiq_worker_of_two_queues_starts_the_quiet_ones_jobs_at_once(
    tmp_path: Path,
) -> None:
    broker = ObjqBroker(url=(tmp_path / "broker").as_uri())
    waited: list[float] = []
    lock = threading.Lock()

    @dramatiq.actor(broker=broker, queue_name="a")
    def busy() -> None:
        time.sleep(0.001)

    @dramatiq.actor(broker=broker, queue_name="b")
    def quiet(sent_at: float) -> None:
        with lock:
            waited.append(time.time() - sent_at)

    # Given queue "a" holding 20,000 messages
    payloads = [busy.message().encode() for _ in range(BACKLOG)]
    for start in range(0, BACKLOG, 1000):
        broker.client.enqueue_many("a", payloads[start : start + 1000])
    # When a worker of both actors' queues runs, and ten messages are sent to b
    worker = Worker(broker, worker_threads=2)
    worker.start()
    try:
        time.sleep(1.0)  # it is busy with a's backlog
        for _ in range(SENT):
            quiet.send(time.time())
            time.sleep(0.05)
        seen = _waits(waited, SENT, 30.0)
    finally:
        worker.stop()
        broker.close()
    # Then each of b's messages started within a second of being sent
    assert len(seen) == SENT, f"only {len(seen)} of b's messages ran: {seen}"
    assert max(seen) < WITHIN_SECONDS, seen
