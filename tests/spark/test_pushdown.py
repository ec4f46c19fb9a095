"""Reading with and without filter pushdown: ``register`` turns it on in a session the user
built, and a session where it is off reads the same rows (Spark filters them itself)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

from objq_broker import Queue
from objq_broker.engine.archive import archive_key
from objq_broker.model.encoding import encode_archive
from objq_broker.model.records import ArchiveRecord, Job
from objq_broker.spark import register
from objq_broker.spark.source import PUSHDOWN_CONF
from objq_broker.storage import open_store

ROOT = Path(__file__).resolve().parents[2]
#: Seconds the child process may take to start its own Spark session and read.
CHILD_TIMEOUT_SECONDS = 240


def _queues_a_and_b(url: str) -> list[str]:
    """Jobs in queues a (three) and b (two); the ids of a's."""
    with Queue(url) as queue:
        ours = queue.enqueue_many("a", [b"a1", b"a2", b"a3"])
        queue.enqueue_many("b", [b"b1", b"b2"])
    return sorted(job.id for job in ours)


def _archive(url: str) -> list[float]:
    """Archive records of queues a and b, three jobs each, in each of four hours of a day."""
    hours = [datetime(2026, 3, 1, h, 30, tzinfo=UTC).timestamp() for h in range(4)]
    store = open_store(url)
    try:
        for h, at in enumerate(hours):
            for name in ("a", "b"):
                jobs = [
                    Job(
                        id=f"{name}-{h}-{n}",
                        queue=name,
                        body="x",
                        seq=n,
                        enqueued_at=at - 5,
                        visible_at=at,
                        max_attempts=1,
                        attempts=1,
                        started_at=at - 1,
                        finished_at=at + n,
                    )
                    for n in range(3)
                ]
                records = [ArchiveRecord("done", f"c{h}{name}", job) for job in jobs]
                store.put(archive_key(f"c{h}{name}", at + 10), encode_archive(records))
    finally:
        store.close()
    return hours


def _pushed(frame: Any) -> str:
    """The filters Spark pushed into the reader, as ``explain`` shows them ("" for none)."""
    plan = io.StringIO()
    with contextlib.redirect_stdout(plan):
        frame.explain("formatted")
    return "".join(line for line in plan.getvalue().splitlines() if "PushedFilters" in line)


@pytest.mark.slow  # starts a Spark session of its own, in a second process
def test_register_alone_makes_filtered_reads_work_in_a_session_the_user_built(
    tmp_path: Path,
) -> None:
    # Given jobs in two queues, and a process that builds its own plain Spark session
    url = (tmp_path / "store").as_uri()
    expected = _queues_a_and_b(url)
    env = dict(
        os.environ,
        PYSPARK_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    )
    # When it registers the source and reads one queue's jobs
    done = subprocess.run(
        [sys.executable, "-m", "tests.spark.plain_session_app", url],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_SECONDS,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    # Then register turned pushdown on, the filter was pushed, and the rows are a's
    assert (report["before"], report["after"]) == ("false", "true")
    assert any("EqualTo(queue,a)" in line for line in report["pushed"]), report["pushed"]
    assert sorted(report["ids"]) == expected


def test_a_session_with_pushdown_turned_off_reads_the_same_rows(spark: Any, tmp_path: Path) -> None:
    url = (tmp_path / "store").as_uri()
    ours = _queues_a_and_b(url)
    hours = _archive(url)
    start = datetime.fromtimestamp(hours[1], UTC)
    end = datetime.fromtimestamp(hours[2] + 1.5, UTC)  # within hour 2: jobs 0 and 1

    def jobs() -> Any:
        # A fresh relation per query: Spark keeps a pushed-down plan on the loaded relation.
        return spark.read.format("objq").option("url", url).option("table", "jobs").load()

    def archive() -> Any:
        frame = spark.read.format("objq").option("url", url).option("table", "archive").load()
        return frame.where(
            F.col("queue").isin("a")
            & (F.col("finished_at") >= start)
            & (F.col("finished_at") < end)
        )

    def read() -> tuple[list[str], list[str], str, str]:
        live, done = jobs().where("queue = 'a'"), archive()
        return (
            sorted(r.id for r in live.collect()),
            sorted(r.id for r in done.collect()),
            _pushed(live),
            _pushed(done),
        )

    # Given the session as a user builds it (pushdown off), then registered
    before = spark.conf.get(PUSHDOWN_CONF)
    spark.conf.unset(PUSHDOWN_CONF)
    try:
        assert spark.conf.get(PUSHDOWN_CONF) == "false"
        register(spark)
        assert spark.conf.get(PUSHDOWN_CONF) == "true"
        # When it reads with pushdown on, and again after a user turned it off
        live_on, done_on, pushed_live_on, pushed_done_on = read()
        spark.conf.set(PUSHDOWN_CONF, "false")
        live_off, done_off, pushed_live_off, pushed_done_off = read()
    finally:
        spark.conf.set(PUSHDOWN_CONF, before)  # the session is shared with the other tests
    # Then the filters were pushed the first time, applied by Spark the second, and the rows
    # are the same
    assert "EqualTo(queue,a)" in pushed_live_on
    assert "GreaterThanOrEqual(finished_at" in pushed_done_on
    assert "EqualTo" not in pushed_live_off and "finished_at" not in pushed_done_off
    assert live_on == ours
    assert done_on == ["a-1-0", "a-1-1", "a-1-2", "a-2-0", "a-2-1"]
    assert (live_off, done_off) == (live_on, done_on)
