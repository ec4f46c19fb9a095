"""The elected broker among real processes: who serves, what happens when it dies or pauses.

Every process is a candidate (``broker="auto"``, tests/broker/actor.py). The tests kill and
pause whichever process holds the broker record, and check the things that matter: another
takes over within the takeover time plus two seconds, no acknowledged enqueue is lost, every
job is done, and a paused broker that wakes writes nothing more.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from objq_broker.engine.archive import iter_archive
from objq_broker.engine.snapshot import Snapshot
from objq_broker.model.records import BrokerRecord
from objq_broker.storage import open_store
from tests.broker.actor import TAKEOVER_SECONDS
from tests.support.processes import Children
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def start(children: Children, role: str, url: str, folder: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "tests.broker.actor", role, url, str(folder)]
    return children.start(command, cwd=ROOT, log=folder / "actors.log")


def lines(folder: Path, word: str) -> list[str]:
    found: list[str] = []
    for path in folder.glob("*.*"):
        if path.suffix in (".producer", ".worker", ".standby"):
            found += [
                line.split(" ", 1)[1]
                for line in path.read_text().splitlines()
                if line.startswith(word + " ")
            ]
    return found


def record(url: str) -> BrokerRecord | None:
    return Snapshot.read(open_store(url)).broker


def holder(folder: Path, processes: list[subprocess.Popen[bytes]], url: str) -> int | None:
    """The pid of the process that says it leads under the record's epoch."""
    current = record(url)
    if current is None:
        return None
    for process in processes:
        path = next(folder.glob(f"{process.pid}.*"), None)
        if path is not None and f"role leader {current.epoch}" in path.read_text():
            return process.pid
    return None


def elect(
    children: Children, tmp_path: Path, roles: tuple[str, ...], url: str | None = None
) -> tuple[str, Path, list[subprocess.Popen[bytes]], int, BrokerRecord]:
    """Start one actor per role on a fresh store (``url``, else a directory) and wait for them
    to elect a broker; returns the store's URL, the actors' folder, the processes, the
    holder's pid and its record."""
    url = url or (tmp_path / "store").as_uri()
    folder = tmp_path / "actors"
    folder.mkdir()
    processes = [start(children, role, url, folder) for role in roles]
    leader = wait_for(lambda: holder(folder, processes, url), 30, "a broker to be elected")
    first = record(url)
    assert first is not None
    return url, folder, processes, leader, first


def stop_producers_and_drain(
    children: Children, url: str, folder: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    """Stop the producers, then wait until every enqueue they reported is done."""
    for process in processes:
        if next(folder.glob(f"{process.pid}.*")).suffix == ".producer":
            children.stop(process)
    enqueued = set(lines(folder, "enqueued"))
    wait_for(
        lambda: enqueued <= set(lines(folder, "done")) | archived(url),
        60,
        "every acknowledged enqueue to be done",
        progress=lambda: f"{len(enqueued - set(lines(folder, 'done')) - archived(url))} left",
    )


def archived(url: str) -> set[str]:
    """The payloads of the jobs acked so far, from the archive: a worker killed between its
    ack's commit and its ``done`` line did the job without saying so."""
    return {r.job.payload.decode() for r in iter_archive(open_store(url)) if r.outcome == "done"}


def test_a_killed_broker_is_replaced_and_nothing_acknowledged_is_lost(
    children: Children, tmp_path: Path
) -> None:
    url, folder, processes, leader, first = elect(
        children, tmp_path, ("producer", "worker", "standby")
    )
    wait_for(lambda: len(lines(folder, "done")) >= 20, 30, "jobs to be done through the broker")

    victim = next(p for p in processes if p.pid == leader)
    children.kill(victim)
    killed_at = time.monotonic()
    # Whoever is left needs a worker and a producer: replace the one that died.
    role = next(folder.glob(f"{leader}.*")).suffix.lstrip(".")
    processes = [p for p in processes if p is not victim] + [start(children, role, url, folder)]
    wait_for(
        lambda: (r := record(url)) is not None and r.epoch > first.epoch,
        30,
        "another process to take over",
    )
    took = time.monotonic() - killed_at
    assert took <= TAKEOVER_SECONDS + 2 + 3, f"takeover took {took:.1f} s"  # + start-up slack

    before = len(lines(folder, "enqueued"))
    wait_for(lambda: len(lines(folder, "enqueued")) > before + 20, 30, "producing to go on")
    stop_producers_and_drain(children, url, folder, processes)
    twice = [p for p, n in Counter(lines(folder, "done")).items() if n > 1]
    assert len(twice) <= 1, twice  # at most the job the killed process held


def test_a_paused_broker_is_fenced_and_steps_down_when_it_wakes(
    children: Children, tmp_path: Path, seaweedfs_url_factory: Callable[[], str]
) -> None:
    # On S3: a directory store's writer paused inside its lock (a flock held across its
    # check-and-rename) would stop every writer on the host until it wakes.
    url, folder, processes, leader, first = elect(
        children, tmp_path, ("producer", "producer", "worker"), seaweedfs_url_factory()
    )
    paused = next(p for p in processes if p.pid == leader)
    paused.send_signal(signal.SIGSTOP)
    try:
        wait_for(
            lambda: (r := record(url)) is not None and r.epoch > first.epoch,
            30,
            "another process to take over from the paused one",
        )
    finally:
        paused.send_signal(signal.SIGCONT)
    successor = record(url)
    assert successor is not None
    log = next(folder.glob(f"{leader}.*"))
    wait_for(
        lambda: "role follower" in log.read_text().split(f"role leader {first.epoch}")[-1],
        30,
        "the woken broker to step down and follow",
    )
    time.sleep(1.0)
    now = record(url)
    assert now is not None and (now.id, now.epoch) == (successor.id, successor.epoch)
    stop_producers_and_drain(children, url, folder, processes)
