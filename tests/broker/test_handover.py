"""A broker that closes hands over at once: it clears its record before it stops, and its
followers, told by their links that the connection closed, look at the record again instead
of waiting out the takeover time as they do for a broker that died. Real engines, a real
libzmq link between two queues of one folder."""

from __future__ import annotations

import time
from pathlib import Path

from objq_broker import Queue
from objq_broker.broker.elected import ElectedCommitter
from objq_broker.broker.settings import DEFAULT_TAKEOVER_SECONDS


def _role(queue: Queue) -> str:
    committer = queue.committer
    assert isinstance(committer, ElectedCommitter)
    return committer.role


def test_a_broker_that_closes_is_replaced_by_its_follower_at_once(tmp_path: Path) -> None:
    # Given a broker and a queue that follows it
    url = tmp_path.as_uri()
    leader = Queue(url, broker="auto")
    leader.declare("q")
    assert _role(leader) == "leader"
    with Queue(url, broker="auto") as follower:
        follower.enqueue("q", b"before")
        assert _role(follower).startswith("follower")

        # When the broker closes, and the follower sends its next operation
        leader.close()
        started = time.monotonic()
        follower.enqueue("q", b"after")
        took = time.monotonic() - started

        # Then the follower took over for it, well within the takeover time, and lost nothing
        assert _role(follower) == "leader"
        assert took < DEFAULT_TAKEOVER_SECONDS / 2, f"{took:.2f} s"
        assert follower.stats("q").ready == 2
