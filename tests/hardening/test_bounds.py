"""Every value that enters the state is bounded where it enters: the API cuts or refuses it,
the broker's decoder refuses it, and either way the namespace stays readable by every other
process. Real stores and a real broker; each case is one a probe found getting through."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from objq_broker import Queue, builders
from objq_broker.broker.client import BrokerLink
from objq_broker.broker.elected import ElectedCommitter
from objq_broker.builders import Delivery
from objq_broker.errors import ConfigurationError, ObjqError
from objq_broker.model.checks import MAX_CLAIM, MAX_ERROR_TEXT, MAX_IDENTIFIER
from objq_broker.model.ops import Claim, Nack, Session

HUGE = 70 * 1024 * 1024  # past the 64 MiB every reader accepts by default


def test_an_error_longer_than_a_state_holds_is_cut_and_the_namespace_stays_readable(
    tmp_path: Path,
) -> None:
    url = (tmp_path / "ns").as_uri()
    with Queue(url, broker="off") as queue:
        queue.enqueue("q", b"x", max_attempts=1)
        (delivery,) = queue.claim("q")
        # When a caller nacks with an error of 70 MB
        assert queue.nack(delivery, error="S" + "E" * HUGE + "T") == "dead"

    # Then every other process still reads the namespace, and the error kept its ends
    with Queue(url, broker="off") as other:
        (dead,) = other.dead_letters("q")
        assert dead.error is not None and len(dead.error) <= MAX_ERROR_TEXT
        assert dead.error.startswith("SE") and dead.error.endswith("ET")
        assert "characters cut" in dead.error
        assert other.stats("q").dead == 1
    assert (tmp_path / "ns" / "state.json").stat().st_size < 1024 * 1024


@pytest.mark.parametrize(
    ("token", "found"),
    [("t" * (MAX_IDENTIFIER + 1), "characters in all"), ("", "''")],
)
def test_a_lease_token_out_of_bounds_is_refused_by_the_api(token: str, found: str) -> None:
    with Queue(f"memory://bounds-token-{len(token)}", broker="off") as queue:
        queue.enqueue("q", b"x")
        (delivery,) = queue.claim("q")
        forged = Delivery(delivery.job, token)
        for settle in (queue.ack, queue.nack):
            with pytest.raises(ConfigurationError, match=f"token: .*{found}"):
                settle(forged)
        queue.ack(delivery)  # the real holder's lease was untouched
        stats = queue.stats("q")
        assert (stats.ready, stats.in_flight, stats.dead) == (0, 0, 0)


def test_a_refused_long_queue_name_gives_a_short_error() -> None:
    with (
        Queue("memory://bounds-name", broker="off") as queue,
        pytest.raises(ConfigurationError) as refused,
    ):
        queue.enqueue("n" * 10_000, b"x")
    message = str(refused.value)
    assert len(message) < 600, len(message)
    assert "10000 characters in all" in message


def elected(queue: Queue) -> ElectedCommitter:
    committer = queue.committer
    assert isinstance(committer, ElectedCommitter)
    return committer


HOSTILE_SESSIONS: dict[str, Callable[[str], list[Any]]] = {
    "jitter 1e308": lambda job: [Nack(job, "token", jitter=1e308)],
    "jitter -1e308": lambda job: [Nack(job, "token", jitter=-1e308)],
    "jitter 1e300": lambda job: [Nack(job, "token", jitter=1e300)],
    "jitter NaN": lambda job: [Nack(job, "token", jitter=math.nan)],
    "an error of 9 MB": lambda job: [Nack(job, "token", error="E" * 9_000_000)],
    "a lease token of 2 MB": lambda job: [Nack(job, "t" * 2_000_000)],
    "a claim of 200,000 tokens": lambda job: [
        Claim(["q"], [f"t{i}" for i in range(MAX_CLAIM * 2)], "owner")
    ],
}


@pytest.mark.parametrize("case", sorted(HOSTILE_SESSIONS))
def test_the_broker_refuses_a_value_out_of_bounds_and_serves_everyone_else(
    tmp_path: Path, case: str
) -> None:
    url = (tmp_path / "ns").as_uri()
    with Queue(url, broker="auto") as leader, Queue(url, broker="client") as good:
        leader.declare("q")
        good.enqueue("q", b"first")
        address = elected(leader).record.address  # type: ignore[union-attr]
        hostile = BrokerLink(address)
        try:
            session = Session("hostile-client", 1, HOSTILE_SESSIONS[case]("job"))
            with pytest.raises(ObjqError, match=r"(?i)expected"):
                hostile.apply(session, timeout=10)
        finally:
            hostile.close()
        for n in range(20):
            good.enqueue("q", f"job {n}".encode())
        assert leader.stats("q").ready == 21


def test_the_broker_refuses_a_session_number_past_64_bits(tmp_path: Path) -> None:
    url = (tmp_path / "ns").as_uri()
    with Queue(url, broker="auto") as leader:
        leader.declare("q")
        address = elected(leader).record.address  # type: ignore[union-attr]
        hostile = BrokerLink(address)
        try:
            with pytest.raises(ObjqError, match=r"(?i)expected"):
                hostile.apply(Session("c", 10**4000, [builders.declare("x", {})]), timeout=10)
        finally:
            hostile.close()
        assert "x" not in leader.queues()
