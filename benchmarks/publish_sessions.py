"""Where publishing through the broker spends its time: sessions in flight against CPU.

``--processes`` processes x ``--threads`` threads each call ``Queue.enqueue`` (durable on
return, no framework) on one fresh ``file://`` namespace in elected mode, ``--messages`` in all.
Each process opens ``lanes`` queues and spreads its threads over them, so it has up to that many
sessions in flight to the broker at once (one queue sends one session at a time, carrying all its
threads' pending operations). Printed per case: messages/s (from the common start to the last
process done); the CPU time the broker-holding process used during the run per message published
by all (it commits every one, besides sending its own share); and the CPU time each other
process used per message it sent.

    python benchmarks/publish_sessions.py                   # lanes 1, 2 and 4
    python benchmarks/publish_sessions.py --lanes 1 --messages 20000
    python benchmarks/publish_sessions.py --lanes 1 --messages 20000 --cycle

``--cycle`` also cuts the broker's commit cycle into steps. Every sender waits for its
message's commit before it sends the next, so messages/s is (senders per commit) / (cycle
time), and the cycle is what a change has to shorten. Each process appends a line to a file of
its own at four moments (wrapping objq's own functions): the broker's engine starts a commit
and hands out its results, a client sends a session and receives its answer, the broker's
I/O thread takes a session. For the middle half of the commits, the table gives each
step's median and 90th percentile in ms, counted from the moment the commit's results were
handed out: the k-th client to receive its answer, the k-th to send its next session, the
k-th session to reach the broker, and the next commit's start; then that commit's own length.
The marks cost a little time themselves, so compare runs that both have them.
"""

from __future__ import annotations

import argparse
import bisect
import multiprocessing as mp
import os
import resource
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from provenance import objq_revision

from objq_broker import Queue
from objq_broker.broker.client import BrokerLink
from objq_broker.broker.elected import ElectedCommitter
from objq_broker.broker.server import BrokerServer
from objq_broker.engine.loop import CommitLoop

QUEUE = "publish"
PAYLOAD = b"x" * 100


def mark_cycle(folder: str) -> None:
    """Have this process append ``name time`` lines to its own file in ``folder`` at the
    moments ``--cycle`` reports (the clock is the machine's, the same in every process)."""
    marks = open(Path(folder) / f"{os.getpid()}.marks", "a", buffering=1)  # noqa: SIM115

    def marked(method: Callable[..., Any], before: str, after: str | None = None) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            marks.write(f"{before} {time.time()}\n")
            try:
                return method(*args, **kwargs)
            finally:
                if after:
                    marks.write(f"{after} {time.time()}\n")

        return wrapper

    CommitLoop._commit = marked(CommitLoop._commit, "commit")  # type: ignore[method-assign]
    # A static method: wrapped as one, so the engine still calls it without itself.
    CommitLoop._resolve = staticmethod(marked(CommitLoop._resolve, "resolve"))  # type: ignore[method-assign]
    BrokerServer._apply = marked(BrokerServer._apply, "arrive")  # type: ignore[method-assign]
    BrokerLink.apply = marked(BrokerLink.apply, "send", "receive")  # type: ignore[method-assign]


def cycle_steps(folder: Path) -> list[tuple[str, list[float]]]:
    """The ``--cycle`` steps (name, ms per commit) from the marks in ``folder``."""
    marks: dict[str, dict[str, list[float]]] = {}
    for path in folder.glob("*.marks"):
        process = marks[path.stem] = {}
        for line in path.read_text().splitlines():
            name, at = line.split()
            process.setdefault(name, []).append(float(at))
    # The broker: the process that committed most (another may have committed a warm-up
    # itself before it found the broker).
    broker = marks.pop(max(marks, key=lambda p: len(marks[p].get("resolve", []))))
    resolves = broker["resolve"]
    steps: dict[str, list[float]] = {}
    for out in resolves[len(resolves) // 4 : 3 * len(resolves) // 4]:
        for step, ms in _one_cycle(out, broker, list(marks.values())):
            steps.setdefault(step, []).append(ms)
    order = {"receives": 0, "sends": 1, "reaches": 2, "next": 3, "that": 4}
    return sorted(steps.items(), key=lambda item: (order[item[0].split()[0]], item[0]))


def _one_cycle(
    out: float, broker: dict[str, list[float]], clients: list[dict[str, list[float]]]
) -> list[tuple[str, float]]:
    """The steps of the cycle that began when a commit handed out its results at ``out``."""
    start = _first_after(broker["commit"], out)
    if start is None:
        return []
    received, sent = [], []
    for named in clients:
        got = _first_after(named.get("receive", []), out, before=start)
        again = None if got is None else _first_after(named.get("send", []), got, before=start)
        received += [] if got is None else [got]
        sent += [] if again is None else [again]
    arrived = [t for t in broker.get("arrive", []) if out < t < start]
    steps = [
        (f"{label} {k}", 1000 * (moment - out))
        for label, moments in (("receives", received), ("sends", sent), ("reaches", arrived))
        for k, moment in enumerate(sorted(moments), 1)
    ]
    steps.append(("next commit starts", 1000 * (start - out)))
    done = _first_after(broker["resolve"], start)
    if done is not None:
        steps.append(("that commit's length", 1000 * (done - start)))
    return steps


def _first_after(moments: list[float], after: float, before: float | None = None) -> float | None:
    index = bisect.bisect_right(moments, after)
    if index < len(moments) and (before is None or moments[index] < before):
        return moments[index]
    return None


def publish(
    url: str, count: int, plan: tuple[int, int, str | None], barrier: Any, out: Any
) -> None:
    threads, lanes, marks = plan
    if marks:
        mark_cycle(marks)
    queues = [Queue(url, broker="auto") for _ in range(lanes)]
    for queue in queues:
        queue.enqueue(QUEUE, b"warm-up")  # found the broker (or became it)
    barrier.wait()
    before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()

    def send(queue: Queue, n: int) -> None:
        for _ in range(n):
            queue.enqueue(QUEUE, PAYLOAD)

    workers = [
        threading.Thread(target=send, args=(queues[i % lanes], count // threads))
        for i in range(threads)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    leads = any(
        isinstance(q.committer, ElectedCommitter) and q.committer.role == "leader" for q in queues
    )
    out.put((seconds, cpu, leads))
    barrier.wait()  # nobody closes (and hands the broker over) before all are done
    for queue in queues:
        queue.close()


def run_case(args: argparse.Namespace, lanes: int, marks: Path | None) -> str:
    url = Path(tempfile.mkdtemp(prefix="objq-publish-")).as_uri()
    context = mp.get_context("spawn")
    barrier = context.Barrier(args.processes)
    out = context.Queue()
    each = args.messages // args.processes
    plan = (args.threads, lanes, None if marks is None else str(marks))
    children = [
        context.Process(target=publish, args=(url, each, plan, barrier, out))
        for _ in range(args.processes)
    ]
    for child in children:
        child.start()
    results = [out.get(timeout=600) for _ in children]
    for child in children:
        child.join()
    seconds = max(r[0] for r in results)
    total = each * args.processes
    broker = sum(r[1] for r in results if r[2]) / total  # it commits every message
    others = statistics.fmean([r[1] / each for r in results if not r[2]] or [0.0])
    return f"| {lanes} | {total / seconds:,.0f} | {1000 * broker:.2f} | {1000 * others:.2f} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--messages", type=int, default=8000)
    parser.add_argument("--lanes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument(
        "--cycle", action="store_true", help="cut the broker's commit cycle into steps"
    )
    args = parser.parse_args()
    print(
        f"# publish sessions: {args.processes} processes x {args.threads} threads, "
        f"{args.messages:,} messages; {objq_revision(Path(__file__).resolve().parent.parent)}"
    )
    print(
        "| queues per process | messages/s | broker process: CPU ms per message of all "
        "| other processes: CPU ms per message sent |"
    )
    print("|---:|---:|---:|---:|")
    cycles = []
    for lanes in args.lanes:
        marks = Path(tempfile.mkdtemp(prefix="objq-publish-marks-")) if args.cycle else None
        print(run_case(args, lanes, marks), flush=True)
        if marks is not None:
            cycles.append((lanes, cycle_steps(marks)))
            shutil.rmtree(marks, ignore_errors=True)
    for lanes, steps in cycles:
        print(f"\n# the commit cycle, {lanes} queue(s) per process: ms after a commit's results")
        print("| step | median (ms) | 90th percentile (ms) | commits |")
        print("|---|---:|---:|---:|")
        for step, values in steps:
            ordered = sorted(values)
            p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
            median = statistics.median(values)
            print(f"| {step} | {median:.2f} | {p90:.2f} | {len(values)} |")


if __name__ == "__main__":
    main()
