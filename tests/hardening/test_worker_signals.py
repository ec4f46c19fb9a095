"""``objq worker`` always stops on SIGTERM and SIGINT, and loses no job doing so.

A running command gets the stop grace, then is killed and its job given back; a second signal
cuts the grace short; storage that accepts connections and never answers cannot hold the
worker past its deadlines. Every test runs a real ``objq worker`` process, and the storage
that hangs is a proxy in front of a real S3 server (moto) that holds requests unanswered.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cli.objq_cli import environment, objq_command
from tests.cli.objq_cli import run_objq as objq
from tests.support.fault_proxy import FaultProxy, Faults
from tests.support.processes import Children, alive, kill_group
from tests.support.servers import create_s3_bucket, new_bucket_name
from tests.support.waiting import wait_for, wait_for_pid

pytestmark = pytest.mark.slow

#: Seconds a command job may take to start once its worker runs.
START_TIMEOUT_SECONDS = 20.0
#: Seconds within which a stopped worker must have exited: its stop grace (1 s in these
#: tests), the kill of its command (at most 3 s), then at most 10 s to settle, and slack.
STOP_BOUND_SECONDS = 30.0
#: The same after a second signal (the worker then has 5 s), well under the default grace.
FORCED_STOP_BOUND_SECONDS = 15.0
#: The first run writes its pid to the marker and hangs; later runs find the marker and succeed.
ONCE_HANGING_SCRIPT = """
import os, pathlib, sys, time
marker = pathlib.Path(sys.argv[1])
if not marker.exists():
    marker.write_text(str(os.getpid()))
    time.sleep(120)
"""


@pytest.fixture
def hanging_proxy(moto_endpoint: str) -> Iterator[FaultProxy]:
    """A proxy in front of moto: forwards until told to hold every request unanswered."""
    with FaultProxy(moto_endpoint) as proxy:
        yield proxy


def _enqueue_hanging_job(url: str, marker: Path) -> str:
    command = [sys.executable, "-c", ONCE_HANGING_SCRIPT, str(marker)]
    enqueued = objq("enqueue-cmd", "work", "--json", "--", *command, url=url)
    assert enqueued.code == 0, enqueued.stderr
    ids: list[str] = enqueued.json()["ids"]
    return ids[0]


def _start_worker(children: Children, url: str, *args: str) -> subprocess.Popen[str]:
    return children.adopt(
        subprocess.Popen(
            [*objq_command(), "worker", "--queue", "work", "--json", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=environment(url),
            # Ctrl-C as a terminal's user has it (a shell starts background jobs with it
            # ignored, and a child inherits that).
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # noqa: PLW1509
        )
    )


def _events(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def _runs_to_done(url: str, job_id: str) -> None:
    """Another worker takes the job (once its lease is free) and finishes it: it was not lost."""
    again = objq("worker", "--queue", "work", "--burst", "--json", url=url)
    assert again.code == 0, again.stderr
    finished = [e for e in again.json_lines() if e["event"] == "finished"]
    assert [(e["id"], e["outcome"]) for e in finished] == [(job_id, "done")]


def test_sigterm_kills_a_command_past_the_grace_and_gives_its_job_back(
    file_url: str, tmp_path: Path, children: Children
) -> None:
    # Given a worker with a 1 s stop grace running a command that would run for minutes
    marker = tmp_path / "marker"
    assert objq("declare", "work", url=file_url).code == 0
    job_id = _enqueue_hanging_job(file_url, marker)
    worker = _start_worker(children, file_url, "--stop-grace", "1")
    command_pid = wait_for_pid(marker, START_TIMEOUT_SECONDS, "the command to start")

    # When it gets SIGTERM
    worker.send_signal(signal.SIGTERM)
    out, err = worker.communicate(timeout=STOP_BOUND_SECONDS)

    # Then it exits 0 after the grace, having killed the command and given the job back
    try:
        assert worker.returncode == 0, err
        assert not alive(command_pid)
    finally:
        kill_group(command_pid)
    events = _events(out)
    [finished] = [e for e in events if e["event"] == "finished"]
    assert (finished["id"], finished["outcome"]) == (job_id, "released")
    assert events[-1]["event"] == "stopped" and events[-1]["released"] == 1
    job = objq("jobs", "show", job_id, "--json", url=file_url).json()
    assert (job["state"], job["attempts"]) == ("ready", 0)
    _runs_to_done(file_url, job_id)


def test_a_second_signal_cuts_the_grace_short(
    file_url: str, tmp_path: Path, children: Children
) -> None:
    # Given a worker with the default grace (25 s) running a command that would run for minutes
    marker = tmp_path / "marker"
    assert objq("declare", "work", url=file_url).code == 0
    job_id = _enqueue_hanging_job(file_url, marker)
    worker = _start_worker(children, file_url)
    command_pid = wait_for_pid(marker, START_TIMEOUT_SECONDS, "the command to start")

    # When it gets SIGTERM, then Ctrl-C
    worker.send_signal(signal.SIGTERM)
    worker.send_signal(signal.SIGINT)
    out, err = worker.communicate(timeout=FORCED_STOP_BOUND_SECONDS)

    # Then it exits long before the grace is over, and the job is back in its queue
    try:
        assert worker.returncode == 0, err
        assert not alive(command_pid)
    finally:
        kill_group(command_pid)
    [finished] = [e for e in _events(out) if e["event"] == "finished"]
    assert (finished["id"], finished["outcome"]) == (job_id, "released")
    _runs_to_done(file_url, job_id)


def test_sigterm_while_the_store_never_answers(
    hanging_proxy: FaultProxy, children: Children
) -> None:
    # Given a worker whose store accepts connections and never answers (with a read timeout
    # of 5 minutes, so no timeout of the SDK ends the wait)
    hanging_proxy.set_faults(Faults(blackhole=1.0))
    url = f"s3://{new_bucket_name()}/objq?endpoint_url={hanging_proxy.url}&read_timeout=300"
    worker = _start_worker(children, url)
    wait_for(lambda: hanging_proxy.held > 0, START_TIMEOUT_SECONDS, "a request to hang")

    # When it gets SIGTERM
    worker.send_signal(signal.SIGTERM)
    _, err = worker.communicate(timeout=STOP_BOUND_SECONDS)

    # Then it exits anyway, saying it could not finish cleanly
    assert worker.returncode == 1, err
    assert "exiting now" in err


def test_sigterm_while_storage_hangs_mid_command_loses_no_job(
    hanging_proxy: FaultProxy, moto_endpoint: str, tmp_path: Path, children: Children
) -> None:
    # Given a queue with a 3 s lease on S3, and a worker that reaches it through the proxy
    bucket = new_bucket_name()
    create_s3_bucket(moto_endpoint, bucket)
    direct = f"s3://{bucket}/objq?endpoint_url={moto_endpoint}"
    proxied = f"s3://{bucket}/objq?endpoint_url={hanging_proxy.url}&read_timeout=300"
    marker = tmp_path / "marker"
    assert objq("declare", "work", "--lease", "3", url=direct).code == 0
    job_id = _enqueue_hanging_job(direct, marker)
    worker = _start_worker(children, proxied, "--stop-grace", "1")
    command_pid = wait_for_pid(marker, START_TIMEOUT_SECONDS, "the command to start")

    # When the storage stops answering while the command runs, and the worker gets SIGTERM
    hanging_proxy.set_faults(Faults(blackhole=1.0))
    wait_for(lambda: hanging_proxy.held > 0, START_TIMEOUT_SECONDS, "a request to hang")
    worker.send_signal(signal.SIGTERM)
    _, err = worker.communicate(timeout=STOP_BOUND_SECONDS)

    # Then it exits without its command, though it could not give the job back
    try:
        assert worker.returncode == 1, err
        assert "exiting now" in err
        assert not alive(command_pid)
    finally:
        kill_group(command_pid)
    # And the job is not lost: once its lease has expired, another worker runs it to the end
    _runs_to_done(direct, job_id)
