"""What a Celery worker on objq sees first, and how a chord with a lazy header is sent.

* A message sent to a no-ack queue (Celery's remote control: a revoke, a broadcast) just before
  a task reaches a consumer of both before the task, though the two are consumed on different
  channels of one connection: first with kombu's own event loop (the Hub Celery's worker runs)
  and consumers, then with a real Celery worker that must revoke each task whose revoke was
  sent just before it.
* A chord whose header is a generator sends its header tasks as the generator yields them:
  the result backend must not drain the generator when the chord is applied.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import kombu
import pytest
from celery import Celery, chord
from celery.contrib.testing.worker import start_worker
from celery.exceptions import TaskRevokedError
from celery.signals import before_task_publish
from kombu.asynchronous import Hub

import objq_broker.kombu  # noqa: F401  (registers the objq+... URLs)

OPTIONS = {"visibility_timeout": 30.0, "polling_interval": 0.1}
#: How many revoke-then-task pairs each test sends: the old transport lost the race in most.
ROUNDS = 12


def _run_until(hub: Hub, done: Callable[[], bool], within: float) -> None:
    deadline = time.monotonic() + within
    while not done() and time.monotonic() < deadline:
        hub.run_once()


def test_a_no_ack_message_sent_before_a_task_is_handed_out_first(
    connect: Callable[..., kombu.Connection],
) -> None:
    # Given a consumer connection in kombu's event loop with its task queue on the channel
    # made first and a no-ack "control" queue on a second channel, as a Celery worker has
    worker, sender = connect(**OPTIONS), connect(**OPTIONS)
    tasks = kombu.Queue("tasks", routing_key="tasks")
    control = kombu.Queue("control", routing_key="control")
    seen: list[str] = []

    def on_task(body: Any, message: kombu.Message) -> None:
        seen.append(body["name"])
        message.ack()

    def on_control(body: Any, message: kombu.Message) -> None:
        seen.append(body["name"])

    hub = Hub()
    try:
        task_consumer = kombu.Consumer(worker.default_channel, [tasks], callbacks=[on_task])
        control_consumer = kombu.Consumer(
            worker.channel(), [control], callbacks=[on_control], no_ack=True
        )
        task_consumer.qos(prefetch_count=4)
        worker.transport.register_with_event_loop(worker.connection, hub)
        with task_consumer, control_consumer:
            producer = kombu.Producer(sender.default_channel)
            for n in range(ROUNDS):
                # When a control message is sent and then a task, each committed before the next
                producer.publish({"name": f"control {n}"}, routing_key="control", declare=[control])
                producer.publish({"name": f"task {n}"}, routing_key="tasks", declare=[tasks])
                expected = 2 * (n + 1)
                _run_until(hub, lambda: len(seen) >= expected, within=10)
    finally:
        hub.close()

    # Then every control message reached its consumer before the task sent after it
    assert seen == [name for n in range(ROUNDS) for name in (f"control {n}", f"task {n}")]


# --- a real Celery worker (in this process, as Celery's own integration suite runs one) ---------


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Celery]:
    folder = tmp_path_factory.mktemp("celery-ordering")
    celery = Celery(
        "ordering",
        broker=f"objq+{(folder / 'broker').as_uri()}",
        backend=f"objq+{(folder / 'results').as_uri()}",
    )
    celery.conf.broker_transport_options = OPTIONS
    celery.conf.worker_hijack_root_logger = False

    def add(x: int, y: int) -> int:
        return x + y

    def tsum(numbers: list[int]) -> int:
        return sum(numbers)

    # (Registered by call, not as decorators: Celery's decorator is not annotated.)
    celery.task(name="ordering.add", shared=False)(add)
    celery.task(name="ordering.tsum", shared=False)(tsum)

    with start_worker(celery, pool="solo", perform_ping_check=False, shutdown_timeout=30):
        yield celery


@pytest.mark.timeout(120)
def test_a_task_whose_revoke_was_sent_just_before_it_never_runs(app: Celery) -> None:
    add = app.tasks["ordering.add"]
    for _ in range(ROUNDS):
        # Given a task whose revoke is broadcast to the worker just before the task is sent
        signature = add.si(1, 1)
        result = signature.freeze()
        app.control.revoke(result.id)
        signature.apply_async()
        # Then the worker had the revoke when the task came, and never ran it
        with pytest.raises(TaskRevokedError):
            result.get(timeout=30)
        assert result.status == "REVOKED"


@pytest.mark.timeout(120)
def test_a_chord_with_a_generator_header_sends_its_tasks_as_they_are_made(app: Celery) -> None:
    add, tsum = app.tasks["ordering.add"], app.tasks["ordering.tsum"]
    sent: list[str] = []
    sent_when_made: list[int] = []
    lock = threading.Lock()

    def count(headers: dict[str, Any] | None = None, **_: Any) -> None:
        if headers is not None and headers.get("task") == "ordering.add":
            with lock:
                sent.append(headers["id"])

    def header(size: int) -> Iterator[Any]:
        for n in range(size):
            with lock:
                sent_when_made.append(len(sent))
            yield add.si(n, n)

    before_task_publish.connect(count, weak=False)
    try:
        # Given a chord whose header is a generator of 5 tasks
        result = chord(header(5), tsum.s()).apply_async()
        # When it runs, then its callback gets every header task's result
        assert result.get(timeout=60) == sum(2 * n for n in range(5))
    finally:
        before_task_publish.disconnect(count)
    # And header tasks were sent while the generator was still making the rest (Celery reads
    # a task or two ahead): nothing drained the generator before the chord's tasks went out
    assert sent_when_made == sorted(sent_when_made), sent_when_made
    assert sent_when_made[-1] > 0, sent_when_made
