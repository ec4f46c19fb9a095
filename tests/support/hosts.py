"""Test hosts on one machine: network namespaces joined by a bridge, each with an address, its
own loopback, optional latency (``tc netem``), and links that can be cut and healed.

Needs root and iproute2's ``ip`` (and ``tc`` with the kernel's netem for latency: some kernels
have no netem, "Specified qdisc kind is unknown"); :func:`make_hosts` skips the test, saying
why, where they are missing. Every host sees the machine's file system, so a
``file://`` store in the test's folder is storage that no partition cuts.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import pytest

#: The bridge's network: the machine is .1, the hosts .2 and up.
SUBNET = "10.213.77"


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@dataclass
class Host:
    name: str
    namespace: str
    address: str
    cut: set[str] = field(default_factory=set)

    def command(self, command: Sequence[str]) -> list[str]:
        """``command`` run inside this host."""
        return ["ip", "netns", "exec", self.namespace, *command]

    def cut_from(self, others: Sequence[Host]) -> None:
        """Drop everything this host sends to ``others`` (a partition: neither side gets an
        answer from the other; storage, on the machine's file system, stays)."""
        for other in others:
            ip("-n", self.namespace, "route", "add", "blackhole", f"{other.address}/32")
            self.cut.add(other.address)

    def heal(self) -> None:
        for address in sorted(self.cut):
            ip("-n", self.namespace, "route", "del", "blackhole", f"{address}/32")
        self.cut.clear()


def make_hosts(names: Sequence[str], *, latency_ms: float = 0.0) -> Iterator[list[Host]]:
    """Hosts named ``names``, torn down afterwards (a fixture's body)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("test hosts need root and iproute2's ip (network namespaces)")
    if latency_ms and shutil.which("tc") is None:
        pytest.skip("latency between test hosts needs iproute2's tc")
    tag = secrets.token_hex(2)
    bridge = f"objqbr{tag}"
    hosts: list[Host] = []
    try:
        try:  # what a machine may not allow even root: a bridge, a network namespace
            ip("link", "add", bridge, "type", "bridge")
            ip("netns", "add", f"objq-{tag}-probe")
            ip("netns", "del", f"objq-{tag}-probe")
        except subprocess.CalledProcessError as exc:
            pytest.skip(f"cannot make test hosts here: {exc.stderr.decode().strip()}")
        ip("addr", "add", f"{SUBNET}.1/24", "dev", bridge)
        ip("link", "set", bridge, "up")
        for number, name in enumerate(names, start=2):
            host = Host(name, f"objq-{tag}-{name}", f"{SUBNET}.{number}")
            ip("netns", "add", host.namespace)
            hosts.append(host)
            outside, inside = f"vo{tag}{name}"[:15], f"vi{tag}{name}"[:15]
            ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            ip("link", "set", inside, "netns", host.namespace)
            ip("link", "set", outside, "master", bridge)
            ip("link", "set", outside, "up")
            ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", inside)
            ip("-n", host.namespace, "link", "set", inside, "up")
            ip("-n", host.namespace, "link", "set", "lo", "up")
            if latency_ms:
                delayed = subprocess.run(
                    [
                        *host.command(["tc", "qdisc", "add", "dev", inside, "root", "netem"]),
                        "delay",
                        f"{latency_ms:g}ms",
                    ],
                    capture_output=True,
                    timeout=30,
                    check=False,
                )
                if delayed.returncode != 0:
                    pytest.skip(f"tc netem: {delayed.stderr.decode().strip()}")
        yield hosts
    finally:
        for host in hosts:
            subprocess.run(["ip", "netns", "del", host.namespace], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True, check=False)
