"""The elected broker across hosts, for real: network namespaces stand in for hosts, each with
its own address and loopback (tests/support/hosts.py); storage is a folder all of them see.

* With the default settings (every broker on its own host's loopback), processes on two hosts
  do not take the role from each other in turn: the second host commits directly.
* Secured across hosts (a token, ``broker_listen=0.0.0.0``), a partition that cuts the broker
  off from its clients but not from storage makes a client take over; the old broker is fenced
  on its next write; healing the partition loses and doubles nothing.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker.test_election import ROOT, archived, lines, record, stop_producers_and_drain
from tests.support.hosts import Host, make_hosts
from tests.support.processes import Children
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

BROKER_PORT = 7700
TOKEN = "a-long-random-token-for-the-test-hosts"


@pytest.fixture
def hosts() -> Iterator[list[Host]]:
    yield from make_hosts(["a", "b", "c"])


def start(
    children: Children, host: Host, role: str, url: str, folder: Path, *, secured: bool
) -> subprocess.Popen[bytes]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    if secured:
        env |= {
            "OBJQ_BROKER_LISTEN": f"0.0.0.0:{BROKER_PORT}",
            "OBJQ_BROKER_ADVERTISE": f"{host.address}:{BROKER_PORT}",
            "OBJQ_BROKER_TOKEN": TOKEN,
        }
    command = host.command([sys.executable, "-m", "tests.broker.actor", role, url, str(folder)])
    return children.start(command, env=env, cwd=ROOT, log=folder / f"{host.name}.log")


def pid_log(folder: Path, process: subprocess.Popen[bytes]) -> str:
    path = next(folder.glob(f"{process.pid}.*"), None)
    return "" if path is None else path.read_text()


def test_with_default_settings_two_hosts_never_take_the_role_in_turn(
    children: Children, tmp_path: Path, hosts: list[Host]
) -> None:
    url = (tmp_path / "store").as_uri()
    folder = tmp_path / "actors"
    folder.mkdir()
    _, b, c = hosts
    producer = start(children, b, "producer", url, folder, secured=False)
    wait_for(lambda: record(url) is not None, 30, "the first host's process to take the role")
    worker = start(children, c, "worker", url, folder, secured=False)
    wait_for(lambda: len(lines(folder, "done")) >= 20, 30, "the other host to work")

    first = record(url)
    assert first is not None
    time.sleep(8.0)  # longer than the takeover time, several times over
    assert record(url) == first, "the role moved: the hosts take it from each other"
    assert "role direct" in pid_log(folder, worker)
    assert "role leader" in pid_log(folder, producer)
    stop_producers_and_drain(children, url, folder, [producer, worker])


def test_a_partition_from_its_clients_moves_the_broker_and_loses_nothing(
    children: Children, tmp_path: Path, hosts: list[Host]
) -> None:
    url = (tmp_path / "store").as_uri()
    folder = tmp_path / "actors"
    folder.mkdir()
    a, b, c = hosts
    # Given a broker on host a, secured, and a producer and a worker on hosts b and c
    standby = start(children, a, "standby", url, folder, secured=True)
    wait_for(lambda: "role leader" in pid_log(folder, standby), 30, "host a to take the role")
    first = record(url)
    assert first is not None and first.address == f"{a.address}:{BROKER_PORT}" and first.secured
    processes = [
        standby,
        start(children, b, "producer", url, folder, secured=True),
        start(children, c, "worker", url, folder, secured=True),
    ]
    wait_for(lambda: len(lines(folder, "done")) >= 20, 30, "jobs done through host a")
    assert all("role follower" in pid_log(folder, p) for p in processes[1:])

    # When host a is cut off from b and c (not from storage)
    a.cut_from([b, c])
    try:
        wait_for(
            lambda: (
                (r := record(url)) is not None and r.epoch > first.epoch and r.host != first.host
            ),
            30,
            "a client to take over from the cut-off broker",
        )
        # Then the old broker, made to write, is fenced at that write and steps down
        standby.send_signal(signal.SIGUSR1)
        wait_for(
            lambda: "role" in pid_log(folder, standby).split(f"role leader {first.epoch}")[-1],
            30,
            "the cut-off broker to be fenced",
        )
        before = len(lines(folder, "done"))
        wait_for(lambda: len(lines(folder, "done")) > before + 20, 30, "work to go on")
    finally:
        a.heal()

    # And once healed, every acknowledged enqueue is done, none twice
    time.sleep(3.0)
    stop_producers_and_drain(children, url, folder, processes)
    done = Counter(lines(folder, "done"))
    assert set(lines(folder, "enqueued")) <= set(done) | archived(url)
    assert [payload for payload, n in done.items() if n > 1] == []
