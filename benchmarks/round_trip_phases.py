"""Where a Celery round trip's time goes: ``delay().get()`` cut into phases, objq on ``file://``.

``celery_results.py`` measures the whole round trip against Redis; on a disk whose fsync time
drifts from minute to minute, two runs of it can differ by more than a change being judged.
This script marks the moments between the phases instead, in the client and in the worker,
and reports each phase's median, so a change to one phase shows whatever the disk does:

* ``send``: Celery's own work before the transport is handed the message;
* ``publish``: the transport's ``_put``, until the message is durable (the broker's commit);
* ``handoff``: from ``send_task`` returning to the task starting in the pool's child;
* ``store``: the child storing the result (one compare-and-set create, fsynced);
* ``result``: from the child starting to store the result to the client's wait returning with
  it (the wait may end before the store returns: a reader sees the object once it is renamed
  into place, before the folder's fsync);
* ``total``: send to value in hand.

The marks are ``time.time()`` lines appended to one file by both processes (the same clock),
made by wrapping objq's own functions when this module is imported: by this process, and by
the worker, which loads it as its app. A real ``celery worker`` (prefork, concurrency 1) serves
the task, with the elected broker unless ``--mode off``.

    python benchmarks/round_trip_phases.py                    # 300 round trips, elected
    python benchmarks/round_trip_phases.py --mode off --round-trips 100

To compare a change, run it once from each checkout (``PYTHONPATH=<checkout>``, which the
worker inherits), alternating.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from celery import Celery

import objq_broker
import objq_broker.kombu  # (registers the objq+... broker and backend URLs)
from objq_broker.kombu.channel import Channel
from objq_broker.results.store import ResultStore

HERE = Path(__file__).resolve().parent
MARKS_ENV = "BENCH_PHASE_MARKS"
QUEUE = "bench-phases"
#: (phase, from mark, to mark), in the order they happen.
PHASES = (
    ("send", "send", "put"),
    ("publish", "put", "put-done"),
    ("handoff", "sent", "task"),
    ("store", "store", "stored"),
    ("result", "store", "waited"),
    ("total", "send", "got"),
)


#: The round trip under way in this process: the client's loop sets it, and so does the task
#: in the worker's child (one task at a time), whose result store follows it.
current_round = [0]


def mark(name: str) -> None:
    marks = os.environ.get(MARKS_ENV)
    if marks:
        with open(marks, "a") as out:  # one short append: lines of two processes never mix
            out.write(f"{current_round[0]} {name} {time.time():.6f}\n")


def _marked(method: Callable[..., Any], before: str | None, after: str) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if before:
            mark(before)
        try:
            return method(*args, **kwargs)
        finally:
            mark(after)

    return wrapper


# Both processes: the worker imports this module as its app.
Channel._put = _marked(Channel._put, "put", "put-done")  # type: ignore[method-assign]
ResultStore.update = _marked(ResultStore.update, "store", "stored")  # type: ignore[method-assign]
ResultStore.wait = _marked(ResultStore.wait, None, "waited")  # type: ignore[method-assign]

app = Celery(
    "round_trip_phases",
    broker=os.environ.get("BENCH_BROKER_URL", "memory://"),
    backend=os.environ.get("BENCH_BACKEND_URL", ""),
)
app.conf.update(task_default_queue=QUEUE, worker_hijack_root_logger=False)


@app.task(name="bench.echo")
def echo(n: int) -> int:
    current_round[0] = n
    mark("task")
    return n


def run(args: argparse.Namespace, scratch: Path) -> dict[str, list[float]]:
    marks = scratch / "marks.log"
    env = {
        **os.environ,
        "BENCH_BROKER_URL": f"objq+{(scratch / 'queue').as_uri()}",
        "BENCH_BACKEND_URL": f"objq+{(scratch / 'results').as_uri()}",
        "OBJQ_BROKER": args.mode,
        "PYTHONPATH": os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p),
        MARKS_ENV: str(marks),
    }
    os.environ.update({k: env[k] for k in ("BENCH_BROKER_URL", "BENCH_BACKEND_URL", "OBJQ_BROKER")})
    app.conf.update(broker_url=env["BENCH_BROKER_URL"], result_backend=env["BENCH_BACKEND_URL"])
    command = [
        sys.executable, "-m", "celery", "-A", "round_trip_phases", "worker", "--pool", "prefork",
        "--concurrency", "1", "--queues", QUEUE, "--loglevel", "ERROR", "--without-gossip",
        "--without-mingle", "--without-heartbeat",
    ]  # fmt: skip
    # The worker's output (Celery's warning about running as root, say) is left out.
    quiet = subprocess.DEVNULL
    worker = subprocess.Popen(command, env=env, cwd=HERE, stdout=quiet, stderr=quiet)
    try:
        app.send_task("bench.echo", (0,)).get(timeout=120)  # the worker is up; not counted
        os.environ[MARKS_ENV] = str(marks)
        for n in range(1, args.round_trips + 1):
            current_round[0] = n
            mark("send")
            sent = app.send_task("bench.echo", (n,))
            mark("sent")
            if sent.get(timeout=60) != n:
                raise SystemExit(f"round trip {n} came back wrong")
            mark("got")
        time.sleep(0.5)  # the worker's last marks
        rounds: dict[int, dict[str, float]] = {}
        for line in marks.read_text().splitlines():
            number, name, at = line.split()
            rounds.setdefault(int(number), {}).setdefault(name, float(at))
    finally:
        os.environ.pop(MARKS_ENV, None)
        worker.terminate()
        worker.wait(timeout=60)
        # This process's queue (maybe the elected broker) closes before its folder goes.
        app.pool.force_close_all()
    return {
        phase: [
            (r[end] - r[begin]) * 1000
            for number, r in rounds.items()
            if number and begin in r and end in r
        ]
        for phase, begin, end in PHASES
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--round-trips", type=int, default=300)
    parser.add_argument("--mode", choices=("auto", "off"), default="auto")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="objq-bench-phases-"))
    try:
        phases = run(args, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    source = Path(objq_broker.__file__).resolve().parent.parent
    mode = "elected broker" if args.mode == "auto" else "direct commits"
    print(f"# {args.round_trips} round trips, {mode}, objq from {source}; "
          f"Python {platform.python_version()}")  # fmt: skip
    print("| phase | median (ms) | 90th percentile (ms) |")
    print("|---|---:|---:|")
    for phase, values in phases.items():
        ordered = sorted(values)
        p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
        print(f"| {phase} | {statistics.median(values):.2f} | {p90:.2f} |")


if __name__ == "__main__":
    main()
