"""Child-process side of test_multiprocess_race: read-increment-CAS loops on one counter.

A module of its own because the "spawn" start method pickles the target by module and name
(``tests.storage.race_worker``): children inherit the parent's ``sys.path``, which holds the
repository root.
"""

from __future__ import annotations

import os
import traceback
from dataclasses import dataclass, field
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier

from objq_broker.errors import PreconditionFailed
from objq_broker.storage import open_store

#: The key all processes increment.
COUNTER_KEY = "race/counter"
#: Seconds a child waits for its siblings to be ready before giving up.
START_TIMEOUT_SECONDS = 60.0


@dataclass
class Report:
    """What one child did: the counter values it wrote, its lost CAS rounds, or its error."""

    pid: int
    written: list[int] = field(default_factory=list)
    conflicts: int = 0
    error: str | None = None


def run_increments(url: str, increments: int, start: Barrier, reports: Queue[Report]) -> None:
    """Increment the counter ``increments`` times by CAS, retrying each lost race.

    Every child opens its store, then waits at ``start`` for all the others, so the loops
    overlap even though spawned children take a while to import their SDKs.
    """
    report = Report(pid=os.getpid())
    try:
        store = open_store(url)
        try:
            start.wait(START_TIMEOUT_SECONDS)  # BrokenBarrierError if a sibling never comes
            while len(report.written) < increments:
                blob = store.read(COUNTER_KEY)
                if blob is None:
                    raise LookupError(f"{url}: counter {COUNTER_KEY!r} vanished")
                value = int(blob.data) + 1
                try:
                    store.write(COUNTER_KEY, str(value).encode(), if_version=blob.version)
                except PreconditionFailed:
                    report.conflicts += 1  # another process won this round: read again
                    continue
                report.written.append(value)
        finally:
            store.close()
    except Exception:  # reported to the parent, which fails the test with it
        report.error = traceback.format_exc()
        start.abort()  # siblings still waiting at the barrier fail now, not after the timeout
    reports.put(report)
