"""A process that forks after joining the broker: each child gets a link, an id and a role of
its own, calls the broker right after the fork without aborting or hanging, never serves, and
loses nothing. Real processes (``os.fork``) on one file store; the parent is the broker and
keeps committing from several threads while it forks, so its locks are taken at fork time."""

from __future__ import annotations

import os
import signal
import threading
import time
import traceback
from pathlib import Path

import pytest

from objq_broker import Queue
from objq_broker.broker.elected import ElectedCommitter

FORKS = 300
CHILD_JOBS = 5


def elected(queue: Queue) -> ElectedCommitter:
    committer = queue.committer
    assert isinstance(committer, ElectedCommitter)
    return committer


def child(queue: Queue, parent_id: str, report: int) -> int:
    """In the child: enqueue at once through the inherited queue, then say who it was."""
    committer = elected(queue)
    if committer.client_id == parent_id:
        return 3
    for n in range(CHILD_JOBS):
        queue.enqueue("q", f"{os.getpid()}-{n}".encode())
    if not committer.role.startswith("follower"):
        return 4
    os.write(report, f"{committer.client_id}\n".encode())
    queue.close()
    return 0


@pytest.mark.slow
def test_children_forked_from_a_busy_broker_each_join_as_a_client(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/ns"
    queue = Queue(url, broker="auto")
    queue.declare("q")
    parent_id = elected(queue).client_id
    assert elected(queue).role == "leader"
    stop = threading.Event()
    sent = [0, 0, 0]

    def busy(slot: int) -> None:
        while not stop.is_set():
            queue.enqueue("q", b"parent")
            sent[slot] += 1

    threads = [threading.Thread(target=busy, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    read, write = os.pipe()
    statuses: list[int] = []
    try:
        for _ in range(FORKS):
            pid = os.fork()
            if pid == 0:  # the child: never return into pytest
                code = 1
                try:
                    signal.alarm(30)  # a hang is a failure, not a stuck test run
                    code = child(queue, parent_id, write)
                except BaseException:
                    traceback.print_exc()  # pytest shows the child's stderr on failure
                finally:
                    os._exit(code)
            _, status = os.waitpid(pid, 0)
            statuses.append(status)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    os.close(write)
    with os.fdopen(read) as reported:
        ids = reported.read().split()

    # Then every child exited cleanly: no abort, no hang, no wrong role or reused id
    assert [os.waitstatus_to_exitcode(s) for s in statuses] == [0] * FORKS
    assert len(set(ids)) == FORKS and parent_id not in ids
    # and the parent is still the broker, and nothing was lost or doubled
    assert elected(queue).role == "leader"
    started = time.monotonic()
    while time.monotonic() - started < 10:
        total = queue.stats("q").ready
        if total == sum(sent) + FORKS * CHILD_JOBS:
            break
        time.sleep(0.1)
    assert queue.stats("q").ready == sum(sent) + FORKS * CHILD_JOBS
    queue.close()
