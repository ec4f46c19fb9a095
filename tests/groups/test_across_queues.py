"""A worker of two queues, one of them holding 20,000 jobs: the other queue's jobs start
within a second of being sent, with Celery (a ``celery worker -Q a,b`` process) and with
Dramatiq (a worker of two actors' queues)."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import dramatiq
import pytest
from celery import Celery
from dramatiq import Worker

import objq_broker.kombu  # noqa: F401  (registers the objq+... URLs)
from objq_broker import Queue
from objq_broker.dramatiq import ObjqBroker
from tests.support.processes import Children
from tests.support.waiting import wait_for

ROOT = Path(__file__).parents[2]

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
def test_a_celery_worker_of_two_queues_starts_the_quiet_ones_jobs_at_once(
    tmp_path: Path, children: Children
) -> None:
    url = (tmp_path / "broker").as_uri()
    record = tmp_path / "waited.txt"
    record.touch()
    app = Celery("across", broker=f"objq+{url}")
    # Given queue "a" holding 20,000 tasks (copies of one sent message, enqueued in bulk)
    app.send_task("across.busy", queue="a")
    with Queue(url) as queue:
        [(_, sent)] = queue.jobs("a")
        for _ in range(0, BACKLOG - 1, 1000):
            queue.enqueue_many("a", [sent.payload] * 1000)
        queue.declare("b")
        # When a worker process (Celery's default pool) on -Q a,b works through a's backlog
        env = dict(os.environ, ACROSS_BROKER=f"objq+{url}", ACROSS_RECORD=str(record))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        children.start(
            [
                *(sys.executable, "-m", "celery", "-A", "tests.groups.across_app", "worker"),
                *("-Q", "a,b", "--concurrency", "2", "--loglevel", "WARNING"),
                *("--without-gossip", "--without-mingle", "--without-heartbeat"),
            ],
            env=env,
            cwd=ROOT,
            log=tmp_path / "worker.log",
            group=True,
        )
        wait_for(
            lambda: queue.stats("a").ready < BACKLOG - 100,
            60.0,
            "the worker to start on a's backlog",
            progress=(tmp_path / "worker.log").read_text,
        )
        # And ten tasks are sent to b
        for _ in range(SENT):
            app.send_task("across.quiet", (time.time(),), queue="b")
            time.sleep(0.05)
        wait_for(lambda: len(record.read_text().split()) >= SENT, 30.0, "b's tasks to start")
        left = queue.stats("a").ready
    app.close()
    seen = [float(line) for line in record.read_text().split()]
    # Then each of b's tasks started within a second of being sent, a's backlog still there
    assert len(seen) == SENT, f"only {len(seen)} of b's tasks ran: {seen}"
    assert max(seen) < WITHIN_SECONDS, seen
    assert left > BACKLOG / 2, "a's backlog drained first: the test proves nothing"


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
