"""``objq worker`` running command jobs as real processes: success, retries with the queue's
backoff into the dead letters, timeouts that kill the process group, a worker killed mid-command
whose job runs again elsewhere, and draining on SIGTERM."""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cli.objq_cli import Objq, Workers
from tests.support.processes import alive, kill, kill_group
from tests.support.waiting import wait_for, wait_for_pid

#: Seconds a command job may take to start once its worker runs.
START_TIMEOUT_SECONDS = 20.0

#: A command job's script: note the start time, say something on stderr, exit with argv[2].
RECORDING_SCRIPT = """
import sys, time
with open(sys.argv[1], "a") as log:
    log.write(f"{time.time()}\\n")
print("boom on stderr", file=sys.stderr)
sys.exit(int(sys.argv[2]))
"""
#: Starts a grandchild, writes its pid, then hangs: only a process-group kill stops both.
HANGING_SCRIPT = """
import subprocess, sys, time
child = subprocess.Popen(["sleep", "60"])
open(sys.argv[1], "w").write(str(child.pid))
time.sleep(60)
"""
#: The first run (no marker yet) writes the marker with its pid and hangs; later runs succeed.
ONCE_HANGING_SCRIPT = """
import os, pathlib, sys, time
marker = pathlib.Path(sys.argv[1])
with open(sys.argv[1] + ".runs", "a") as runs:
    runs.write(f"{os.getpid()}\\n")
if not marker.exists():
    marker.write_text(str(os.getpid()))
    time.sleep(60)
"""
#: Marks its start, works a little, marks its end.
SLOW_SCRIPT = """
import pathlib, sys, time
pathlib.Path(sys.argv[1] + ".started").touch()
time.sleep(1.0)
pathlib.Path(sys.argv[1] + ".done").touch()
"""


def test_success_and_retries_into_dead_letters_with_backoff(
    objq: Objq, cli_url: str, tmp_path: Path
) -> None:
    # Given a queue with 3 attempts and a 1 s backoff base, one good job and one failing job
    runs = tmp_path / "runs.log"
    declared = objq(
        "declare", "cmds", "--max-attempts", "3", "--backoff-base", "1s", "--json", url=cli_url
    )
    assert declared.code == 0, declared.stderr
    py = sys.executable
    good = objq(
        "enqueue-cmd",
        "cmds",
        "--json",
        "--",
        py,
        "-c",
        RECORDING_SCRIPT,
        str(tmp_path / "good.log"),
        "0",
        url=cli_url,
    )
    bad = objq(
        "enqueue-cmd",
        "cmds",
        "--json",
        "--",
        py,
        "-c",
        RECORDING_SCRIPT,
        str(runs),
        "7",
        url=cli_url,
    )
    assert good.code == 0 and bad.code == 0, good.stderr + bad.stderr
    [good_id], [bad_id] = good.json()["ids"], bad.json()["ids"]

    # When a worker runs until the queue is empty
    ran = objq("worker", "--queue", "cmds", "--burst", "--json", url=cli_url)

    # Then the good job is done, and the bad one ran 3 times, backing off, into the dead letters
    assert ran.code == 0, ran.stderr
    events = ran.json_lines()
    finished = [(e["id"], e["outcome"]) for e in events if e["event"] == "finished"]
    assert (good_id, "done") in finished
    assert [o for i, o in finished if i == bad_id] == ["retry", "retry", "dead"]
    assert events[-1]["event"] == "stopped" and events[-1]["dead"] == 1

    [dead] = objq("dead", "list", "cmds", "--json", url=cli_url).json()
    assert dead["id"] == bad_id and dead["attempts"] == 3
    assert dead["error"] == "exit code 7: boom on stderr"

    starts = [float(line) for line in runs.read_text().split()]
    assert len(starts) == 3
    first_gap, second_gap = starts[1] - starts[0], starts[2] - starts[1]
    # Equal-jitter backoff: after attempt n the wait is base * 2**(n-1) times 0.5 to 1.0;
    # above that, a claim poll (0.5 s) and process start-up.
    assert 0.5 <= first_gap <= 1.0 + 1.5, first_gap
    assert 1.0 <= second_gap <= 2.0 + 1.5, second_gap


def test_timeout_kills_the_whole_process_group(objq: Objq, file_url: str, tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    assert objq("declare", "slow", "--max-attempts", "1", url=file_url).code == 0
    enqueued = objq(
        "enqueue-cmd",
        "slow",
        "--timeout",
        "1",
        "--",
        sys.executable,
        "-c",
        HANGING_SCRIPT,
        str(pid_file),
        url=file_url,
    )
    assert enqueued.code == 0, enqueued.stderr

    ran = objq("worker", "--queue", "slow", "--burst", "--json", url=file_url)

    assert ran.code == 0, ran.stderr
    [finished] = [e for e in ran.json_lines() if e["event"] == "finished"]
    assert finished["outcome"] == "dead"
    assert 1.0 <= finished["seconds"] < 4.0
    assert finished["error"].startswith("timed out after 1 s; its process group was killed")
    grandchild = int(pid_file.read_text())
    try:
        wait_for(lambda: not alive(grandchild), 5, "the command's own child to be killed")
    finally:
        kill_group(grandchild)


@pytest.mark.slow
def test_job_of_a_killed_worker_runs_again_elsewhere(
    objq: Objq, file_url: str, tmp_path: Path, workers: Callable[[str], Workers]
) -> None:
    # Given a queue with a 2 s lease and a job whose first run hangs
    marker = tmp_path / "marker"
    assert objq("declare", "work", url=file_url).code == 0
    assert objq("config", "set", "work", "lease", "2", url=file_url).code == 0
    job = objq(
        "enqueue-cmd",
        "work",
        "--json",
        "--",
        sys.executable,
        "-c",
        ONCE_HANGING_SCRIPT,
        str(marker),
        url=file_url,
    )
    [job_id] = job.json()["ids"]
    group = workers(file_url)
    first = group.start("--queue", "work")
    orphan = wait_for_pid(marker, START_TIMEOUT_SECONDS, "the first run to start")
    try:
        # When the worker is killed mid-command
        kill(first)
        # Then another worker runs the job again once the lease has expired, and finishes it
        second = group.start("--queue", "work", "--burst")
        out, err = second.communicate(timeout=30)
    finally:
        kill_group(orphan)  # a killed worker's command is orphaned, as the docs say
    assert second.returncode == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    [finished] = [e for e in events if e["event"] == "finished"]
    assert (finished["id"], finished["attempt"], finished["outcome"]) == (job_id, 2, "done")
    assert len((tmp_path / "marker.runs").read_text().split()) == 2
    [record] = objq("archive", "cat", "--queue", "work", url=file_url).json_lines()
    assert record["state"] == "done" and record["attempts"] == 2


@pytest.mark.slow
def test_sigterm_finishes_running_jobs_and_gives_back_prefetched_ones(
    objq: Objq, file_url: str, tmp_path: Path, workers: Callable[[str], Workers]
) -> None:
    # Given three slow jobs and a worker running one at a time with two prefetched
    assert objq("declare", "drain", url=file_url).code == 0
    for name in ("a", "b", "c"):
        enqueued = objq(
            "enqueue-cmd",
            "drain",
            "--",
            sys.executable,
            "-c",
            SLOW_SCRIPT,
            str(tmp_path / name),
            url=file_url,
        )
        assert enqueued.code == 0
    worker = workers(file_url).start("--queue", "drain", "--count", "1", "--prefetch", "2")
    wait_for(
        lambda: any((tmp_path / f"{n}.started").exists() for n in "abc"),
        START_TIMEOUT_SECONDS,
        "a job to start",
    )

    # When it gets SIGTERM while a command runs
    worker.send_signal(signal.SIGTERM)
    out, err = worker.communicate(timeout=20)

    # Then it exits 0 after finishing that command, and the other two are ready again
    assert worker.returncode == 0, err
    assert sorted(p.name for p in tmp_path.glob("*.done")) == [
        p.name.replace(".started", ".done") for p in tmp_path.glob("*.started")
    ]
    events = [json.loads(line) for line in out.splitlines()]
    assert [e["outcome"] for e in events if e["event"] == "finished"] == ["done"]
    [released] = [e for e in events if e["event"] == "released"]
    assert len(released["ids"]) == 2
    assert events[-1] == {**events[-1], "event": "stopped", "done": 1, "released": 2}
    [status] = objq("status", "--json", url=file_url).json()["queues"]
    assert (status["ready"], status["in_flight"]) == (2, 0)
    for job_id in released["ids"]:
        job = objq("jobs", "show", job_id, "--json", url=file_url).json()
        assert (job["state"], job["attempts"]) == ("ready", 0)


def test_shell_env_cwd_and_payloads_that_are_not_commands(
    objq: Objq, file_url: str, tmp_path: Path
) -> None:
    assert objq("declare", "misc", url=file_url).code == 0
    shell = objq(
        "enqueue-cmd",
        "misc",
        "--shell",
        "--env",
        "GREETING=hello",
        "--cwd",
        str(tmp_path),
        "--",
        "echo",
        "$GREETING",
        "|",
        "tr",
        "a-z",
        "A-Z",
        ">",
        "out.txt",
        url=file_url,
    )
    assert shell.code == 0, shell.stderr
    plain = objq("enqueue", "misc", "rm -rf /", "--json", url=file_url)
    [plain_id] = plain.json()["ids"]

    ran = objq("worker", "--queue", "misc", "--burst", "--json", url=file_url)

    assert ran.code == 0, ran.stderr
    assert (tmp_path / "out.txt").read_text() == "HELLO\n"
    [dead] = objq("dead", "list", "misc", "--json", url=file_url).json()
    assert dead["id"] == plain_id and dead["attempts"] == 1  # never retried
    assert dead["error"].startswith("command job: expected a JSON object")


@pytest.mark.slow
def test_heartbeats_keep_a_long_command_from_running_twice(
    objq: Objq, file_url: str, tmp_path: Path, workers: Callable[[str], Workers]
) -> None:
    # Given a 1 s lease and a command that runs 2.5 s
    runs = tmp_path / "runs.log"
    script = (
        "import os, sys, time\nopen(sys.argv[1], 'a').write(f'{os.getpid()}\\n')\ntime.sleep(2.5)\n"
    )
    assert objq("declare", "long", "--lease", "1", url=file_url).code == 0
    enqueued = objq(
        "enqueue-cmd", "long", "--", sys.executable, "-c", script, str(runs), url=file_url
    )
    assert enqueued.code == 0, enqueued.stderr
    group = workers(file_url)
    first = group.start("--queue", "long")
    wait_for(runs.exists, START_TIMEOUT_SECONDS, "the command to start")

    # When a second worker polls the queue while the command runs past its lease
    second = group.start("--queue", "long", "--burst")
    second_out, second_err = second.communicate(timeout=30)
    first.send_signal(signal.SIGTERM)
    first_out, first_err = first.communicate(timeout=30)

    # Then the command ran once, on the first worker, and was acked there
    assert second.returncode == 0 and first.returncode == 0, second_err + first_err
    assert len(runs.read_text().split()) == 1
    assert not [e for e in map(json.loads, second_out.splitlines()) if e["event"] == "finished"]
    [finished] = [e for e in map(json.loads, first_out.splitlines()) if e["event"] == "finished"]
    assert (finished["outcome"], finished["attempt"]) == ("done", 1)
