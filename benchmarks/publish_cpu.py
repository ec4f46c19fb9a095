"""CPU per published message, by path, in one run: where publishing spends its CPU.

Rows (each a fresh file:// namespace; every process's CPU time, utime + stime from /proc, from
the common start to the last send, divided by the messages sent):

  direct               1 process x 16 threads, Queue.enqueue, broker="off" (the engine alone)
  elected              4 processes x 4 threads, Queue.enqueue, broker="auto" (engine + broker hop)
  dramatiq-elected     4 x 4 actor.send() through ObjqBroker (auto)
  dramatiq-stub        4 x 4 actor.send() to Dramatiq's StubBroker (the framework alone)
  dramatiq-redis       4 x 4 through RedisBroker, redis-server without persistence
  dramatiq-redis-fsync 4 x 4 through RedisBroker, redis-server --appendfsync always (objq's
                       durability: a send returns once the message is on disk)

The Redis rows count redis-server's CPU too. Needs redis-server on PATH for those rows, and
psutil (`pip install psutil`).

    python benchmarks/publish_cpu.py                                  # every row
    N=3000 python benchmarks/publish_cpu.py direct elected dramatiq-redis-fsync

Measured on the 2-core machine (msg/s, CPU ms per message). 2026-12-05, the broker's link on
gRPC: direct 6,033 / 0.090; elected 3,033 / 0.312; dramatiq-elected 3,307 / 0.357;
dramatiq-redis 16,201 / 0.111. Another run: dramatiq-elected 2,991 / 0.343; dramatiq-redis
9,433 / 0.117; dramatiq-redis-fsync 6,301 / 0.187. 2026-12-06 02:17, the link on libzmq (git
3b12b99): direct 6,062 / 0.154; elected 4,484 / 0.259; dramatiq-elected 3,042 / 0.392;
dramatiq-redis 8,592 / 0.223; dramatiq-redis-fsync 6,943 / 0.258 (benchmarks/README.md).
"""

import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import threading
import time

import psutil

N = int(os.environ.get("N", "3000"))  # messages per process
REDIS_PORTS = {"dramatiq-redis": 6399, "dramatiq-redis-fsync": 6398}
ROWS = ["direct", "elected", "dramatiq-elected", "dramatiq-stub", *REDIS_PORTS]


def sender(kind: str, url: str):
    """(send, close) for one process of row ``kind``."""
    if kind.startswith("dramatiq"):
        import dramatiq

        if kind == "dramatiq-stub":
            from dramatiq.brokers.stub import StubBroker

            broker = StubBroker()
        elif kind in REDIS_PORTS:
            from dramatiq.brokers.redis import RedisBroker

            broker = RedisBroker(url=f"redis://127.0.0.1:{REDIS_PORTS[kind]}/0")
        else:
            from objq_broker.dramatiq import ObjqBroker

            broker = ObjqBroker(url)
        dramatiq.set_broker(broker)

        @dramatiq.actor(queue_name="pub")
        def work(i):
            pass

        work.send(-1)  # warm: connections, queue declarations
        return work.send, broker.close

    from objq_broker import Queue

    q = Queue(url, broker="off" if kind == "direct" else "auto")
    q.declare("pub")
    q.enqueue("pub", b"warm")
    return (lambda i: q.enqueue("pub", b"x" * 120)), q.close


def process(kind, url, threads, start_at, signals):
    ready, done = signals
    send, close = sender(kind, url)
    ready.put(os.getpid())
    while time.time() < start_at:
        time.sleep(0.005)

    def run():
        for i in range(N // threads):
            send(i)

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    done.put(time.time())
    time.sleep(1.5)  # stay open: a closing process would hand the broker role over mid-run
    close()


def row(kind, procs, threads, servers):
    url = f"file://{tempfile.mkdtemp()}/store"
    ctx = mp.get_context("spawn")
    ready, done = ctx.Queue(), ctx.Queue()
    start_at = time.time() + 5
    ps = [
        ctx.Process(target=process, args=(kind, url, threads, start_at, (ready, done)))
        for _ in range(procs)
    ]
    for p in ps:
        p.start()
    measured = [psutil.Process(ready.get(timeout=60)) for _ in ps]
    if kind in servers:
        measured.append(servers[kind])
    while time.time() < start_at:
        time.sleep(0.001)
    cpu0 = sum(sum(h.cpu_times()[:2]) for h in measured)
    ends = [done.get(timeout=300) for _ in ps]
    cpu1 = sum(sum(h.cpu_times()[:2]) for h in measured)
    for p in ps:
        p.join()
    sent = procs * (N // threads) * threads
    elapsed = max(ends) - start_at
    print(
        f"{kind:22s} {procs}x{threads:<3d} {sent / elapsed:8,.0f} msg/s   "
        f"CPU {1000 * (cpu1 - cpu0) / sent:.3f} ms/msg",
        flush=True,
    )


def main(rows):
    servers, started = {}, []
    for kind, port in REDIS_PORTS.items():
        if kind in rows:
            extra = (
                ["--appendonly", "yes", "--appendfsync", "always", "--dir", tempfile.mkdtemp()]
                if "fsync" in kind
                else ["--appendonly", "no"]
            )
            proc = subprocess.Popen(
                ["redis-server", "--port", str(port), "--save", "", *extra],
                stdout=subprocess.DEVNULL,
            )
            started.append(proc)
            servers[kind] = psutil.Process(proc.pid)
    time.sleep(0.5)
    try:
        for kind in rows:
            row(kind, 1, 16, servers) if kind == "direct" else row(kind, 4, 4, servers)
    finally:
        for proc in started:
            proc.kill()


if __name__ == "__main__":
    main(sys.argv[1:] or ROWS)
