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
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from provenance import objq_revision

from objq_broker import Queue
from objq_broker.broker.elected import ElectedCommitter

QUEUE = "publish"
PAYLOAD = b"x" * 100


def publish(url: str, count: int, plan: tuple[int, int], barrier: Any, out: Any) -> None:
    threads, lanes = plan
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


def run_case(args: argparse.Namespace, lanes: int) -> str:
    url = Path(tempfile.mkdtemp(prefix="objq-publish-")).as_uri()
    context = mp.get_context("spawn")
    barrier = context.Barrier(args.processes)
    out = context.Queue()
    each = args.messages // args.processes
    children = [
        context.Process(target=publish, args=(url, each, (args.threads, lanes), barrier, out))
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
    for lanes in args.lanes:
        print(run_case(args, lanes), flush=True)


if __name__ == "__main__":
    main()
