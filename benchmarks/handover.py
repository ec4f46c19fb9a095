"""Handover: how long a follower's operations stall when the broker's process goes away.

A child process opens a queue on a fresh ``file://`` folder first, so it is elected the broker;
this process follows it and enqueues a job every 50 ms. Then the child either closes its queue
and exits (``close``: a short-lived producer that was elected) or is killed (``kill``: a broker
that died). Printed: the longest enqueue of the follower after that, and its role at the end.

    python benchmarks/handover.py               # both ways
    python benchmarks/handover.py --way close
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from provenance import objq_revision

import objq_broker
from objq_broker import Queue
from objq_broker.broker.elected import ElectedCommitter

LEADER = """
import os, signal, sys
from objq_broker import Queue
queue = Queue(sys.argv[1], broker="auto")
queue.declare("q")
print(queue.committer.role, flush=True)
sys.stdin.readline()
if sys.argv[2] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
queue.close()
"""


def role(queue: Queue) -> str:
    committer = queue.committer
    return committer.role if isinstance(committer, ElectedCommitter) else "direct"


def handover(way: str, after: int = 40) -> tuple[float, str]:
    """The follower's longest enqueue once the broker went ``way``, and its role then."""
    with tempfile.TemporaryDirectory(prefix="objq-bench-handover-") as folder:
        url = Path(folder).as_uri()
        leader = subprocess.Popen(
            [sys.executable, "-c", LEADER, url, way],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert leader.stdin is not None and leader.stdout is not None
        if leader.stdout.readline().strip() != "leader":
            raise RuntimeError("the child was not elected")
        with Queue(url, broker="auto") as follower:
            for _ in range(10):
                follower.enqueue("q", b"before")
                time.sleep(0.05)
            leader.stdin.write("go\n")
            leader.stdin.flush()
            leader.wait(30)
            longest = 0.0
            for _ in range(after):
                started = time.monotonic()
                follower.enqueue("q", b"after")
                longest = max(longest, time.monotonic() - started)
                time.sleep(0.05)
            return longest, role(follower)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--way", choices=("close", "kill", "both"), default="both")
    args = parser.parse_args()
    source = Path(objq_broker.__file__).resolve().parent.parent
    where = objq_revision(source) or f"objq from {source}"
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"`python benchmarks/handover.py`: {where}, Python {platform.python_version()}, {when}")
    for way in ("close", "kill") if args.way == "both" else (args.way,):
        longest, then = handover(way)
        print(f"broker {way:5}: the follower's longest enqueue after it {longest:.2f} s ({then})")


if __name__ == "__main__":
    main()
