"""With no broker, a queue on a local folder hears of other processes' commits from the kernel:
its claimers find their jobs at once instead of at their next poll of storage."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from objq_broker.queue import Queue

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="folder changes are reported on Linux only"
)

#: Polls so rare (and a cached state trusted so long) that only a report explains a quick find.
RARE: dict[str, Any] = {
    "poll_seconds": 30.0,
    "max_poll_seconds": 30.0,
    "max_staleness_seconds": 60.0,
}
ENQUEUE_AFTER = (
    "import sys, time\n"
    "from objq_broker.queue import Queue\n"
    "time.sleep(0.5)\n"
    "with Queue(sys.argv[1], broker='off') as q:\n"
    "    q.enqueue('jobs', b'from another process')\n"
)


def _enqueue_elsewhere(url: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", ENQUEUE_AFTER, url])


def test_a_waiting_claim_takes_a_job_another_process_enqueued_at_once(tmp_path: Path) -> None:
    url = tmp_path.as_uri()
    with Queue(url, broker="off", **RARE) as queue:
        queue.declare("jobs")
        assert queue.claim("jobs") == []  # the cache is fresh from here on
        writer = _enqueue_elsewhere(url)
        started = time.monotonic()
        try:
            found = queue.claim("jobs", timeout=40)
        finally:
            writer.wait(timeout=60)
        took = time.monotonic() - started
        assert [d.payload for d in found] == [b"from another process"]
        queue.ack(found[0])
        # Unreported, the claim would poll again only after 30 s, on a state cached for 60.
        assert took < 20, f"the claim waited {took:.1f} s: the commit was not reported"
        assert queue.claim("jobs") == []  # acked once, gone


def test_arrival_listeners_hear_of_another_process_commit(tmp_path: Path) -> None:
    """What an event loop (Celery's worker) claims on instead of its polling timer."""
    url = tmp_path.as_uri()
    with Queue(url, broker="off", **RARE) as queue:
        queue.declare("jobs")
        heard = threading.Event()
        stop = queue.on_arrivals(heard.set)
        writer = _enqueue_elsewhere(url)
        try:
            assert heard.wait(20), "no listener call for another process's enqueue"
        finally:
            writer.wait(timeout=60)
            stop()
        found = queue.claim("jobs")  # the listener's claim reads the state again
        assert [d.payload for d in found] == [b"from another process"]
        queue.ack(found[0])


def test_its_own_commits_do_not_make_it_claim_over_and_over(tmp_path: Path) -> None:
    """The kernel reports this process's writes too; each costs at most one more look, and a
    claim that finds nothing writes nothing, so nothing is reported back."""
    with Queue(tmp_path.as_uri(), broker="off", **RARE) as queue:
        queue.declare("jobs")
        queue.enqueue("jobs", b"x")
        [delivery] = queue.claim("jobs")
        queue.ack(delivery)
        time.sleep(0.3)  # the reports of those writes have come
        writes = queue.committer.metrics.state_writes
        assert queue.claim("jobs", timeout=1.0) == []
        time.sleep(0.3)
        assert queue.committer.metrics.state_writes == writes
