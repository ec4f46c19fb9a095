"""Nobody can replay or fence another client's sessions: the state keeps a hash of each client's
id, never the id, and a broker refuses a client id on any connection but the one that first
used it. Real broker, real links, a file store read as an attacker with the bucket would."""

from __future__ import annotations

from pathlib import Path

import pytest

from objq_broker import Queue, builders
from objq_broker.broker.client import BrokerLink
from objq_broker.broker.elected import ElectedCommitter
from objq_broker.engine.snapshot import Snapshot
from objq_broker.errors import AccessDenied
from objq_broker.model.ops import Session
from objq_broker.storage import open_store

VICTIM_JOBS = 40


def elected(queue: Queue) -> ElectedCommitter:
    committer = queue.committer
    assert isinstance(committer, ElectedCommitter)
    return committer


def test_a_session_under_an_id_read_from_the_state_drops_nothing(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/ns"
    with Queue(url, broker="auto") as leader, Queue(url, broker="client") as victim:
        leader.declare("q")
        victim.enqueue("q", b"first")
        address = elected(leader).record.address  # type: ignore[union-attr]

        # Given an attacker who reads every session mark the state (and the dashboard) shows
        marks = [client for client, _ in Snapshot.read(open_store(url)).broker_sessions()]
        assert marks and elected(victim).client_id not in marks
        attacker = BrokerLink(address)
        try:
            # When it sends a session far ahead under each of them
            for mark in marks:
                forged = Session(mark, 2**62, [builders.declare(f"x{len(mark)}", {})])
                attacker.apply(forged, timeout=5)
        finally:
            attacker.close()

        # Then the victim's next enqueues are applied, not answered as replays
        for n in range(VICTIM_JOBS):
            victim.enqueue("q", f"job {n}".encode())
        assert leader.stats("q").ready == VICTIM_JOBS + 1


def test_a_client_id_is_refused_on_any_connection_but_its_own(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/ns"
    with Queue(url, broker="auto") as leader, Queue(url, broker="client") as victim:
        leader.declare("q")
        victim.enqueue("q", b"first")
        address = elected(leader).record.address  # type: ignore[union-attr]
        stolen = elected(victim).client_id  # leaked, say, from the victim's memory

        attacker = BrokerLink(address)
        try:
            forged = Session(stolen, 2**62, [builders.purge("q")])
            with pytest.raises(AccessDenied, match="belongs to another connection"):
                attacker.apply(forged, timeout=5)
        finally:
            attacker.close()

        victim.enqueue("q", b"second")
        assert leader.stats("q").ready == 2
