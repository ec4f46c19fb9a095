"""A process of an ``auto`` namespace, for the election tests: ``python -m tests.broker.actor
ROLE URL DIR``.

Every actor is a broker candidate (``broker="auto"``, a one-second takeover). It appends to
``DIR/<pid>.<role>`` what it did, one line each, flushed at once so a SIGKILL loses nothing it
reported: ``enqueued <payload>`` once an enqueue returned (durable), ``done <payload>`` once a
job's ack returned, ``role <role>`` whenever its place in the election changes. Roles:
``producer`` (single enqueues, as a web handler), ``worker`` (claim one, ack it) and ``standby``
(reads the queue's counts now and then: a candidate with little to do). SIGUSR1 makes any
actor enqueue one job (``<pid>-poke-<n>``): a write by a standby, on demand.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

from objq_broker import Queue
from objq_broker.broker.elected import ElectedCommitter
from objq_broker.errors import ObjqError

TAKEOVER_SECONDS = 1.0
LEASE_SECONDS = 3.0


def main(role: str, url: str, folder: Path) -> None:
    stop, poke = threading.Event(), threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGUSR1, lambda *_: poke.set())  # enqueue one job, whatever the role
    queue = Queue(url, broker="auto", broker_takeover_seconds=TAKEOVER_SECONDS)
    log = (folder / f"{os.getpid()}.{role}").open("a", buffering=1)
    queue.declare("q")
    committer = queue.committer
    assert isinstance(committer, ElectedCommitter)
    seen_role = ""
    n = 0
    while not stop.is_set():
        try:
            n += 1
            if poke.is_set():
                poke.clear()
                queue.enqueue("q", f"{os.getpid()}-poke-{n}".encode())
                log.write(f"enqueued {os.getpid()}-poke-{n}\n")
            act(role, queue, log, n)
        except ObjqError as exc:
            log.write(f"error {type(exc).__name__}: {exc}\n")
            time.sleep(0.1)
        role_now = committer.role.split(" ")[0]
        if role_now != seen_role:
            seen_role = role_now
            epoch = committer.record.epoch if committer.record is not None else None
            log.write(f"role {role_now} {epoch}\n")
    queue.close()
    log.write("closed\n")


def act(role: str, queue: Queue, log: object, n: int) -> None:
    write = log.write  # type: ignore[attr-defined]
    if role == "producer":
        payload = f"{os.getpid()}-{n}"
        queue.enqueue("q", payload.encode())
        write(f"enqueued {payload}\n")
        time.sleep(0.005)
    elif role == "worker":
        for delivery in queue.claim("q", 1, lease=LEASE_SECONDS, timeout=0.5):
            queue.ack(delivery)
            write(f"done {delivery.payload.decode()}\n")
    else:
        queue.stats("q")
        time.sleep(0.2)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], Path(sys.argv[3]))
