"""Links that close while their broker stops leave every other link of the process answered.

libzmq sends each socket's connection events from the I/O thread that every link of a process
shares, and waits while nobody can take one: a link that closed its event reader before its
connection dropped (the broker stopping at that moment) once stopped that thread for good, and
from then on no link of the process was answered (test processes that ran many brokers saw it
as brokers "unanswered for seconds"). Run in a process of its own, since a failure leaves the
process's links dead."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

#: Rounds of a broker stopping while four links to it close; then a new link must be answered.
SCRIPT = textwrap.dedent(
    """
    import sys, threading
    from objq_broker.broker.client import BrokerLink
    from objq_broker.broker.server import BrokerServer
    from objq_broker.engine import Engine
    from objq_broker.errors import ObjqError
    from objq_broker.storage import MemoryStore

    def server():
        started = BrokerServer(Engine(MemoryStore()), listen="127.0.0.1:0")
        started.start()
        return started

    for round in range(40):
        broker = server()
        links = [BrokerLink(broker.address) for _ in range(4)]
        for link in links:
            link.hello(timeout=5)
        stopping = threading.Thread(target=broker.stop, kwargs={"grace": 0})
        stopping.start()
        for link in links:
            link.close()
        stopping.join()
        fresh, link = server(), None
        try:
            link = BrokerLink(fresh.address)
            link.hello(timeout=5)
        except ObjqError as exc:
            sys.exit(f"round {round}: a new link went unanswered: {exc}")
        finally:
            if link is not None:
                link.close()
            fresh.stop(grace=0)
    print("answered")
    """
)


@pytest.mark.timeout(240)
def test_links_closing_as_their_broker_stops_leave_new_links_answered() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=200, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "answered"
