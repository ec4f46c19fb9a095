"""The helpers every other test leans on: waiting for a condition, and stopping child processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import Children, alive
from tests.support.waiting import TimedOut, wait_for

#: Ignores SIGTERM, says it is ready, then sleeps: only SIGKILL stops it.
STUBBORN_SCRIPT = """
import signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(60)
"""
#: Starts a grandchild, writes its pid to argv[1], then sleeps.
PARENT_SCRIPT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
open(sys.argv[1], "w").write(str(child.pid))
time.sleep(60)
"""


def test_wait_for_returns_the_first_truthy_value() -> None:
    calls = iter([None, [], ["found"]])
    assert wait_for(lambda: next(calls), 5, "a value", interval=0.01) == ["found"]


def test_wait_for_says_what_did_not_happen_and_how_far_it_got() -> None:
    with pytest.raises(TimedOut, match=r"after 0.1 s waiting for the answer; 3 of 4 seen$"):
        wait_for(lambda: False, 0.1, "the answer", progress=lambda: "3 of 4 seen")


def test_wait_for_stops_at_once_when_the_condition_raises() -> None:
    def gone() -> bool:
        raise RuntimeError("the worker exited")

    with pytest.raises(RuntimeError, match="the worker exited"):
        wait_for(gone, 60, "the worker")


def test_stop_all_kills_what_ignores_sigterm_and_reaps_everything(tmp_path: Path) -> None:
    # Given a child that ignores SIGTERM and one that leads a group with a grandchild in it
    pid_file = tmp_path / "grandchild.pid"
    with Children() as children:
        stubborn = children.adopt(
            subprocess.Popen([sys.executable, "-c", STUBBORN_SCRIPT], stdout=subprocess.PIPE)
        )
        leader = children.start(
            [sys.executable, "-c", PARENT_SCRIPT, str(pid_file)], quiet=True, group=True
        )
        assert stubborn.stdout is not None and stubborn.stdout.readline() == b"ready\n"
        wait_for(lambda: pid_file.exists() and pid_file.read_text(), 20, "the grandchild")
        grandchild = int(pid_file.read_text())

        # When they are all stopped
        stuck = children.stop_all(grace_seconds=0.5)

    # Then the stubborn one was killed (and said so), and the signal reached the whole group
    assert stuck == [stubborn]
    assert stubborn.returncode == -9 and leader.returncode == -15
    wait_for(lambda: not alive(grandchild), 5, "the grandchild to exit")


#: Four tests of one xdist group, each writing the test process it ran in.
GROUPED_TESTS = """
import os, pytest

@pytest.mark.xdist_group("together")
@pytest.mark.parametrize("n", range(4))
def test_grouped(n):
    with open(os.environ["WHERE_FILE"], "a") as where:
        where.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
"""


def test_the_test_command_keeps_an_xdist_group_in_one_process(tmp_path: Path) -> None:
    # The suite's command (pytest -n 2 --dist loadgroup) runs the Spark tests, and each
    # upstream suite's runs, in one process of their group; a pytest and pytest-xdist that
    # disagree on test ids scatter them silently.
    (tmp_path / "test_grouped.py").write_text(GROUPED_TESTS)
    where = tmp_path / "where.txt"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-n",
            "2",
            "--dist",
            "loadgroup",
            "-p",
            "no:cacheprovider",
        ],
        cwd=tmp_path,
        env={**os.environ, "WHERE_FILE": str(where)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    workers = where.read_text().split()
    assert len(workers) == 4 and len(set(workers)) == 1, workers
