"""A process that forks while its threads write a directory store (Celery's prefork pool
replacing a child) must not hand a held lock to the child: every writer of that key would
then wait for as long as the child lives."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from objq_broker.storage import open_store

FORKS = 40
#: How long a forked child may take to make its one conditional write.
CHILD_SECONDS = 10.0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() is POSIX only")
# Python 3.12+ warns on fork() in a threaded process: forking from one is what this is about.
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
@pytest.mark.timeout(120)
def test_children_forked_while_threads_write_never_inherit_a_held_lock(tmp_path: Path) -> None:
    store = open_store(tmp_path.as_uri())
    store.write("k", b"0", if_absent=True)
    stop = threading.Event()

    def hammer() -> None:  # the parent's own writers, busy on the key at every fork
        while not stop.is_set():
            store.write("k", b"parent")

    writers = [threading.Thread(target=hammer) for _ in range(2)]
    for writer in writers:
        writer.start()
    stuck: list[int] = []
    try:
        for _ in range(FORKS):
            pid = os.fork()
            if pid == 0:  # the child: one write of the key, then leave at once
                try:
                    open_store(tmp_path.as_uri()).write("k", b"child")
                finally:
                    os._exit(0)
            deadline = time.monotonic() + CHILD_SECONDS
            while time.monotonic() < deadline:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    assert os.waitstatus_to_exitcode(status) == 0
                    break
                time.sleep(0.01)
            else:
                stuck.append(pid)
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
    finally:
        stop.set()
        for writer in writers:
            writer.join()
    assert stuck == [], f"{len(stuck)} of {FORKS} children never finished their write"
