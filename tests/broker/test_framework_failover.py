"""The elected broker under real framework workers: Dramatiq's and Celery's own CLIs, on SeaweedFS.

Every process of the namespace runs with the default settings (``OBJQ_BROKER`` unset: every
process takes part in the election; the example apps are unchanged). Two producer processes send one
message at a time, each with a number of its own, and note every send that returned. Mid-run
the test finds the process that serves the broker's address (the inode of the socket listening
there, from ``/proc/net/tcp6``, among the descriptors of the processes it started) and SIGKILLs
it. Then another process takes over (the record's epoch rises), no send fails, every message
whose send returned runs at least once, the queues end empty with no dead letters, and every
process left stops on SIGTERM (Dramatiq's last broker also resigns as its process stops).

Dramatiq's main process stops its whole fleet when one of its worker processes dies (it
SIGTERMs the others: ``dramatiq.cli.main``). So two fleets share the namespace: the first one
started holds the broker, and only its broker-serving worker process is killed; the other three
of that fleet then shut down gracefully while the broker is gone (what they give back must still
land), and the second fleet carries on.

Celery's prefork pool forks its children before the worker connects, but replaces them later
(here every few tasks, ``--max-tasks-per-child``) from a main process that by then serves the
broker or talks to it over libzmq. A child publishes when a task retries itself (a fifth of the
messages do, twice), through a queue of its own (the transport keys its queues by pid). The
test waits for children forked by the broker's process to be at work before it kills that
process, and reports how many children opened connections of their own to the broker (a
forked child never uses its parent's). A forked child joins as a client only (the transport
sees it was forked): it never takes the role, which it could not hand over on ``os._exit``;
none may die of a signal.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

from objq_broker.engine.snapshot import Snapshot
from objq_broker.model.records import BrokerRecord
from objq_broker.storage import ObjectStore, open_store
from tests.support.processes import Children
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[2]
#: Seconds an unreachable broker is waited for before another process takes over.
TAKEOVER_SECONDS = 1.5
#: Lease of a delivered message: the killed process's messages come back after this.
LEASE_SECONDS = 6.0
#: Generous bounds for a loaded two-core machine; every wait ends as soon as its condition holds.
START_TIMEOUT_SECONDS = 60.0
TAKEOVER_TIMEOUT_SECONDS = 30.0
DRAIN_TIMEOUT_SECONDS = 90.0
STOP_TIMEOUT_SECONDS = 60.0
#: Messages run before the kill, and sends after the takeover, that show work flowing.
DONE_BEFORE_KILL = 60
SENT_AFTER_TAKEOVER = 60
#: A producer's pause between two sends (a web handler's pace, not a bulk load).
SEND_PAUSE_SECONDS = 0.02


# --- the namespace, read without taking part in it ----------------------------------------------


class Namespace:
    """Reads the store's state; never writes it, never joins the election."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.store: ObjectStore = open_store(url)

    def close(self) -> None:
        self.store.close()

    def snapshot(self) -> Snapshot:
        return Snapshot.read(self.store)

    def broker(self) -> BrokerRecord | None:
        return self.snapshot().broker

    def successor(self, epoch: int) -> BrokerRecord | None:
        """The broker recorded now, if it took over after ``epoch``."""
        record = self.broker()
        return record if record is not None and record.epoch > epoch else None

    def busy(self, *queues: str) -> int:
        """Messages ready, delayed or in flight in ``queues``, from one state."""
        snapshot = self.snapshot()
        every = [snapshot.stats(q) for q in queues if q in snapshot.queue_names()]
        return sum(s.ready + s.delayed + s.in_flight for s in every)

    def dead(self, *queues: str) -> int:
        snapshot = self.snapshot()
        return sum(len(snapshot.dead_letters(q)) for q in queues if q in snapshot.queue_names())


@pytest.fixture
def seaweedfs_namespace(seaweedfs_url_factory: Callable[[], str]) -> Iterator[Namespace]:
    namespace = Namespace(seaweedfs_url_factory())
    yield namespace
    namespace.close()


# --- which process serves an address, and who talks to it (Linux's /proc) -----------------------


def parent_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def started_at(pid: int) -> float | None:
    """When ``pid`` started, as a Unix time (to within a clock tick); None once it is gone."""
    try:
        ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")


def descendants(root: int) -> set[int]:
    """``root`` and every process below it, now."""
    pids = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]
    parents = {pid: parent_of(pid) for pid in pids}
    found, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        below = [child for child, parent in parents.items() if parent == pid]
        found.update(below)
        frontier += below
    return found


def links(pid: int) -> set[str]:
    """What ``pid``'s descriptors link to (``socket:[INODE]``, ...); nothing once it is gone."""
    found: set[str] = set()
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):  # it exited meanwhile
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(FileNotFoundError):  # that descriptor was just closed
                found.add(os.readlink(fd))
    return found


def decode_address(hex_address: str) -> tuple[str, int]:
    """``/proc/net/tcp{,6}``'s ``ADDR:PORT`` (the address in 32-bit words of host byte order)."""
    hex_ip, hex_port = hex_address.split(":")
    raw = bytes.fromhex(hex_ip)
    packed = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(packed)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # a dual-stack socket shows an IPv4 peer as ::ffff:127.0.0.1
    return str(ip), int(hex_port, 16)


def socket_inodes(address: str, *, listening: bool) -> set[str]:
    """The sockets listening on ``host:port`` (``listening``) or the client ends of the
    connections to it, as the ``socket:[INODE]`` that descriptors link to."""
    host, port = address.rsplit(":", 1)
    wanted = (str(ipaddress.ip_address(host.strip("[]"))), int(port))
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, remote, state, inode = (line.split()[i] for i in (1, 2, 3, 9))
            if listening and state == "0A" and decode_address(local) == wanted:  # LISTEN
                found.add(f"socket:[{inode}]")
            elif not listening and state == "01" and decode_address(remote) == wanted:
                found.add(f"socket:[{inode}]")  # ESTABLISHED
    return found


@dataclass(frozen=True)
class Holder:
    """The process serving the broker under ``record``."""

    record: BrokerRecord
    pid: int


def find_holder(namespace: Namespace, roots: list[int]) -> Holder | None:
    """The process below ``roots`` that serves the broker recorded in the state, if any.

    A child forked after the server started holds the listening socket too (it inherits the
    descriptor): the server is the holder whose parent holds none."""
    record = namespace.broker()
    if record is None:
        return None
    listening = socket_inodes(record.address, listening=True)
    among = set().union(*(descendants(root) for root in roots))
    holders = {pid for pid in among if links(pid) & listening}
    servers = [pid for pid in holders if parent_of(pid) not in holders]
    if len(servers) != 1 or namespace.broker() != record:  # it moved while we looked
        return None
    return Holder(record, servers[0])


# --- processes ---------------------------------------------------------------------------------


class Guard:
    """What must hold while the test waits: its ``processes`` keep running, and each of its
    ``looks`` (which may record what they see, or raise) is taken at every check."""

    def __init__(self, *processes: subprocess.Popen[bytes]) -> None:
        self.processes = list(processes)
        self.looks: list[Callable[[], None]] = []

    def check(self) -> None:
        for process in self.processes:
            if process.poll() is not None:
                command = str(process.args)[:120]
                raise AssertionError(f"{command} exited with {process.returncode}")
        for look in self.looks:
            look()

    def until(self, condition: Callable[[], T | None]) -> Callable[[], T | None]:
        """``condition`` for ``wait_for``, after a check (a failed one ends the wait at once)."""

        def checked() -> T | None:
            self.check()
            return condition()

        return checked


def stop_gracefully(process: subprocess.Popen[bytes], what: str) -> int:
    """SIGTERM to ``process`` alone (a framework's main process forwards it to its pool; a
    second SIGTERM would make Dramatiq's workers exit at once); its exit status."""
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=STOP_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{what} ignored SIGTERM for {STOP_TIMEOUT_SECONDS:g} s") from None


def read_lines(paths: Iterator[Path]) -> list[str]:
    return [line for path in paths for line in path.read_text().splitlines() if line]


#: A producer's loop, after its ``send(n)``: ``sent N SECONDS`` once a send returned.
PRODUCER_LOOP = f"""
import signal, sys, time
stopping = []
signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
index, log = int(sys.argv[1]), open(sys.argv[2], "a", buffering=1)
n = 0
while not stopping:
    n += 1
    number = index * 1_000_000 + n
    began = time.monotonic()
    try:
        send(number)
    except Exception as exc:
        log.write(f"failed {{number}} {{type(exc).__name__}}: {{exc}}\\n")
        continue
    log.write(f"sent {{number}} {{time.monotonic() - began:.3f}}\\n")
    time.sleep({SEND_PAUSE_SECONDS})
"""


@dataclass
class Producers:
    """Producer processes, each writing ``DIR/producer-INDEX.log`` (see ``PRODUCER_LOOP``)."""

    folder: Path
    processes: list[subprocess.Popen[bytes]]

    def lines(self, word: str) -> list[list[str]]:
        logs = self.folder.glob("producer-*.log")
        return [line.split(" ")[1:] for line in read_lines(logs) if line.startswith(word + " ")]

    def sent(self) -> set[str]:
        return {number for number, _ in self.lines("sent")}

    def failed(self) -> list[str]:
        return [" ".join(words) for words in self.lines("failed")]

    def slowest_send(self) -> float:
        return max(float(seconds) for _, seconds in self.lines("sent"))

    def stop(self) -> None:
        for process in self.processes:
            assert stop_gracefully(process, "a producer") == 0


def start_producers(
    children: Children, script: str, env: dict[str, str], folder: Path, count: int = 2
) -> Producers:
    """``count`` processes running ``script`` with the arguments ``INDEX LOG``."""
    processes = [
        children.start(
            [sys.executable, "-c", script, str(index), str(folder / f"producer-{index}.log")],
            env=env,
            cwd=ROOT,
            log=folder / f"producer-{index}.out",
        )
        for index in range(1, count + 1)
    ]
    return Producers(folder, processes)


def base_env(results: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "OBJQ_BROKER"}  # the default: elected
    env.update(
        OBJQ_BROKER_TAKEOVER_SECONDS=str(TAKEOVER_SECONDS),
        APP_RESULTS_DIR=str(results),
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p),
    )
    return env


def ran_numbers(results: Path, parse: Callable[[str], str | None]) -> Counter[str]:
    """How often each message ran, by number, from the app's result logs."""
    found: Counter[str] = Counter()
    for line in read_lines(results.glob("*.log")):
        number = parse(line)
        if number is not None:
            found[number] += 1
    return found


def wait_until_all_ran(
    sent: set[str],
    ran: Callable[[], Counter[str]],
    guard: Guard,
    namespace: Namespace,
    queues: tuple[str, ...],
) -> None:
    """Wait until every message in ``sent`` has run, then until ``queues`` are empty."""
    wait_for(
        guard.until(lambda: sent <= set(ran())),
        DRAIN_TIMEOUT_SECONDS,
        "every message whose send returned to run",
        interval=0.25,
        progress=lambda: f"{len(sent - set(ran()))} not run, e.g. {sorted(sent - set(ran()))[:5]}",
    )
    wait_for(
        guard.until(lambda: namespace.busy(*queues) == 0),
        DRAIN_TIMEOUT_SECONDS,
        f"{queues} to be empty",
        interval=0.25,
        progress=lambda: f"{namespace.busy(*queues)} messages left",
    )


# --- Dramatiq ----------------------------------------------------------------------------------

DRAMATIQ_QUEUES = ("default", "default.DQ")
DRAMATIQ_PRODUCER = (
    "import integrations.dramatiq_app as app\n"
    "def send(n):\n"
    "    app.add.send(n, 0)\n" + PRODUCER_LOOP + "app.add.broker.close()\n"
)
#: Dramatiq's exit status when one of its worker processes was killed (``RET_KILLED``).
DRAMATIQ_KILLED = 1


def start_fleet(
    children: Children, env: dict[str, str], logs: Path, name: str, processes: int
) -> subprocess.Popen[bytes]:
    command = [
        sys.executable, "-m", "dramatiq", "integrations.dramatiq_app",
        "--processes", str(processes), "--threads", "2",
    ]  # fmt: skip
    return children.start(command, env=env, cwd=ROOT, log=logs / f"{name}.log", group=True)


def dramatiq_number(line: str) -> str | None:
    words = line.split()  # the app's "add X Y X+Y"
    return words[1] if words[0] == "add" else None


def test_dramatiq_fleets_survive_the_loss_of_the_broker_process(
    children: Children, tmp_path: Path, seaweedfs_namespace: Namespace
) -> None:
    namespace = seaweedfs_namespace
    results, logs = tmp_path / "results", tmp_path / "logs"
    env = base_env(results) | {"OBJQ_URL": namespace.url, "OBJQ_LEASE_SECONDS": str(LEASE_SECONDS)}
    started = time.monotonic()

    # Given a Dramatiq fleet whose worker processes elected a broker, a second fleet, and two
    # producers sending single messages
    first = start_fleet(children, env, logs, "fleet-1", processes=4)
    holder = wait_for(
        Guard(first).until(lambda: find_holder(namespace, [first.pid])),
        START_TIMEOUT_SECONDS,
        "the first fleet to elect a broker",
    )
    assert holder.pid != first.pid, "the broker should be in a worker process"
    second = start_fleet(children, env, logs, "fleet-2", processes=2)
    producers = start_producers(children, DRAMATIQ_PRODUCER, env, logs)
    guard = Guard(second, *producers.processes)

    def ran() -> Counter[str]:
        return ran_numbers(results, dramatiq_number)

    wait_for(
        guard.until(lambda: len(ran()) >= DONE_BEFORE_KILL),
        START_TIMEOUT_SECONDS,
        "messages to run through the broker",
        progress=lambda: f"{len(ran())} ran",
    )

    # When the worker process serving the broker is killed (Dramatiq then stops its fleet)
    os.kill(holder.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    successor = wait_for(
        guard.until(lambda: namespace.successor(holder.record.epoch)),
        TAKEOVER_TIMEOUT_SECONDS,
        "another process to take over the broker",
    )
    took = time.monotonic() - killed_at
    first_status = first.wait(timeout=STOP_TIMEOUT_SECONDS)  # its fleet got out, broker or not
    sent_at_takeover = len(producers.sent())
    wait_for(
        guard.until(lambda: len(producers.sent()) >= sent_at_takeover + SENT_AFTER_TAKEOVER),
        TAKEOVER_TIMEOUT_SECONDS,
        "producing to go on after the takeover",
    )
    producers.stop()

    # Then every message whose send returned runs, and nothing is left behind
    sent = producers.sent()
    wait_until_all_ran(sent, ran, Guard(second), namespace, DRAMATIQ_QUEUES)
    assert stop_gracefully(second, "the second fleet") == 0
    assert first_status == DRAMATIQ_KILLED
    assert producers.failed() == [], "sends failed while the broker moved"
    assert set(ran()) <= sent, "a message ran that was never sent"
    assert namespace.dead(*DRAMATIQ_QUEUES) == 0
    assert namespace.broker() is None, "the last broker did not resign when its process stopped"
    print(
        f"\ndramatiq: broker pid {holder.pid} (epoch {holder.record.epoch}) killed; epoch "
        f"{successor.epoch} after {took:.1f} s; {len(sent)} sent, slowest send "
        f"{producers.slowest_send():.2f} s, {sum(n - 1 for n in ran().values())} ran twice; "
        f"{time.monotonic() - started:.0f} s"
    )


# --- Celery ------------------------------------------------------------------------------------

CELERY_QUEUE = "celery"
#: Every fifth message retries itself twice: the retries are published by the pool's children.
CELERY_PRODUCER = (
    "import integrations.celery_app as app\n"
    "def send(n):\n"
    "    if n % 5 == 0:\n"
    "        app.retried.apply_async((n,))\n"
    "    else:\n"
    "        app.add.apply_async((n, 0))\n" + PRODUCER_LOOP
)
#: Pool children are replaced this often, so most are forked from a main process that is in
#: the election by then.
TASKS_PER_CHILD = 10
#: What a worker's log says when a pool child died of a signal, and when a pool child became
#: the broker.
CHILD_KILLED = re.compile(r"'ForkPoolWorker-[0-9]+' pid:[0-9]+ exited with 'signal ([0-9]+)")
CHILD_BROKER = re.compile(r"ForkPoolWorker-[0-9]+\] broker of ")


def start_celery_worker(
    children: Children, env: dict[str, str], logs: Path, name: str
) -> subprocess.Popen[bytes]:
    command = [
        sys.executable, "-m", "celery", "-A", "integrations.celery_app", "worker",
        "--pool", "prefork", "--concurrency", "2", "--max-tasks-per-child", str(TASKS_PER_CHILD),
        "--hostname", f"{name}@%h", "--loglevel", "INFO",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
    ]  # fmt: skip
    return children.start(command, env=env, cwd=ROOT, log=logs / f"{name}.log", group=True)


def celery_number(line: str) -> str | None:
    words = line.split()  # the app's "add X Y X+Y" and "retried N after RETRIES"
    if words[0] == "add" or (words[0] == "retried" and words[2:] == ["after", "2"]):
        return words[1]
    return None


def forked_since(holder: Holder) -> set[int]:
    """The children the broker's process forked after it took the broker (it served then)."""
    return {
        pid
        for pid in descendants(holder.pid) - {holder.pid}
        if (start := started_at(pid)) is not None and start > holder.record.since
    }


class LinksInPoolChildren:
    """Finds pool children (processes below ``mains``) with a connection of their own to the
    recorded broker. A child shares the sockets its parent had when it forked; only a client
    end its parent does not hold is one it opened itself."""

    def __init__(self, namespace: Namespace, mains: list[int]) -> None:
        self.namespace = namespace
        self.mains = mains
        self.seen: set[int] = set()

    def look(self) -> None:
        record = self.namespace.broker()
        if record is None:
            return
        client_ends = socket_inodes(record.address, listening=False)
        for main in self.mains:
            tree = descendants(main)
            for pid in tree - {main}:
                parent = parent_of(pid)
                if parent is None or parent not in tree:
                    continue  # its parent died since (it was killed): nothing to compare with
                if (links(pid) - links(parent)) & client_ends:
                    self.seen.add(pid)


def test_celery_workers_survive_the_loss_of_the_broker_process(
    children: Children, tmp_path: Path, seaweedfs_namespace: Namespace
) -> None:
    namespace = seaweedfs_namespace
    results, logs = tmp_path / "results", tmp_path / "logs"
    env = base_env(results) | {
        "CELERY_BROKER_URL": f"objq+{namespace.url}",
        "CELERY_VISIBILITY_TIMEOUT": str(LEASE_SECONDS),
    }
    started = time.monotonic()

    # Given two prefork workers whose main processes elected a broker, and two producers
    workers = [start_celery_worker(children, env, logs, name) for name in ("one", "two")]
    mains = [w.pid for w in workers]
    wait_for(
        Guard(*workers).until(lambda: find_holder(namespace, mains)),
        START_TIMEOUT_SECONDS,
        "the workers to elect a broker",
    )
    producers = start_producers(children, CELERY_PRODUCER, env, logs)
    links_in_children = LinksInPoolChildren(namespace, mains)
    guard = Guard(*workers, *producers.processes)
    guard.looks.append(links_in_children.look)

    def ran() -> Counter[str]:
        return ran_numbers(results, celery_number)

    # ... and pool children, forked by the broker's process since it took the role, at work
    forked: set[int] = set()

    def flowing() -> Holder | None:
        holder = find_holder(namespace, mains)
        if holder is None:
            return None
        forked.update(forked_since(holder))
        return holder if len(ran()) >= DONE_BEFORE_KILL and forked else None

    holder = wait_for(
        guard.until(flowing),
        START_TIMEOUT_SECONDS,
        "tasks to run in pool children forked from the broker's process",
        interval=0.25,
        progress=lambda: f"{len(ran())} ran; broker {find_holder(namespace, mains)}",
    )
    victim = next(w for w in workers if holder.pid in descendants(w.pid))

    # When the process serving the broker is killed (a main process takes its pool children
    # with it: Celery asks the kernel to SIGKILL them when their parent dies)
    os.kill(holder.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    if holder.pid == victim.pid:
        guard.processes.remove(victim)
    successor = wait_for(
        guard.until(lambda: namespace.successor(holder.record.epoch)),
        TAKEOVER_TIMEOUT_SECONDS,
        "another process to take over the broker",
    )
    took = time.monotonic() - killed_at
    sent_at_takeover = len(producers.sent())
    wait_for(
        guard.until(lambda: len(producers.sent()) >= sent_at_takeover + SENT_AFTER_TAKEOVER),
        TAKEOVER_TIMEOUT_SECONDS,
        "producing to go on after the takeover",
        interval=0.25,
    )
    producers.stop()

    # Then every message whose send returned runs, and nothing is left behind
    sent = producers.sent()
    guard.processes = [w for w in workers if w.poll() is None]
    wait_until_all_ran(sent, ran, guard, namespace, (CELERY_QUEUE,))
    for worker in guard.processes:
        assert stop_gracefully(worker, "a worker") == 0
    assert producers.failed() == [], "sends failed while the broker moved"
    assert set(ran()) <= sent, "a message ran that was never sent"
    assert namespace.dead(CELERY_QUEUE) == 0
    log_text = "\n".join(path.read_text(errors="replace") for path in logs.glob("*.log"))
    final = namespace.broker()
    print(
        f"\ncelery: broker pid {holder.pid} (main process: {holder.pid == victim.pid}, epoch "
        f"{holder.record.epoch}) killed after forking {len(forked)} pool children; epoch "
        f"{successor.epoch} after {took:.1f} s; {len(sent)} sent, slowest send "
        f"{producers.slowest_send():.2f} s, {sum(n - 1 for n in ran().values())} ran twice; "
        f"{time.monotonic() - started:.0f} s. Pool children: {len(links_in_children.seen)} "
        f"opened connections of their own, {len(CHILD_BROKER.findall(log_text))} became the "
        f"broker, killed by signals {CHILD_KILLED.findall(log_text)}; "
        f"broker left recorded: {final.epoch if final else None}"
    )
    assert CHILD_BROKER.findall(log_text) == [], "a forked pool child took the broker role"
    assert CHILD_KILLED.findall(log_text) == [], "a pool child died of a signal"
