"""Groups with ``group_concurrency=1`` across real worker processes: 200 groups of 50 jobs,
four workers failing some attempts on purpose (retried with backoff), one of them SIGKILLed
mid-run and replaced (its leases expire). Every group's jobs start in enqueue order, never
two of a group at once, and none is lost."""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

from objq_broker import Queue, builders
from tests.support.processes import Children
from tests.support.waiting import wait_for

WORKER = Path(__file__).with_name("order_worker.py")
QUEUE = "ordered"
GROUPS = 200
PER_GROUP = 50
WORKERS = 4
#: Short leases, so the killed worker's job comes back within the test.
LEASE_SECONDS = 2.0
TIMEOUT_SECONDS = 300.0


@dataclass(frozen=True)
class Event:
    kind: str  # start, done or fail
    group: str
    index: int
    job: str
    at: float
    worker: str
    #: Which attempt of its worker's (each works one job at a time): what ends which start.
    attempt: str


def _events(logs: dict[str, Path]) -> list[Event]:
    found = []
    for worker, log in logs.items():
        if not log.exists():
            continue
        starts = 0
        for line in log.read_text().splitlines():
            kind, group, index, job, at = line.split()
            starts += kind == "start"
            found.append(
                Event(kind, group, int(index), job, float(at), worker, f"{worker}#{starts}")
            )
    return sorted(found, key=lambda event: event.at)


@pytest.mark.slow
def test_a_groups_jobs_run_one_at_a_time_in_enqueue_order_across_a_killed_worker(
    tmp_path: Path, children: Children
) -> None:
    # Given 200 groups of 50 jobs, enqueued interleaved, on a queue that runs each group's
    # jobs one at a time
    url = (tmp_path / "store").as_uri()
    with Queue(url) as queue:
        queue.declare(
            QUEUE,
            group_concurrency=1,
            lease_seconds=LEASE_SECONDS,
            max_attempts=1000,
            backoff_base_seconds=0.05,
            backoff_cap_seconds=0.2,
        )
        groups = [f"g{g}" for g in range(GROUPS)]
        for index in range(PER_GROUP):
            op = builders.enqueue(QUEUE, [str(index).encode()] * GROUPS, groups=groups)
            queue.submit(op).result()
    stop = tmp_path / "stop"
    logs: dict[str, Path] = {}

    def start(name: str, seed: int) -> subprocess.Popen[bytes]:
        logs[name] = tmp_path / f"{name}.log"
        command = [sys.executable, str(WORKER), "--url", url, "--log", str(logs[name])]
        return children.start([*command, "--stop", str(stop), "--seed", str(seed)])

    workers = {f"w{n}": start(f"w{n}", n) for n in range(WORKERS)}
    total = GROUPS * PER_GROUP

    def done() -> int:
        return sum(event.kind == "done" for event in _events(logs))

    # When a quarter is done, one worker is killed mid-run and replaced
    wait_for(lambda: done() > total // 4 or None, TIMEOUT_SECONDS, "a quarter of the jobs done")
    children.kill(workers["w0"])
    workers["w0b"] = start("w0b", 99)
    with Queue(url) as queue:

        def drained() -> bool:
            stats = queue.stats(QUEUE)
            return stats.ready == stats.delayed == stats.in_flight == 0

        wait_for(drained, TIMEOUT_SECONDS, "the queue to drain", interval=0.5)
        stop.touch()
        for name, process in workers.items():
            if name != "w0":
                assert process.wait(timeout=60) == 0
        assert queue.stats(QUEUE).dead == 0
    events = _events(logs)

    # Then none is lost: every job of every group finished
    finished = {(e.group, e.index) for e in events if e.kind == "done"}
    assert finished == {(g, i) for g in groups for i in range(PER_GROUP)}
    by_group: dict[str, list[Event]] = defaultdict(list)
    for event in events:
        by_group[event.group].append(event)
    for group, seen in by_group.items():
        _check_one_at_a_time_in_order(group, seen, _abandoned(events))


def _abandoned(events: list[Event]) -> set[str]:
    """The attempts whose outcome did not land, so their job ran again: those whose settling
    found the lease lost, and the killed worker's last one if its job started again later (it
    died in it, or before its ack landed)."""
    found = {e.attempt for e in events if e.kind == "lost"}
    mine = [e for e in events if e.worker == "w0"]
    if mine:
        last = mine[-1]
        later = [e for e in events if e.at > last.at and e.kind == "start"]
        if any(e.job == last.job for e in later):
            found.add(last.attempt)
    return found


def _check_one_at_a_time_in_order(group: str, seen: list[Event], abandoned: set[str]) -> None:
    """Each attempt of ``group`` starts when no other attempt of the group is in flight,
    and starts the next job in enqueue order, or the same one again (a retry). An attempt
    whose outcome did not land (``abandoned``) stops counting once its job starts again."""
    open_attempts: dict[str, Event] = {}
    finished_upto = -1  # the last index done (and acked), in order
    for event in seen:
        key = event.attempt
        if event.kind == "start":
            for other, began in list(open_attempts.items()):
                assert other in abandoned and began.job == event.job, (
                    f"{group}: {event.job} (index {event.index}) started while "
                    f"{began.job} (index {began.index}) was in flight"
                )
                del open_attempts[other]
            assert event.index == finished_upto + 1, (
                f"{group}: index {event.index} started after index {finished_upto} finished"
            )
            open_attempts[key] = event
        elif event.kind in ("done", "fail"):
            open_attempts.pop(key, None)
            if event.kind == "done" and key not in abandoned:
                finished_upto = event.index
    assert finished_upto == PER_GROUP - 1, f"{group}: finished up to {finished_upto}"
