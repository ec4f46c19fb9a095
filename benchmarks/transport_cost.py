"""CPU per request of a broker's transport: gRPC designs against pyzmq, on loopback.

One request and its answer between two processes: the client (this process, with
``--threads`` threads, each with one call in flight at a time, as the broker's clients
pipeline) sends ``--bytes`` bytes and the server (a child process started with the ``spawn``
context) echoes them. For each design and thread count, after a warm-up, it times ``--calls``
calls per thread and reads the CPU time both processes used over exactly that window: this
process's from ``getrusage``, the server's from ``/proc/<pid>/stat`` (utime + stime, in clock
ticks of 10 ms: at 3,000 calls, 3 microseconds a call). It does so ``--rounds`` times, each
design in turn with a new server and client, and shows the round of median CPU per call; the
spread is the range of all rounds over that median.

Designs:

* ``grpc-unary``: grpcio's generic ``unary_unary`` handler, a ``ThreadPoolExecutor`` at the
  server, client threads calling the stub directly: the design of the broker's gRPC server.
* ``grpc-stream``: one bidirectional stream per client process. The server's handler iterates
  the requests and yields the answers (no pool thread per call); client threads put requests,
  prefixed by an 8-byte id, on the queue that feeds the request iterator, and one reader thread
  hands each answer to its caller through a lock the caller waits on.
* ``zmq-lock``: one DEALER socket per client process (a ROUTER at the server, one thread
  echoing). Callers send under a lock; one reader thread waits on the socket's file descriptor
  and receives under the same lock. Whoever holds the lock receives whatever has arrived,
  because any use of a socket may consume the descriptor's signal.
* ``zmq-inproc``: the same DEALER, owned by one I/O thread; each caller sends through its own
  inproc PUSH to the I/O thread, which forwards to the DEALER and hands answers to callers.
* ``zmq-curve``: ``zmq-lock`` with CURVE encryption and authentication on.

``zmq-lock`` is pyzmq's design here (the cheaper variant: see below), which the last column
divides every design's CPU per call by, at the same thread count. Where grpcio is not
installed, the grpc designs are left out.

    python benchmarks/transport_cost.py                        # about a minute
    python benchmarks/transport_cost.py --threads 1,2,8 --bytes 4096
    python benchmarks/transport_cost.py --designs grpc-stream,zmq-lock --calls 10000 --rounds 3

Two runs of 2026-12-06, one after the other, on 2 cores (a virtual machine), Python 3.11.7,
grpcio 1.85.3, pyzmq 27.3.0 (libzmq 4.3.5), defaults (200 bytes, 3,000 calls per thread, 5
rounds), while nothing else ran:

    design             threads  calls/s CPU ms/call  client  server spread  ÷ zmq
    grpc-unary               1    2,502       0.471   0.181   0.290    26%   4.04
    grpc-unary               4    3,622       0.438   0.177   0.261    20%   5.89
    grpc-stream              1    4,252       0.323   0.190   0.133    29%   2.77
    grpc-stream              4    7,560       0.244   0.143   0.102    22%   3.28
    zmq-lock (zmq)           1    8,809       0.117   0.073   0.043    18%   1.00
    zmq-lock (zmq)           4   20,643       0.074   0.049   0.025    37%   1.00
    zmq-inproc               1    7,423       0.141   0.091   0.050    25%   1.21
    zmq-inproc               4   16,369       0.095   0.064   0.032    43%   1.28
    zmq-curve (lock)         1    7,004       0.151   0.087   0.063    41%   1.29
    zmq-curve (lock)         4   17,027       0.096   0.062   0.033    25%   1.28

    design             threads  calls/s CPU ms/call  client  server spread  ÷ zmq
    grpc-unary               1    2,854       0.431   0.168   0.263    62%   3.91
    grpc-unary               4    3,795       0.423   0.179   0.244    53%   5.94
    grpc-stream              1    5,792       0.242   0.146   0.097    52%   2.19
    grpc-stream              4    7,570       0.234   0.139   0.095    27%   3.29
    zmq-lock (zmq)           1    9,710       0.110   0.064   0.047    22%   1.00
    zmq-lock (zmq)           4   22,378       0.071   0.047   0.024    18%   1.00
    zmq-inproc               1    8,483       0.119   0.082   0.037    48%   1.08
    zmq-inproc               4   19,320       0.080   0.054   0.026    69%   1.13
    zmq-curve (lock)         1    8,414       0.121   0.071   0.050    32%   1.10
    zmq-curve (lock)         4   21,409       0.073   0.048   0.024    49%   1.03

On this machine one design's rounds differ by 20 to 70 % from minute to minute, and runs while
other work kept both cores busy came out 10 to 30 % cheaper per call (waking an idle core costs
more than waking a busy one): compare the ratios, which hold far better than the figures.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import multiprocessing.connection
import os
import platform
import queue
import resource
import select
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import zmq

try:
    import grpc
except ImportError:  # the zmq designs are measured all the same
    grpc = None

DESIGNS = ("grpc-unary", "grpc-stream", "zmq-lock", "zmq-inproc", "zmq-curve")
#: pyzmq's design, which the others are compared with: the cheaper zmq variant, by 8 to 28 %
#: in the runs of the module's docstring.
ZMQ = "zmq-lock"
UNARY_METHOD = "/bench.Echo/Unary"
STREAM_METHOD = "/bench.Echo/Stream"
ID_BYTES = 8
WARMUP_CALLS = 300
CLOCK_TICK = 1 / os.sysconf("SC_CLK_TCK")

#: A server's CURVE keys: (public, secret) of the server, then of the client.
CurveKeys = tuple[bytes, bytes, bytes, bytes]


# -- servers: each runs in its own spawned process until it is terminated ----------------------


def serve_grpc(conn: multiprocessing.connection.Connection) -> None:
    def unary(request: bytes, context: grpc.ServicerContext) -> bytes:
        return request

    def stream(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        yield from requests

    server = grpc.server(ThreadPoolExecutor(max_workers=16))
    handler = grpc.method_handlers_generic_handler(
        "bench.Echo",
        {
            "Unary": grpc.unary_unary_rpc_method_handler(unary),
            "Stream": grpc.stream_stream_rpc_method_handler(stream),
        },
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    conn.send(f"127.0.0.1:{port}")
    server.wait_for_termination()


def serve_zmq(conn: multiprocessing.connection.Connection, curve: CurveKeys | None) -> None:
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    if curve is not None:
        router.curve_server = True
        router.curve_secretkey = curve[1]
    port = router.bind_to_random_port("tcp://127.0.0.1")
    conn.send(f"tcp://127.0.0.1:{port}")
    # pyzmq copies a small message for less than it makes a zero-copy Frame of it.
    recv, send = router.recv_multipart, router.send_multipart
    while True:
        send(recv())


# -- clients: call() is called from many threads at once ---------------------------------------


class Client(Protocol):
    def call(self, payload: bytes) -> bytes: ...

    def close(self) -> None: ...


class Slots:
    """Callers waiting for their answers, by request id.

    A caller waits on a lock it holds, which the thread delivering the answer releases: cheaper
    than an Event or a Future, and left held again by the wait, ready for the caller's next call.
    Each thread has one call in flight at a time, so it keeps one slot for all its calls.
    """

    def __init__(self) -> None:
        self.waiting: dict[bytes, list[Any]] = {}
        self._ids = itertools.count()  # next() on it is atomic under the GIL
        self._local = threading.local()

    def open(self) -> tuple[bytes, list[Any]]:
        try:
            slot: list[Any] = self._local.slot
        except AttributeError:
            lock = threading.Lock()
            lock.acquire()
            slot = self._local.slot = [lock, None]
        key = next(self._ids).to_bytes(ID_BYTES, "little")
        self.waiting[key] = slot
        return key, slot

    def deliver(self, answer: bytes) -> None:
        slot = self.waiting.pop(answer[:ID_BYTES])
        slot[1] = answer
        slot[0].release()

    @staticmethod
    def wait(slot: list[Any]) -> bytes:
        slot[0].acquire()
        answer: bytes = slot[1]
        return answer[ID_BYTES:]


class GrpcUnaryClient:
    def __init__(self, address: str) -> None:
        self._channel = grpc.insecure_channel(address)
        self.call: Callable[[bytes], bytes] = self._channel.unary_unary(UNARY_METHOD)

    def close(self) -> None:
        self._channel.close()


class GrpcStreamClient:
    def __init__(self, address: str) -> None:
        self._channel = grpc.insecure_channel(address)
        self._slots = Slots()
        self._requests: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        stream = self._channel.stream_stream(STREAM_METHOD)
        self._answers = stream(iter(self._requests.get, None))
        self._reader = threading.Thread(target=self._read, name="grpc-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        deliver = self._slots.deliver
        for answer in self._answers:
            deliver(answer)

    def call(self, payload: bytes) -> bytes:
        key, slot = self._slots.open()
        self._requests.put(key + payload)
        return self._slots.wait(slot)

    def close(self) -> None:
        self._requests.put(None)
        self._reader.join(5)
        self._channel.close()


def _dealer(context: zmq.Context[Any], address: str, curve: CurveKeys | None) -> zmq.Socket[Any]:
    dealer = context.socket(zmq.DEALER)
    dealer.linger = 0
    if curve is not None:
        dealer.curve_serverkey = curve[0]
        dealer.curve_publickey = curve[2]
        dealer.curve_secretkey = curve[3]
    dealer.connect(address)
    return dealer


class ZmqLockClient:
    def __init__(self, address: str, curve: CurveKeys | None = None) -> None:
        self._context: zmq.Context[Any] = zmq.Context()
        self._dealer = _dealer(self._context, address, curve)
        self._lock = threading.Lock()
        self._slots = Slots()
        self._stop_r, self._stop_w = os.pipe()
        # Read here: once the reader runs, only a holder of the lock may touch the socket.
        self._fd = self._dealer.getsockopt(zmq.FD)
        self._reader = threading.Thread(target=self._read, name="zmq-reader", daemon=True)
        self._reader.start()

    def _receive(self) -> None:
        """Deliver every answer that has arrived; the caller holds the lock."""
        dealer, deliver = self._dealer, self._slots.deliver
        while dealer.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            deliver(dealer.recv(zmq.NOBLOCK))

    def _read(self) -> None:
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        poller.register(self._stop_r, select.POLLIN)
        while True:
            for fd, _ in poller.poll():
                if fd == self._stop_r:
                    return
            with self._lock:
                self._receive()

    def call(self, payload: bytes) -> bytes:
        key, slot = self._slots.open()
        with self._lock:
            self._dealer.send(key + payload)
            self._receive()
        return self._slots.wait(slot)

    def close(self) -> None:
        os.write(self._stop_w, b"x")
        self._reader.join(5)
        os.close(self._stop_r)
        os.close(self._stop_w)
        self._dealer.close()
        self._context.term()


class ZmqInprocClient:
    def __init__(self, address: str, curve: CurveKeys | None = None) -> None:
        self._context: zmq.Context[Any] = zmq.Context()
        self._endpoint = f"inproc://requests-{id(self)}"
        self._dealer = _dealer(self._context, address, curve)
        self._pull = self._context.socket(zmq.PULL)
        self._pull.bind(self._endpoint)
        self._slots = Slots()
        self._local = threading.local()
        self._pushes: list[zmq.Socket[Any]] = []
        self._io = threading.Thread(target=self._forward, name="zmq-io", daemon=True)
        self._io.start()

    def _forward(self) -> None:
        pull, dealer, deliver = self._pull, self._dealer, self._slots.deliver
        poller = zmq.Poller()
        poller.register(pull, zmq.POLLIN)
        poller.register(dealer, zmq.POLLIN)
        while True:
            # Draining each socket before polling again batches the requests of many threads.
            poller.poll()
            while pull.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                request = pull.recv(zmq.NOBLOCK)
                if not request:
                    return
                dealer.send(request)
            while dealer.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                deliver(dealer.recv(zmq.NOBLOCK))

    def _push(self) -> zmq.Socket[Any]:
        try:
            push: zmq.Socket[Any] = self._local.push
        except AttributeError:
            push = self._local.push = self._context.socket(zmq.PUSH)
            push.linger = 0
            push.connect(self._endpoint)
            self._pushes.append(push)
        return push

    def call(self, payload: bytes) -> bytes:
        key, slot = self._slots.open()
        self._push().send(key + payload)
        return self._slots.wait(slot)

    def close(self) -> None:
        self._push().send(b"")
        self._io.join(5)
        for socket in (*self._pushes, self._pull, self._dealer):
            socket.close()
        self._context.term()


# -- measuring ---------------------------------------------------------------------------------


@dataclass
class Result:
    design: str
    threads: int
    calls: int
    seconds: float
    client_cpu: float
    server_cpu: float

    @property
    def cpu_per_call(self) -> float:
        return (self.client_cpu + self.server_cpu) / self.calls


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def process_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        # The command name, in parentheses, may hold spaces: count fields after it.
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * CLOCK_TICK


def run_calls(
    client: Client, threads: int, calls: int, payload_bytes: int, server_pid: int
) -> tuple[float, float, float]:
    """Time ``calls`` calls in each of ``threads`` threads: (seconds, client CPU, server CPU)."""
    start = threading.Barrier(threads + 1)
    failures: list[BaseException] = []

    def work(index: int) -> None:
        # A payload of its own per thread shows an answer handed to the wrong caller.
        payload = bytes([index % 256]) * payload_bytes
        call = client.call
        start.wait()
        try:
            for _ in range(calls):
                if call(payload) != payload:
                    raise AssertionError("an answer reached the wrong caller")
        except BaseException as exc:
            failures.append(exc)

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    server_before, client_before, began = process_cpu(server_pid), own_cpu(), time.perf_counter()
    start.wait()
    for worker in workers:
        worker.join()
    seconds = time.perf_counter() - began
    client_cpu, server_cpu = own_cpu() - client_before, process_cpu(server_pid) - server_before
    if failures:
        raise failures[0]
    return seconds, client_cpu, server_cpu


def start_server(
    target: Callable[..., None], *args: object
) -> tuple[multiprocessing.process.BaseProcess, str]:
    spawn = multiprocessing.get_context("spawn")
    ours, theirs = spawn.Pipe()
    process = spawn.Process(target=target, args=(theirs, *args), daemon=True)
    process.start()
    if not ours.poll(60):
        process.kill()
        raise RuntimeError(f"the {target.__name__} server did not start")
    address: str = ours.recv()
    return process, address


def make_client(design: str) -> tuple[multiprocessing.process.BaseProcess, Client]:
    if design.startswith("grpc"):
        process, address = start_server(serve_grpc)
        client: Client = (
            GrpcUnaryClient(address) if design == "grpc-unary" else GrpcStreamClient(address)
        )
        return process, client
    curve: CurveKeys | None = None
    if design == "zmq-curve":
        curve = (*zmq.curve_keypair(), *zmq.curve_keypair())
    variant = ZMQ if design == "zmq-curve" else design
    process, address = start_server(serve_zmq, curve)
    client = (
        ZmqLockClient(address, curve) if variant == "zmq-lock" else ZmqInprocClient(address, curve)
    )
    return process, client


def measure(design: str, threads: list[int], calls: int, payload_bytes: int) -> list[Result]:
    process, client = make_client(design)
    try:
        results = []
        for count in threads:
            run_calls(client, count, min(WARMUP_CALLS, calls), payload_bytes, process.pid or 0)
            seconds, client_cpu, server_cpu = run_calls(
                client, count, calls, payload_bytes, process.pid or 0
            )
            results.append(Result(design, count, calls * count, seconds, client_cpu, server_cpu))
        client.close()
        return results
    finally:
        process.kill()
        process.join(10)


def median_round(rounds: list[Result]) -> tuple[Result, float]:
    """The round of median CPU per call, and the spread of all rounds around it."""
    ordered = sorted(rounds, key=lambda result: result.cpu_per_call)
    middle = ordered[(len(ordered) - 1) // 2]
    spread = (ordered[-1].cpu_per_call - ordered[0].cpu_per_call) / middle.cpu_per_call
    return middle, spread


def table(rounds: dict[tuple[str, int], list[Result]]) -> str:
    medians = {key: median_round(results) for key, results in rounds.items()}
    base = {count: r.cpu_per_call for (design, count), (r, _) in medians.items() if design == ZMQ}
    rows = [
        f"{'design':<18} {'threads':>7} {'calls/s':>8} {'CPU ms/call':>11} "
        f"{'client':>7} {'server':>7} {'spread':>6} {'÷ zmq':>6}"
    ]
    for (design, count), (r, spread) in medians.items():
        name = {ZMQ: f"{ZMQ} (zmq)", "zmq-curve": f"zmq-curve ({ZMQ[4:]})"}.get(design, design)
        ratio = f"{r.cpu_per_call / base[count]:6.2f}" if count in base else f"{'-':>6}"
        rows.append(
            f"{name:<18} {count:>7} {r.calls / r.seconds:>8,.0f} "
            f"{r.cpu_per_call * 1e3:>11.3f} {r.client_cpu / r.calls * 1e3:>7.3f} "
            f"{r.server_cpu / r.calls * 1e3:>7.3f} {spread:>6.0%} {ratio}"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=3000, help="timed calls per thread")
    parser.add_argument("--threads", default="1,4", help="client thread counts, e.g. 1,4")
    parser.add_argument("--bytes", type=int, default=200, help="request (and answer) size")
    parser.add_argument(
        "--designs", default=",".join(DESIGNS), help=f"some of {', '.join(DESIGNS)}"
    )
    parser.add_argument(
        "--rounds", type=int, default=5, help="rounds of all designs; the median is shown"
    )
    args = parser.parse_args()
    threads = [int(count) for count in args.threads.split(",")]
    chosen = [design.strip() for design in args.designs.split(",")]
    unknown = set(chosen) - set(DESIGNS)
    if unknown:
        parser.error(f"unknown designs: {', '.join(sorted(unknown))}")
    if grpc is None and any(design.startswith("grpc") for design in chosen):
        print("grpcio is not installed: the grpc designs are left out", file=sys.stderr)
        chosen = [design for design in chosen if not design.startswith("grpc")]

    print(
        f"Python {platform.python_version()}, grpcio {grpc.__version__ if grpc else '-'}, pyzmq "
        f"{zmq.__version__} (libzmq {zmq.zmq_version()}), {os.cpu_count()} cores; "
        f"{args.bytes} bytes, {args.calls:,} calls per thread, {args.rounds} rounds",
        file=sys.stderr,
    )
    rounds: dict[tuple[str, int], list[Result]] = {
        (design, count): [] for design in DESIGNS if design in chosen for count in threads
    }
    # Rounds of every design in turn, rather than all rounds of one design, spread the
    # machine's slow minutes over all designs alike.
    for number in range(1, args.rounds + 1):
        for design in DESIGNS:
            if design in chosen:
                print(f"  round {number}: {design}", file=sys.stderr, flush=True)
                for result in measure(design, threads, args.calls, args.bytes):
                    rounds[design, result.threads].append(result)
    print(table(rounds))


if __name__ == "__main__":
    main()
