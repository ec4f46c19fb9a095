"""Celery's throwaway queues expire: a real ``celery worker`` sending events, a real Flower and a
real ``celery events`` receiving them, then Flower stopped with SIGTERM and ``celery events``
killed with SIGKILL. Once ``event_queue_expires`` has passed, no ``celeryev.*`` queue is left
(nor bound) and ``objq status --json`` lists only the queues of live processes; the worker's
events, still flowing, do not bring them back."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from objq_broker.engine.bindings import read_exchange
from objq_broker.storage import open_store
from tests.cli.objq_cli import run_objq
from tests.support.waiting import wait_for

pytest.importorskip("flower", reason="the Flower test needs flower (the test extra)")

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.lifecycle.events_app"
#: The app's event_queue_expires and control_queue_expires (seconds), short for the test.
EVENT_QUEUE_EXPIRES = 2.0
CONTROL_QUEUE_EXPIRES = 4.0
WORKER = "lifecycle-worker"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Processes:
    """Celery processes of one test, each in its own process group, killed at the end."""

    def __init__(self, url: str, logs: Path) -> None:
        self.env = dict(os.environ)
        self.env.update(
            CELERY_BROKER_URL=f"objq+{url}",
            EVENT_QUEUE_EXPIRES=str(EVENT_QUEUE_EXPIRES),
            CONTROL_QUEUE_EXPIRES=str(CONTROL_QUEUE_EXPIRES),
            PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
            OBJQ_BROKER="off",
        )
        self.env.pop("OBJQ_URL", None)
        self.logs = logs
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        self.logs.mkdir(parents=True, exist_ok=True)
        with (self.logs / f"{name}.log").open("ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", APP, *args],
                cwd=ROOT,
                env=self.env,
                start_new_session=True,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.started.append(process)
        return process

    def log(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def kill_all(self) -> None:
        for process in self.started:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)


@pytest.fixture
def celery_processes(tmp_path: Path) -> Iterator[tuple[str, Processes]]:
    url = (tmp_path / "store").as_uri()
    (tmp_path / "store").mkdir()
    processes = Processes(url, tmp_path / "logs")
    try:
        yield url, processes
    finally:
        processes.kill_all()


def _queues(url: str) -> dict[str, dict[str, Any]]:
    status = run_objq("--json", "status", url=url)
    assert status.code == 0, status.stderr
    return {row["queue"]: row for row in status.json()["queues"]}


def _event_queues(url: str) -> list[str]:
    return sorted(name for name in _queues(url) if name.startswith("celeryev."))


def _bound_to_celeryev(url: str) -> list[str]:
    record, _ = read_exchange(open_store(url), "celeryev")
    return [] if record is None else sorted({b[2] for b in record.bindings})


@pytest.mark.timeout(240)
def test_event_queues_of_a_stopped_flower_and_a_killed_receiver_expire(
    celery_processes: tuple[str, Processes],
) -> None:
    url, processes = celery_processes
    # Given a worker that sends events (task events and a heartbeat every 2 s)
    worker = processes.start(
        "worker", "worker", "--pool", "threads", "--concurrency", "2",
        "--hostname", f"{WORKER}@%h", "--loglevel", "INFO",
        "--without-gossip", "--without-mingle",
    )  # fmt: skip
    pidbox = wait_for(
        lambda: [q for q in _queues(url) if q.endswith(".celery.pidbox")],
        60,
        "the worker's pidbox queue",
        progress=lambda: processes.log("worker"),
    )
    # And Flower and `celery events` receiving them
    port = _free_port()
    flower = processes.start(
        "flower", "flower", "--address=127.0.0.1", f"--port={port}", "--logging=info"
    )
    events = processes.start("events", "events", "--dump")
    wait_for(
        lambda: len(_event_queues(url)) == 2,
        60,
        "two celeryev queues (Flower's and celery events')",
        progress=lambda: (_queues(url), processes.log("flower"), processes.log("events")),
    )
    wait_for(
        lambda: _page(f"http://127.0.0.1:{port}/workers"),
        60,
        "Flower's workers page",
        progress=lambda: processes.log("flower"),
    )
    receivers = _event_queues(url)
    assert _bound_to_celeryev(url) == receivers

    # While they run, tasks go through and their event queues are consumed, not piling up
    send = [sys.executable, "-c", f"from {APP} import add; [add.delay(i, i) for i in range(20)]"]
    subprocess.run(send, cwd=ROOT, env=processes.env, check=True, timeout=60)
    wait_for(
        lambda: _queues(url)["celery"]["ready"] == 0 and _queues(url)["celery"]["in_flight"] == 0,
        60,
        "the tasks to run",
        progress=lambda: _queues(url),
    )
    time.sleep(3 * EVENT_QUEUE_EXPIRES)  # live receivers keep their queues past the expiry
    assert _event_queues(url) == receivers
    assert all(_queues(url)[q]["ready"] <= 20 for q in receivers), _queues(url)

    # When Flower is stopped (SIGTERM) and `celery events` is killed without shutdown
    # (their queues' expiry counts from their last use: a poll at most a polling interval
    # before the signal, not from when the processes were found gone)
    signalled = time.monotonic()
    flower.send_signal(signal.SIGTERM)
    flower.wait(timeout=30)
    os.killpg(events.pid, signal.SIGKILL)
    events.wait(timeout=30)

    # Then, once the expiry has passed, their queues and bindings are gone
    wait_for(
        lambda: not _event_queues(url) and not _bound_to_celeryev(url),
        30,
        "the celeryev queues and their bindings to go",
        progress=lambda: (_queues(url), _bound_to_celeryev(url)),
    )
    assert time.monotonic() - signalled >= EVENT_QUEUE_EXPIRES * 0.5

    # And the worker's events, still flowing, do not bring them back
    time.sleep(3 * 2.0 + EVENT_QUEUE_EXPIRES)  # three worker heartbeats
    assert _event_queues(url) == []
    # `objq status` lists the live processes' queues only: the task queue and the worker's
    # pidbox (Flower's reply queue for its inspect calls expires too).
    wait_for(
        lambda: sorted(_queues(url)) == sorted(["celery", *pidbox]),
        CONTROL_QUEUE_EXPIRES * 3,
        "only the live queues",
        progress=lambda: sorted(_queues(url)),
    )
    assert worker.poll() is None, processes.log("worker")


def _page(address: str) -> bool:
    try:
        with urllib.request.urlopen(address, timeout=5) as response:
            return bool(response.status == 200 and WORKER in response.read().decode())
    except OSError:
        return False
