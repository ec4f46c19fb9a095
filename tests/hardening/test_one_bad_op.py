"""One bad operation fails alone: batches of good enqueues with every kind of operation mixed in,
each refused for its own reason (a lost lease, a missing job, queue or run, a setting out of
range, a state it would make too large), commit every good one. Hypothesis draws the mixes;
each runs on a real file store, in one commit."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from objq_broker import Queue, builders
from objq_broker.builders import Delivery
from objq_broker.model import ops as model_ops
from objq_broker.model.values import StagedRun

LIMIT = 256 * 1024
OPTIONS: dict[str, Any] = {"max_state_bytes": LIMIT, "inline_state_bytes": LIMIT, "spill_at": None}

#: Each makes an operation refused for its own reason, given a delivery the batch does not hold.
BAD: dict[str, Callable[[Delivery], Any]] = {
    "ack with a stale token": lambda d: builders.ack(Delivery(d.job, "stale")),
    "nack with a stale token": lambda d: builders.nack(Delivery(d.job, "stale"), error="x"),
    "heartbeat of a job never claimed": lambda d: builders.heartbeat([Delivery(d.job, "t")]),
    "release with a stale token": lambda d: builders.release([Delivery(d.job, "stale")]),
    "purge of a queue never declared": lambda d: builders.purge("nowhere"),
    "delete of a queue never declared": lambda d: builders.delete_queue("nowhere"),
    "retry of dead letters that do not exist": lambda d: builders.retry_dead("q", ["ghost"]),
    "purge of dead letters that do not exist": lambda d: builders.purge_dead("q", ["ghost"]),
    "strict claim of a queue never declared": lambda d: builders.claim(
        ["nowhere"], 1, owner="o", strict=True
    ),
    "staged runs that are not stored": lambda d: builders.enqueue_runs(
        "q",
        [StagedRun("staging/g/run.json", "staging/g/b.json", "ready", 1, (0, 0), (0, 0), 0.0)],
        write_id=f"w-{d.id}",
    ),
    "an enqueue past max_state_bytes": lambda d: builders.enqueue("q", [b"b" * 100] * 4000),
    "settings of a queue never declared": lambda d: model_ops.Configure(
        "nowhere", {"max_attempts": 3}
    ),
    "a look-up of a job that does not exist": lambda d: builders.list_jobs("nowhere", None, 1),
}


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    mix=st.lists(st.one_of(st.just("good"), st.sampled_from(sorted(BAD))), min_size=2, max_size=30)
)
def test_every_good_operation_of_a_mixed_batch_lands(tmp_path_factory: Any, mix: list[str]) -> None:
    url = tmp_path_factory.mktemp("ns").as_uri()
    with Queue(url, broker="off", **OPTIONS) as queue:
        queue.declare("q")
        queue.enqueue("held", b"x")
        (held,) = queue.claim("held")
        built = [
            builders.enqueue("q", [f"good {n}".encode()]) if kind == "good" else BAD[kind](held)
            for n, kind in enumerate(mix)
        ]
        futures: list[Future[Any]] = [queue.submit(op) for op in built]
        for kind, future in zip(mix, futures, strict=True):
            try:
                future.result(timeout=60)
            except Exception as exc:
                assert kind != "good", f"a good enqueue failed: {exc!r}"
        good = mix.count("good")
        assert queue.stats("q").ready == good
        assert queue.stats("held").in_flight == 1  # no bad settlement touched the real lease
        queue.ack(held)
    with Queue(url, broker="off", max_state_bytes=LIMIT) as reader:  # still readable
        payloads = sorted(job.payload for _, job in reader.jobs("q"))
        assert payloads == sorted(
            f"good {n}".encode() for n, kind in enumerate(mix) if kind == "good"
        )


def test_the_broker_decoder_refuses_every_hostile_value_of_every_operation() -> None:
    """Every operation type, with a value out of bounds, decoded as a broker decodes a
    session: refused, naming the field."""
    hostile = [
        model_ops.Ack("j", "t" * 2000),
        model_ops.Nack("j", "t", jitter=1e300),
        model_ops.NoteOutcome("j", "q", "t", "failed", error="e" * 10_000),
        model_ops.Claim(["q"], ["t"] * 200_000, "o"),
        model_ops.Heartbeat([("j", "")]),
        model_ops.Release([("", "t")]),
        model_ops.Purge("a/b"),
        model_ops.DeleteQueue(""),
        model_ops.RetryDead("q", ["i" * 2000]),
        model_ops.PurgeDead("q", [""]),
        model_ops.FindJob("j" * 2000),
        model_ops.ListJobs("q", None, -1),
        model_ops.Session("c", -1, []),
        model_ops.Session("c", 0, [model_ops.Nothing()] * 5001),
    ]
    for op in hostile:
        session = op if isinstance(op, model_ops.Session) else model_ops.Session("c", 1, [op])
        data = msgspec.json.encode(session)
        try:
            msgspec.json.decode(data, type=model_ops.Session)
        except msgspec.ValidationError as exc:
            assert "Expected" in str(exc), exc
        else:
            raise AssertionError(f"{op!r} decoded")
