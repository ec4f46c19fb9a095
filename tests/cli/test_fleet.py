"""``objq workers``, ``objq budget`` and ``objq cost`` on real stores and real workers."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from objq_broker import Queue
from tests.cli.objq_cli import Objq, Workers
from tests.support.processes import kill, kill_group
from tests.support.waiting import wait_for_pid

SLEEPER = (
    "import os, pathlib, sys, time; pathlib.Path(sys.argv[1]).write_text(str(os.getpid())); "
    "time.sleep(60)"
)


def test_workers_shows_a_real_worker_then_shows_it_gone(
    objq: Objq, file_url: str, tmp_path: Path, workers: Callable[[str], Workers]
) -> None:
    # Given an objq worker running a long command job, with a 1 s lease
    assert objq("declare", "work", "--lease", "1s", url=file_url).code == 0
    marker = tmp_path / "started"
    command = ["--", sys.executable, "-c", SLEEPER, str(marker)]
    assert objq("enqueue-cmd", "work", *command, url=file_url).code == 0
    worker = workers(file_url).start("--queue", "work")
    command_pid = wait_for_pid(marker, 30, "the command to start")
    # Then objq workers names it by host, process and framework, with what it holds
    [row] = objq("workers", "--json", url=file_url).json()
    assert (row["status"], row["pid"], row["framework"]) == ("working", worker.pid, "objq-worker")
    assert row["owner"].endswith(f":{worker.pid}:objq-worker")
    assert (row["queues"], row["jobs_held"]) == (["work"], 1)
    assert row["last_seen_at"] >= row["oldest_claimed_at"]
    text = objq("workers", url=file_url).stdout
    assert "objq-worker" in text and "working" in text
    # When the worker dies without a word and its lease runs out
    kill(worker)
    kill_group(command_pid)  # its command, orphaned
    time.sleep(1.5)
    assert objq("requeue-stale", url=file_url).code == 0
    # Then it is shown as gone
    [gone] = objq("workers", "--json", url=file_url).json()
    assert (gone["owner"], gone["status"], gone["jobs_held"]) == (row["owner"], "gone", 0)


def test_budget_is_shown_set_refused_and_lifted(objq: Objq, file_url: str) -> None:
    assert objq("declare", "q", url=file_url).code == 0
    assert "no write budget" in objq("budget", url=file_url).stdout
    assert "at most 2 state writes" in objq("budget", "2", url=file_url).stdout
    assert objq("budget", "--json", url=file_url).json() == {"writes_per_second": 2.0}
    assert "write budget: at most 2 state writes per second" in objq("status", url=file_url).stdout
    with Queue(file_url, broker="off") as queue:
        assert queue.write_budget() == 2.0  # every process sees the one setting
    for bad in ("nan", "0", "inf", "fast", "5000"):
        refused = objq("budget", bad, url=file_url)
        assert refused.code == 2 and "WRITES_PER_SECOND" in refused.stderr, bad
    # A word that starts with "-" is an option unless it follows "--"
    assert objq("budget", "-1", url=file_url).code == 2
    negative = objq("budget", "--", "-1", url=file_url)
    assert negative.code == 2 and "WRITES_PER_SECOND" in negative.stderr
    assert objq("budget", "--json", url=file_url).json() == {"writes_per_second": 2.0}
    assert objq("budget", "off", "--json", url=file_url).json() == {"writes_per_second": None}


def test_cost_measures_the_write_rate_and_prices_it(objq: Objq, file_url: str) -> None:
    stop = threading.Event()
    with Queue(file_url, broker="off") as queue:
        queue.declare("q")

        def produce() -> None:
            while not stop.is_set():
                queue.enqueue("q", b"x")
                time.sleep(0.05)

        producer = threading.Thread(target=produce)
        producer.start()
        try:
            report = objq("cost", "--over", "2s", "--json", url=file_url).json()
        finally:
            stop.set()
            producer.join()
    rate = report["state_writes_per_second"]
    assert 3 < rate < 25, rate  # one commit per enqueue, about 20 a second at most
    s3 = report["estimates"]["S3 Standard"]
    assert abs(s3["puts_per_day"] - rate * 86_400) < 1
    assert abs(s3["dollars_per_day"] - rate * 86_400 / 1000 * 0.005) < 1e-6
    given = objq(
        "cost", "--over", "1s", "--price-per-1000-puts", "0.01", "--json", url=file_url
    ).json()
    assert list(given["estimates"]) == ["given prices"]
    assert objq("cost", "--price-per-1000-puts", "nan", url=file_url).code == 2
