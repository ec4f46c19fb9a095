"""Celery's result backend on objq (``objq_broker.results.celery``) under real Celery workers,
with objq as the broker too: nothing else runs.

Most tests run a worker in this process (``celery.contrib.testing.worker.start_worker``, the
threads pool), with the results on a local directory and on SeaweedFS (a real S3 server that
enforces conditional writes itself). The chord tests that kill a worker run ``celery worker``
processes on this module's ``worker_app``; a worker dies by SIGKILL at the moment a test picks
(after a header task reported to its chord, or while sending the chord's callback), and the
chord's callback must still run exactly once.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from celery import Celery, chain, chord, group, states, uuid
from celery.contrib.testing.worker import start_worker
from celery.exceptions import ImproperlyConfigured, TimeoutError
from celery.signals import before_task_publish, task_postrun

import objq_broker.kombu  # noqa: F401  (registers the objq+... broker and result backend URLs)
from objq_broker import Queue
from objq_broker.errors import ConfigurationError
from objq_broker.results.celery import ObjqBackend
from objq_broker.results.store import ResultStore
from objq_broker.storage import open_store
from tests.support.processes import Children
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
ADD, FAIL, HOLD, PART, TOTAL = (
    f"objq_test.{name}" for name in ("add", "fail", "hold", "part", "total")
)
#: A delivered message comes back this long after its worker died.
VISIBILITY_TIMEOUT = 2.0
#: Worker processes read their app's URLs, and when to die, from these.
BROKER_ENV, BACKEND_ENV = "OBJQ_TEST_BROKER", "OBJQ_TEST_BACKEND"
DIE_ENV, DIED_ENV = "OBJQ_TEST_DIE", "OBJQ_TEST_DIED"


# --- the tasks ---------------------------------------------------------------------------------


def add(x: int, y: int) -> int:
    return x + y


def fail(message: str) -> None:
    raise ValueError(message)


def hold(gate: str) -> str:
    """Run until the file ``gate`` exists."""
    deadline = time.monotonic() + 60
    while not Path(gate).exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{gate} never appeared")
        time.sleep(0.02)
    return "released"


def part(n: int, lines: str) -> int:
    """A chord header task: leaves a line for each run."""
    record(lines, f"part {n}")
    return n


def total(values: list[int], lines: str) -> int:
    """A chord callback: leaves a line for each run."""
    record(lines, f"total {len(values)} {sum(values)}")
    return sum(values)


def record(folder: str, line: str) -> None:
    """Append ``line`` to this process's file in ``folder`` (one short ``O_APPEND`` write lands
    whole, so processes and threads share the folder without a lock)."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    fd = os.open(Path(folder) / f"{os.getpid()}.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


def lines(folder: Path) -> Counter[str]:
    return Counter(
        line for log in folder.glob("*.log") for line in log.read_text().splitlines() if line
    )


#: The apps this test made: their connections, which hold the broker's engine, close after it.
_made: list[Celery] = []


@pytest.fixture(autouse=True)
def _close_apps() -> Iterator[None]:
    yield
    while _made:
        _made.pop().pool.force_close_all()


def make_app(broker: str, backend: str, **settings: Any) -> Celery:
    app = Celery("objq_results_test", broker=broker, backend=backend, set_as_current=False)
    _made.append(app)
    app.conf.update(
        broker_transport_options={
            "visibility_timeout": VISIBILITY_TIMEOUT,
            "polling_interval": 0.05,
        },
        task_acks_late=True,  # a task whose worker dies before the ack runs again
        broker_connection_retry_on_startup=True,  # Celery 5.4 and 5.5 warn without it
        worker_hijack_root_logger=False,
        **settings,
    )
    for name, function in ((ADD, add), (FAIL, fail), (HOLD, hold), (PART, part), (TOTAL, total)):
        app.task(name=name)(function)
    return app


# --- the worker process's app --------------------------------------------------------------------


def _die_once() -> None:
    """SIGKILL this worker, the first time any worker of the test gets here."""
    try:
        os.close(os.open(os.environ[DIED_ENV], os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    os.kill(os.getpid(), signal.SIGKILL)


def _arm_death(plan: str) -> None:
    """``after-report:N``: die once header task N stored its result and reported to its chord,
    before its ack. ``at-callback``: die when about to send a chord's callback."""
    if plan == "at-callback":

        def sending(sender: str | None = None, **_: Any) -> None:
            if sender == TOTAL:
                _die_once()

        before_task_publish.connect(sending, weak=False)
        return
    chosen = int(plan.removeprefix("after-report:"))

    def ran(sender: Any = None, args: Any = None, **_: Any) -> None:
        if sender is not None and sender.name == PART and args and args[0] == chosen:
            _die_once()

    task_postrun.connect(ran, weak=False)


#: ``celery -A tests.results.test_celery_backend:worker_app worker``: a worker process's app.
worker_app = make_app(
    os.environ.get(BROKER_ENV, "objq+memory://unused"),
    os.environ.get(BACKEND_ENV, "objq+memory://unused"),
)
if os.environ.get(DIE_ENV):
    _arm_death(os.environ[DIE_ENV])


# --- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(params=["file", "seaweedfs"])
def backend_url(request: pytest.FixtureRequest, store_url_factory: Callable[[str], str]) -> str:
    return f"objq+{store_url_factory(request.param)}"


@pytest.fixture
def broker_url(tmp_path: Path) -> str:
    return f"objq+{(tmp_path / 'broker').as_uri()}"


@contextmanager
def running(app: Celery, concurrency: int = 4) -> Iterator[str]:
    """A worker for ``app`` on threads of this process; its node name."""
    with start_worker(
        app,
        pool="threads",
        concurrency=concurrency,
        perform_ping_check=False,
        loglevel="WARNING",
        shutdown_timeout=30,
    ) as worker:
        yield worker.hostname


def result_names(backend_url: str) -> list[str]:
    """The result records in the backend's store."""
    store = open_store(backend_url.removeprefix("objq+"))
    try:
        return ResultStore(store).names()
    finally:
        store.close()


# --- one task --------------------------------------------------------------------------------


def test_results_failures_and_forget(broker_url: str, backend_url: str) -> None:
    app = make_app(broker_url, backend_url)
    with running(app):
        # A result comes back
        done = app.signature(ADD, (2, 3)).delay()
        assert done.get(timeout=30) == 5
        assert done.state == states.SUCCESS
        # A failure raises the task's exception, or returns it with propagate=False
        failed = app.signature(FAIL, ("it broke",)).delay()
        with pytest.raises(ValueError, match="it broke"):
            failed.get(timeout=30)
        assert failed.state == states.FAILURE
        returned = failed.get(propagate=False, timeout=30)
        assert isinstance(returned, ValueError) and returned.args == ("it broke",)
        assert "it broke" in failed.traceback
    # Read again by another app: the results are in storage, not in a cache of this one
    reader = make_app(broker_url, backend_url)
    assert reader.AsyncResult(done.id).get(timeout=5) == 5
    assert reader.AsyncResult(failed.id).state == states.FAILURE
    # forget() deletes the record: the task reads as pending again
    assert f"celery-task-meta-{done.id}" in result_names(backend_url)
    done.forget()
    assert f"celery-task-meta-{done.id}" not in result_names(backend_url)
    assert reader.AsyncResult(done.id).state == states.PENDING


def test_started_state_and_extended_fields(
    broker_url: str, backend_url: str, tmp_path: Path
) -> None:
    app = make_app(broker_url, backend_url, task_track_started=True, result_extended=True)
    gate = tmp_path / "gate"
    with running(app) as worker:
        held = app.signature(HOLD, (str(gate),)).delay()
        # A running task reads as STARTED, with the worker that runs it
        wait_for(lambda: held.state == states.STARTED, 30, "the task to be STARTED")
        assert held.info["hostname"] == worker
        gate.touch()
        assert held.get(timeout=30) == "released"
        assert held.state == states.SUCCESS
        summed = app.signature(ADD, (2, 3)).delay()
        assert summed.get(timeout=30) == 5
    # result_extended: the task's name, arguments and worker are stored with its result
    meta = app.backend.get_task_meta(summed.id, cache=False)
    assert meta["status"] == states.SUCCESS and meta["result"] == 5
    assert meta["name"] == ADD
    assert meta["args"] == [2, 3] and meta["kwargs"] == {}
    # The request's hostname: the node name, or the host's name in some Celery versions
    assert meta["worker"] in (worker, socket.gethostname())
    assert meta["queue"] == "celery"
    fresh = make_app(broker_url, backend_url, result_extended=True).AsyncResult(summed.id)
    assert (fresh.name, fresh.args, fresh.kwargs) == (ADD, [2, 3], {})
    assert fresh.date_done is not None


def test_get_times_out_on_a_task_that_never_runs(broker_url: str, backend_url: str) -> None:
    app = make_app(broker_url, backend_url)
    never = app.signature(ADD, (1, 1)).apply_async(queue="nobody-consumes-this")
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        never.get(timeout=0.5)
    waited = time.monotonic() - started
    assert 0.5 <= waited < 3.0, f"get(timeout=0.5) returned after {waited:.2f} s"
    assert never.state == states.PENDING


def test_a_result_stored_here_wakes_its_waiter_at_once(tmp_path: Path) -> None:
    url = f"objq+{(tmp_path / 'results').as_uri()}"
    app = make_app("objq+memory://wake", url)
    waiting = app.AsyncResult("stored-later")
    got: list[tuple[object, float]] = []

    def wait() -> None:
        value = waiting.get(timeout=30, interval=5.0)
        got.append((value, time.monotonic()))

    waiter = threading.Thread(target=wait)
    waiter.start()
    # After 3 s of waiting, reads are over 2.5 s apart (the pause doubles up to `interval`)
    time.sleep(3.0)
    # Another backend of this process (Celery makes one per thread) stores the result
    stored_at = time.monotonic()
    make_app("objq+memory://wake", url).backend.store_result("stored-later", 42, states.SUCCESS)
    waiter.join(timeout=30)
    assert got, "the waiter never returned"
    value, returned_at = got[0]
    assert value == 42
    assert returned_at - stored_at < 1.0, f"woken {returned_at - stored_at:.2f} s after the store"


def test_expired_results_read_as_pending_and_cleanup_deletes_them(
    broker_url: str, backend_url: str
) -> None:
    app = make_app(broker_url, backend_url, result_expires=2)
    with running(app):
        short = app.signature(ADD, (1, 2)).delay()
        assert short.get(timeout=30) == 3
        wait_for(
            lambda: app.backend.get_task_meta(short.id, cache=False)["status"] == states.PENDING,
            30,
            "the result to expire",
        )
        # Until cleanup, the expired record stays in storage; a fresh one is kept by cleanup
        assert f"celery-task-meta-{short.id}" in result_names(backend_url)
        fresh = app.signature(ADD, (2, 2)).delay()
        assert fresh.get(timeout=30) == 4
    assert app.backend.cleanup() == 1
    names = result_names(backend_url)
    assert f"celery-task-meta-{short.id}" not in names
    assert f"celery-task-meta-{fresh.id}" in names


# --- canvas ------------------------------------------------------------------------------------


def test_group_chain_and_chord(broker_url: str, backend_url: str, tmp_path: Path) -> None:
    app = make_app(broker_url, backend_url)
    ran = tmp_path / "ran"
    with running(app):
        grouped = group(app.signature(ADD, (n, n)) for n in range(100)).apply_async()
        chained = chain(
            app.signature(ADD, (1, 1)), app.signature(ADD, (2,)), app.signature(ADD, (3,))
        ).apply_async()
        broken = chain(
            app.signature(ADD, (1, 1)),
            app.signature(FAIL, ("mid",), immutable=True),
            app.signature(ADD, (3,)),
        ).apply_async()
        header = [app.signature(PART, (n, str(ran))) for n in range(1000)]
        chorded = chord(header, app.signature(TOTAL, (str(ran),)))()
        assert grouped.get(timeout=120) == [2 * n for n in range(100)]
        assert chained.get(timeout=60) == 7
        with pytest.raises(ValueError, match="mid"):
            broken.get(timeout=60)
        assert chorded.get(timeout=240) == sum(range(1000))
        failing = chord(
            [app.signature(ADD, (1, 1)), app.signature(FAIL, ("header",))],
            app.signature(TOTAL, (str(ran),)),
        )()
        with pytest.raises(Exception, match="header") as raised:
            failing.get(timeout=60)
        assert type(raised.value).__name__ in ("ChordError", "ValueError")
    seen = lines(ran)
    # The callback ran once, after every header task ran; the failed chord never called back
    assert [line for line in seen if line.startswith("total")] == [f"total 1000 {sum(range(1000))}"]
    assert seen["total 1000 499500"] == 1
    assert {f"part {n}" for n in range(1000)} <= set(seen)


def test_a_header_task_reported_twice_counts_once(tmp_path: Path) -> None:
    # Given a chord of three whose header tasks report by hand, as redelivered tasks would
    app = make_app("objq+memory://twice", f"objq+{(tmp_path / 'results').as_uri()}")
    backend: ObjqBackend = app.backend
    ran = tmp_path / "ran"
    group_id, ids = uuid(), [uuid() for _ in range(3)]
    body = app.signature(TOTAL, (str(ran),))
    callback = body.freeze()
    backend.apply_chord((group_id, [app.AsyncResult(task_id) for task_id in ids]), body)
    backend.set_chord_size(group_id, 3)

    class Request:
        def __init__(self, index: int) -> None:
            self.id, self.group, self.group_index = ids[index], group_id, index
            self.chord = dict(body)

    first, second, third = Request(0), Request(1), Request(2)
    with running(app):
        # When the first reports three times and the second once, nothing is called back
        for request in (first, first, second, first):
            backend.on_chord_part_return(request, states.SUCCESS, 10)
        time.sleep(1.0)
        assert not lines(ran), "the callback ran before the header was complete"
        # Then the third completes the header, once; late copies change nothing
        backend.on_chord_part_return(third, states.SUCCESS, 12)
        assert callback.get(timeout=30) == 32
        for request in (third, first):
            backend.on_chord_part_return(request, states.SUCCESS, 10)
        time.sleep(1.0)
    assert lines(ran) == Counter({"total 3 32": 1})


# --- worker processes that die -----------------------------------------------------------------


def _start_worker(children: Children, env: dict[str, str], name: str, logs: Path) -> Any:
    command = [
        sys.executable, "-m", "celery", "-A", "tests.results.test_celery_backend:worker_app",
        "worker", "--pool", "threads", "--concurrency", "4", "--hostname", f"{name}@%h",
        "--loglevel", "WARNING", "--without-gossip", "--without-mingle", "--without-heartbeat",
    ]  # fmt: skip
    return children.start(command, env=env, cwd=ROOT, log=logs / f"{name}.log", group=True)


def _worker_env(broker: str, backend: str, die: str, died: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {BROKER_ENV: broker, BACKEND_ENV: backend, DIE_ENV: die, DIED_ENV: str(died)},
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p),
    )
    return env


def _wait_drained(broker_url: str, timeout: float) -> None:
    """Until the app's queue holds nothing ready, delayed or delivered."""
    with Queue(broker_url.removeprefix("objq+")) as queue:

        def drained() -> bool:
            stats = queue.stats("celery")
            return stats.ready + stats.delayed + stats.in_flight == 0

        wait_for(drained, timeout, "the celery queue to drain", interval=0.2)


@dataclass
class DyingPair:
    """Two worker processes on one store, either of which dies once at ``die``; what their
    tasks ran is logged in ``ran``, and ``died`` appears when one died."""

    broker: str
    backend: str
    ran: Path
    died: Path
    workers: list[Any]

    def check_one_died_and_all_settled(self) -> None:
        """Every message done, a second callback given the time to run, one worker dead."""
        _wait_drained(self.broker, timeout=60)
        time.sleep(1.0)
        assert self.died.exists() and sum(w.poll() is not None for w in self.workers) == 1

    def callbacks(self) -> list[str]:
        return [line for line in lines(self.ran).elements() if line.startswith("total")]


def _dying_pair(tmp_path: Path, children: Children, die: str) -> DyingPair:
    broker, backend = (f"objq+{(tmp_path / name).as_uri()}" for name in ("broker", "results"))
    died = tmp_path / "died"
    env = _worker_env(broker, backend, die, died)
    workers = [_start_worker(children, env, name, tmp_path / "logs") for name in ("w1", "w2")]
    return DyingPair(broker, backend, tmp_path / "ran", died, workers)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_chord_of_1000_calls_back_once_though_a_worker_died_after_a_header_report(
    tmp_path: Path, children: Children
) -> None:
    # Given two workers, either of which dies once header task 100 has reported, before its ack
    pair = _dying_pair(tmp_path, children, "after-report:100")
    app, ran = make_app(pair.broker, pair.backend), str(pair.ran)
    # When a chord of 1,000 runs
    header = [app.signature(PART, (n, ran)) for n in range(1000)]
    result = chord(header, app.signature(TOTAL, (ran,)))()
    # Then its callback's result comes back
    assert result.get(timeout=240) == sum(range(1000))
    # And once header task 100 ran again on the other worker, and every message is done
    wait_for(lambda: lines(pair.ran)["part 100"] >= 2, 60, "task 100 to run again")
    pair.check_one_died_and_all_settled()
    assert pair.callbacks() == [f"total 1000 {sum(range(1000))}"]
    assert {f"part {n}" for n in range(1000)} <= set(lines(pair.ran))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_chord_calls_back_once_though_its_worker_died_sending_the_callback(
    tmp_path: Path, children: Children
) -> None:
    # Given two workers, either of which dies as it sends a chord's callback: after its report
    # completed the header and claimed the callback, before the callback is sent
    pair = _dying_pair(tmp_path, children, "at-callback")
    app, ran = make_app(pair.broker, pair.backend), str(pair.ran)
    # When a chord of 20 runs
    result = chord(
        [app.signature(PART, (n, ran)) for n in range(20)], app.signature(TOTAL, (ran,))
    )()
    # Then the other worker sends the callback once the claim lapsed, and it runs once
    assert result.get(timeout=120) == sum(range(20))
    pair.check_one_died_and_all_settled()
    assert pair.callbacks() == [f"total 20 {sum(range(20))}"]


# --- configuration -----------------------------------------------------------------------------


def test_the_alias_and_the_class_path_name_the_backend(tmp_path: Path) -> None:
    url = (tmp_path / "results").as_uri()
    by_alias = Celery(backend=f"objq+{url}", set_as_current=False).backend
    assert isinstance(by_alias, ObjqBackend) and by_alias.as_uri() == f"objq+{url}"
    by_class = Celery(
        backend=f"objq_broker.results.celery:ObjqBackend+{url}", set_as_current=False
    ).backend
    assert isinstance(by_class, ObjqBackend) and by_class.settings.url == url
    by_option = Celery(backend="objq_broker.results.celery:ObjqBackend", set_as_current=False)
    by_option.conf.result_backend_transport_options = {"url": url, "prefix": "celery-results/"}
    assert by_option.backend.settings.url == url
    by_option.backend.set("k", b"v")
    assert (tmp_path / "results" / "celery-results" / "k").exists()


@pytest.mark.parametrize(
    ("backend", "options", "expected"),
    [
        ("objq+ftp://host/x", {}, "unknown scheme 'ftp'; accepted: memory://, file://"),
        ("objq+file://", {}, "expected a directory after file://"),
        ("objq+s3://", {}, "expected a bucket name"),
        ("objq://", {}, "expected a storage URL, as result_backend = 'objq+<storage URL>'"),
        ("objq://somewhere", {}, "objq:// names no storage"),
        ("objq+memory://a", {"url": "memory://b"}, "expected one of them"),
        ("objq+memory://a", {"visibility": 1}, "unknown option(s) visibility; accepted:"),
    ],
)
def test_bad_configuration_says_what_was_expected(
    backend: str, options: dict[str, Any], expected: str
) -> None:
    app = Celery(backend=backend, set_as_current=False)
    app.conf.result_backend_transport_options = options
    with pytest.raises(ConfigurationError) as raised:
        _ = app.backend
    assert isinstance(raised.value, ImproperlyConfigured)
    assert expected in str(raised.value)
