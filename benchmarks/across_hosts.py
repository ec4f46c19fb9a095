"""The broker across hosts: publishing and contention with the link secured, at 0 and 5 ms.

Three test hosts on this machine (network namespaces joined by a bridge,
``tests/support/hosts.py``; needs root and iproute2). The latency: the clients reach the broker
through a relay on the machine (the bridge's address) that holds every chunk ``--latency-ms``
in each direction before passing it on, so a round trip pays it twice. (``tc netem`` would do
it in the kernel, but not every kernel has netem; the relay is Python, and its CPU counts
against the machine's: the row at 0 ms goes through it too, for a fair ratio, and the first row
is the direct link without it.) Host a runs a
dedicated ``objq broker`` listening on ``0.0.0.0:7700`` with a token (CURVE), hosts b and c the
clients, configured as across hosts: the same token, ``broker_listen=0.0.0.0:7700`` and their
own ``broker_advertise``. Storage is a folder on the machine's file system, which every host
sees (no latency: what is measured is the hop to the broker).

* **publish**: 2 processes on b and 2 on c, 4 threads each, ``Queue.enqueue`` (durable on
  return), ``--messages`` in all: messages/s from the common start to the last one done.
* **contention**: 4 single-job producers on b and 4 claim-and-ack workers on c for
  ``--seconds`` (as ``benchmarks/contention.py`` runs them on one host): operations/s (an
  enqueue, or a claim and an ack per completed job), completed, failed calls, p99 call.

    sudo python benchmarks/across_hosts.py                       # direct, relay 0 and 5 ms
    sudo python benchmarks/across_hosts.py --latency-ms 0 5 20 --seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the tests' test hosts

from provenance import objq_revision  # noqa: E402

from objq_broker import Queue  # noqa: E402

QUEUE = "across"
PAYLOAD = b'{"task": "noop", "args": [1]}'
PORT = 7700
TOKEN = "a-long-random-token-for-the-benchmark-hosts"
PUBLISH_THREADS = 4
CLAIM_WAIT_SECONDS = 0.5


# --- a process on a test host ------------------------------------------------------------------


def publish(url: str, count: int, threads: int, start_at: float) -> dict[str, Any]:
    sent, failed = [0], [0]
    lock = threading.Lock()
    with Queue(url) as q:
        q.enqueue(QUEUE, PAYLOAD)  # warm-up: finds the broker

        def run(n: int) -> None:
            for _ in range(n):
                try:
                    q.enqueue(QUEUE, PAYLOAD)
                    with lock:
                        sent[0] += 1
                except Exception:  # counted: a failed send is part of what this measures
                    with lock:
                        failed[0] += 1

        workers = [
            threading.Thread(target=run, args=(count // threads + (i < count % threads),))
            for i in range(threads)
        ]
        time.sleep(max(0.0, start_at - time.time()))
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        finished = time.time()
    return {"sent": sent[0], "failed": failed[0], "finished": finished}


def contend(url: str, role: str, seconds: float, start_at: float) -> dict[str, Any]:
    done = failed = 0
    latencies: list[float] = []
    with Queue(url) as q:
        q.stats(QUEUE)  # finds the broker
        time.sleep(max(0.0, start_at - time.time()))
        end = start_at + seconds
        while time.time() < end:
            started = time.perf_counter()
            try:
                if role == "producer":
                    q.enqueue(QUEUE, PAYLOAD)
                    done += 1
                else:
                    wait = max(min(CLAIM_WAIT_SECONDS, end - time.time()), 0.0)
                    for delivery in q.claim(QUEUE, timeout=wait):
                        q.ack(delivery, wait=False)
                        done += 1
            except Exception:  # counted: a failed call is what this measures
                failed += 1
            latencies.append(time.perf_counter() - started)
    return {"role": role, "done": done, "failed": failed, "latencies": latencies}


def child(args: argparse.Namespace) -> None:
    if args.role == "publish":
        result = publish(args.url, args.count, PUBLISH_THREADS, args.start_at)
    else:
        result = contend(args.url, args.role, args.seconds, args.start_at)
    print(json.dumps(result), flush=True)


# --- the parent --------------------------------------------------------------------------------


class Relay:
    """TCP from ``listen`` (host, port) to ``target``, each chunk held ``delay`` seconds in
    each direction (in order), on an event loop of its own thread."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int], delay: float) -> None:
        self.target, self.delay = target, delay
        self._loop = asyncio.new_event_loop()
        started = threading.Event()
        threading.Thread(target=self._run, args=(listen, started), daemon=True).start()
        started.wait(10)

    def _run(self, listen: tuple[str, int], started: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._accept, *listen))
        started.set()
        with contextlib.suppress(RuntimeError):
            self._loop.run_forever()
        server.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        await asyncio.gather(
            self._pipe(reader, upstream_writer), self._pipe(upstream_reader, writer)
        )

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()

        async def take() -> None:
            while data := await reader.read(1 << 16):
                held.put_nowait((self._loop.time() + self.delay, data))
            held.put_nowait(None)

        async def give() -> None:
            while (item := await held.get()) is not None:
                due, data = item
                await asyncio.sleep(max(0.0, due - self._loop.time()))
                writer.write(data)
                await writer.drain()
            writer.close()

        with contextlib.suppress(ConnectionError):
            await asyncio.gather(take(), give())

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)


def host_env(address: str, advertise: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OBJQ_")}
    env.update(
        OBJQ_BROKER_TOKEN=TOKEN,
        OBJQ_BROKER_LISTEN=f"0.0.0.0:{PORT}",
        OBJQ_BROKER_ADVERTISE=advertise or f"{address}:{PORT}",
        PYTHONPATH=str(ROOT),
    )
    return env


def run_on(host: Any, argv: list[str]) -> subprocess.Popen[bytes]:
    command = host.command([sys.executable, str(Path(__file__).resolve()), *argv])
    return subprocess.Popen(command, env=host_env(host.address), stdout=subprocess.PIPE)


def results(processes: list[subprocess.Popen[bytes]], timeout: float) -> list[dict[str, Any]]:
    found = []
    for process in processes:
        out, _ = process.communicate(timeout=timeout)
        found.append(json.loads(out.decode().strip().splitlines()[-1]))
    return found


@contextlib.contextmanager
def broker_on(host: Any, url: str, advertise: str | None) -> Iterator[None]:
    command = host.command(
        [sys.executable, "-m", "objq_broker.cli", "broker", "--url", url, "--json"]
    )
    env = host_env(host.address, advertise)
    broker = subprocess.Popen(command, env=env, stdout=subprocess.PIPE)
    try:
        assert broker.stdout is not None
        json.loads(broker.stdout.readline())  # it serves once it says so
        yield
    finally:
        broker.terminate()
        broker.wait(30)


def measure(latency_ms: float | None, args: argparse.Namespace) -> dict[str, Any]:
    """One row: the direct link (``latency_ms`` None), or through the relay."""
    from tests.support.hosts import SUBNET, make_hosts

    made = make_hosts(["a", "b", "c"])
    a, b, c = next(made)
    relay, advertise = None, None
    if latency_ms is not None:
        relay = Relay((f"{SUBNET}.1", PORT + 1), (a.address, PORT), latency_ms / 1000)
        advertise = f"{SUBNET}.1:{PORT + 1}"
    try:
        folder = Path(tempfile.mkdtemp(prefix="objq-across-"))
        url = folder.as_uri()
        with broker_on(a, url, advertise):
            start_at = time.time() + 3.0
            argv = ["--url", url, "--start-at", str(start_at)]
            share = args.messages // 4
            pubs = [
                run_on(h, [*argv, "--role", "publish", "--count", str(share)]) for h in (b, b, c, c)
            ]
            published = results(pubs, 600)
            seconds = max(r["finished"] for r in published) - start_at
            sent = sum(r["sent"] for r in published)

            start_at = time.time() + 3.0
            argv = ["--url", url, "--start-at", str(start_at), "--seconds", str(args.seconds)]
            roles = [(b, "producer")] * 4 + [(c, "worker")] * 4
            tallies = results([run_on(h, [*argv, "--role", r]) for h, r in roles], 300)
        enqueued = sum(t["done"] for t in tallies if t["role"] == "producer")
        completed = sum(t["done"] for t in tallies if t["role"] == "worker")
        latencies = sorted(x for t in tallies for x in t["latencies"])
        return {
            "latency_ms": latency_ms,
            "publish_msgs": sent,
            "publish_rate": sent / seconds,
            "publish_failed": sum(r["failed"] for r in published),
            "ops_per_s": (enqueued + 2 * completed) / args.seconds,
            "enqueued": enqueued,
            "completed": completed,
            "failed": sum(t["failed"] for t in tallies),
            "p99_ms": 1000 * latencies[int(len(latencies) * 0.99)] if latencies else 0.0,
        }
    finally:
        if relay is not None:
            relay.close()
        made.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency-ms", type=float, nargs="+", default=[0.0, 5.0])
    parser.add_argument("--messages", type=int, default=8000, help="publish: messages in all")
    parser.add_argument("--seconds", type=float, default=8.0, help="contention: the window")
    parser.add_argument("--role", choices=["publish", "producer", "worker"], help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role is not None:
        return child(args)
    if os.geteuid() != 0:
        raise SystemExit("across_hosts.py makes test hosts (network namespaces): run it as root")
    print(
        f"# across hosts; {objq_revision(ROOT) or 'objq (not a checkout)'}; "
        f"Python {platform.python_version()}; {os.cpu_count()} CPUs; "
        f"{args.messages:,} messages published, {args.seconds:g} s of contention"
    )
    print(
        "| link | publish msg/s (4 x 4) | failed | contention ops/s (4 + 4) "
        "| enqueued | completed | failed calls | p99 call (ms) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for latency in [None, *args.latency_ms]:
        r = measure(latency, args)
        link = "direct" if latency is None else f"relay, {latency:g} ms each way"
        print(
            f"| {link} | {r['publish_rate']:,.0f} | {r['publish_failed']} "
            f"| {r['ops_per_s']:,.0f} | {r['enqueued']:,} | {r['completed']:,} | {r['failed']} "
            f"| {r['p99_ms']:.1f} |",
            flush=True,
        )
    return None


if __name__ == "__main__":
    main()
