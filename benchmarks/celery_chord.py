"""A Celery chord whose callback is a group of failing tasks: objq against Redis (the anchor).

Celery's own suite has such a chord (``test_mutable_errback_called_by_chord_from_group_fail_
multiple_on_body_failure``): its header is one task, its callback a group of tasks that all
raise, each with an errback. What it waits for is how soon the callback's tasks start and how
fast a worker gets through them, one after the other. Each row runs a real ``celery worker``
(prefork, concurrency 1) and sends the chord ``--chords`` times from this process:

* ``objq + objq``: broker and results ``objq+file://`` (two folders of one temporary
  directory), with the elected broker (the default);
* ``Redis + Redis``: a local redis-server of this run's, no persistence.

Per chord: when the callback's first task finished and when its last did (from the tasks'
``date_done``, seconds after the send), and the time per callback task between them. The CPU
the worker's processes and this one spent, per callback task. Run it on an idle machine, and
with ``--busy N`` processes spinning beside it (what a loaded CI machine looks like).

    python benchmarks/celery_chord.py                      # 3 chords of 200 failing tasks
    python benchmarks/celery_chord.py --tasks 42 --busy 6  # the suite's chord, on busy cores
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC
from importlib.metadata import version
from pathlib import Path

from celery import Celery, chord, group
from celery_worker import BACKEND_ENV, BROKER_ENV, start_worker, stop_worker
from provenance import objq_revision

import objq_broker.kombu  # (registers the objq+... broker and backend URLs)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(1, str(ROOT))
from tests.support.servers import start_redis  # noqa: E402

QUEUE = "bench-chord"
WORKER_START_SECONDS = 120.0
CHORD_TIMEOUT_SECONDS = 300.0
TICK = os.sysconf("SC_CLK_TCK")


class ExpectedFailure(Exception):
    """What the callback's tasks raise."""


def identity(x: int) -> int:
    return x


def fail(*args: object) -> None:
    raise ExpectedFailure("failing by design", *args)


def errback(request: object, exc: object, traceback: object) -> None:
    """A new-style errback: Celery calls it in the worker as each task fails."""


def make_app(broker_url: str, backend_url: str) -> Celery:
    made = Celery("celery_chord", broker=broker_url, backend=backend_url)
    made.conf.update(
        task_default_queue=QUEUE,
        result_extended=True,  # date_done of each task
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
    )
    made.task(name="bench.identity")(identity)
    made.task(name="bench.fail")(fail)
    made.task(name="bench.errback")(errback)
    return made


# The worker subprocess loads this module (celery -A celery_chord) with the row's URLs.
app = make_app(os.environ.get(BROKER_ENV, "memory://"), os.environ.get(BACKEND_ENV, ""))


@dataclass
class Chord:
    first: float  # seconds from the send to the callback's first task done
    last: float  # ... to its last
    cpu_per_task: float  # seconds of CPU, the worker's processes and this one, per task


def cpu_seconds(pids: list[int]) -> float:
    """CPU time (user + system) of ``pids`` and of the children they waited for."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(f) for f in fields[11:13]) / TICK
    return total


def family(root: int) -> list[int]:
    """``root`` and its descendants (a worker and its pool)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def run_chord(made: Celery, tasks: int, worker_pid: int, server_pid: int | None) -> Chord:
    body = group(made.signature("bench.fail") for _ in range(tasks))
    sig = chord([made.signature("bench.identity", (1,))], body)
    sig.link_error(made.signature("bench.errback"))
    pids = [*family(worker_pid), os.getpid(), *([server_pid] if server_pid else [])]
    cpu_before = cpu_seconds(pids)
    sent_at = time.time()
    result = sig.delay()
    result.join(timeout=CHORD_TIMEOUT_SECONDS, propagate=False)
    pids = [*family(worker_pid), os.getpid(), *([server_pid] if server_pid else [])]
    cpu = cpu_seconds(pids) - cpu_before
    done = sorted(
        child.date_done.replace(tzinfo=UTC).timestamp() - sent_at
        for child in result.results
        if child.date_done is not None
    )
    if len(done) != tasks:
        raise SystemExit(f"{len(done)} of {tasks} callback tasks reported done")
    return Chord(done[0], done[-1], cpu / tasks)


def measure(
    label: str, broker_url: str, backend_url: str, args: argparse.Namespace, server_pid: int | None
) -> list[Chord]:
    made = make_app(broker_url, backend_url)
    logs = Path(tempfile.mkdtemp(prefix="objq-bench-chord-")) / "worker.log"
    worker = start_worker("celery_chord", QUEUE, broker_url, backend_url, logs, loglevel="CRITICAL")
    try:
        made.signature("bench.identity", (0,)).delay().get(timeout=WORKER_START_SECONDS)
        chords = []
        for _ in range(args.chords):
            chords.append(run_chord(made, args.tasks, worker.pid, server_pid))
            time.sleep(1)  # the worker idles between chords, as between the suite's tests
    finally:
        stop_worker(worker)
        made.close()
    print(f"  {label}: done", flush=True)
    return chords


def spin() -> None:
    while True:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200, help="callback tasks per chord")
    parser.add_argument("--chords", type=int, default=3)
    parser.add_argument("--busy", type=int, default=0, help="processes spinning beside it")
    args = parser.parse_args()
    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.busy)]
    for spinner in spinners:
        spinner.start()
    rows: dict[str, list[Chord]] = {}
    with tempfile.TemporaryDirectory(prefix="objq-bench-chord-") as scratch:
        folder = Path(scratch)
        rows["objq + objq"] = measure(
            "objq + objq",
            f"objq+{(folder / 'broker').as_uri()}",
            f"objq+{(folder / 'results').as_uri()}",
            args,
            None,
        )
        if shutil.which("redis-server"):
            server = start_redis()  # no persistence
            try:
                rows["Redis + Redis"] = measure(
                    "Redis + Redis", server.url, server.url, args, server.process.pid
                )
            finally:
                server.stop()
        else:
            print("  Redis + Redis: skipped (no redis-server on PATH)")
    for spinner in spinners:
        spinner.terminate()
    # The tree measured: another checkout's, when PYTHONPATH puts it first.
    revision = objq_revision(Path(objq_broker.kombu.__file__).parents[2])
    print(
        f"\nobjq {revision}, Celery {version('celery')}, kombu {version('kombu')}, "
        f"Python {platform.python_version()}, {os.cpu_count()} cores, {args.busy} busy; "
        f"a chord of one header task and {args.tasks} failing callback tasks, "
        f"{args.chords} chords per row\n"
    )
    print("| row | first task done, s | last, s | per callback task, ms | CPU per task, ms |")
    print("|---|---:|---:|---:|---:|")
    for label, chords in rows.items():
        first = statistics.median(c.first for c in chords)
        last = statistics.median(c.last for c in chords)
        per = statistics.median((c.last - c.first) / max(args.tasks - 1, 1) for c in chords)
        cpu = statistics.median(c.cpu_per_task for c in chords)
        print(f"| {label} | {first:.2f} | {last:.2f} | {per * 1000:.1f} | {cpu * 1000:.1f} |")


if __name__ == "__main__":
    main()
