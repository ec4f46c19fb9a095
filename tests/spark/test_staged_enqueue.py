"""Enqueueing staged bodies objects and staged runs in one commit (the core of the Spark
writer), and the Dramatiq/Celery messages it builds. No Spark needed."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Literal

import dramatiq
import msgspec
import pytest
from kombu.utils.json import loads as kombu_loads

from objq_broker import ConfigurationError, Queue
from objq_broker.engine import STATE_KEY
from objq_broker.model.bodies import encode_bodies
from objq_broker.model.encoding import decode_state
from objq_broker.model.messages import celery_message, describe, dramatiq_message
from objq_broker.model.producing import enqueue_staged
from objq_broker.model.records import Job
from objq_broker.model.runs import MAX_RUN_JOBS, build_run
from objq_broker.model.state import QueueState
from objq_broker.model.values import StagedBodies, StagedRun
from objq_broker.storage import MemoryStore
from tests.support.clock import ManualClock


def _stage(store: MemoryStore, key: str, bodies: list[str]) -> StagedBodies:
    store.put(key, encode_bodies([(body, False) for body in bodies]))
    return StagedBodies(key, len(bodies))


def test_staged_rows_become_jobs_that_read_their_bodies_and_free_them() -> None:
    # Given two staged objects
    store = MemoryStore("staged-basic")
    staged = [
        _stage(store, "staging/w1/0.json", ["a", "b"]),
        _stage(store, "staging/w1/1.json", ["c"]),
    ]
    with Queue(store=store) as queue:
        # When they are enqueued in one commit
        assert queue.enqueue_staged("q", staged, write_id="w1") == 3
        writes = queue.metrics().state_writes
        # Then the jobs come out in order with their payloads
        deliveries = queue.claim("q", 3)
        assert [d.payload for d in deliveries] == [b"a", b"b", b"c"]
        assert writes == 1
        # And each object is deleted once its last job finished, not before
        queue.ack(deliveries[0])
        assert store.list("staging/") == ["staging/w1/0.json", "staging/w1/1.json"]
        queue.ack(deliveries[1])
        queue.ack(deliveries[2])
        queue.flush()  # (the deletes run in the background)
        assert store.list("staging/") == []


def test_a_repeated_write_id_adds_nothing() -> None:
    store = MemoryStore("staged-replay")
    staged = [_stage(store, "staging/w2/0.json", ["a", "b"])]
    with Queue(store=store) as queue:
        assert queue.enqueue_staged("q", staged, write_id="w2") == 2
        # A retried commit (new job ids, same write id) is recognised
        assert queue.enqueue_staged("q", staged, write_id="w2") is None
        assert queue.stats("q").ready == 2
        # Another write id naming an object already referenced is refused
        with pytest.raises(ConfigurationError, match="already refer"):
            queue.enqueue_staged("q", staged, write_id="w3")
        assert queue.stats("q").ready == 2


def test_refused_staged_enqueue_leaves_the_state_unchanged() -> None:
    state = QueueState()
    bad = [StagedBodies("staging/x/0.json", 2, priorities=(1,))]
    with pytest.raises(ConfigurationError, match="1 priorities"):
        enqueue_staged(state, "q", bad, ["i1", "i2"], 0.0, write_id="x")
    with pytest.raises(ConfigurationError, match="3 job ids"):
        enqueue_staged(state, "q", [StagedBodies("k", 2)], ["a", "b", "c"], 0.0, write_id="x")
    assert not state.dirty
    assert state.jobs == {}
    assert state.doc.bodies == {}


def test_per_row_priorities_and_delays() -> None:
    state = QueueState()
    staged = [StagedBodies("k", 3, priorities=(5, 0, 1), delays=(0.0, 0.0, 60.0))]
    enqueue_staged(state, "q", staged, ["a", "b", "c"], 100.0, write_id="w")
    claimed = state.claim("q", ["t1", "t2", "t3"], "me", 100.0)
    assert [job.id for job in claimed] == ["b", "a"]  # c waits its delay
    assert state.jobs["c"].visible_at == 160.0


def test_dramatiq_message_is_what_dramatiq_decodes() -> None:
    payload = dramatiq_message("default", "add", [1, 2], {"z": 3}, message_id="m-1")
    message = dramatiq.Message.decode(payload)
    assert (message.queue_name, message.actor_name, message.args, message.kwargs) == (
        "default",
        "add",
        (1, 2),
        {"z": 3},
    )
    assert message.message_id == "m-1"
    info = describe(payload)
    assert info is not None
    assert (info.kind, info.task, info.message_id) == ("dramatiq", "add", "m-1")


def test_celery_message_carries_protocol_two_in_kombus_envelope() -> None:
    payload = celery_message("celery", "tasks.add", [1, 2], {"z": 3}, task_id="t-1")
    envelope = kombu_loads(payload)
    assert envelope["headers"]["task"] == "tasks.add"
    assert envelope["headers"]["id"] == "t-1"
    assert envelope["properties"]["delivery_info"]["routing_key"] == "celery"
    args, kwargs, embed = json.loads(base64.b64decode(envelope["body"]))
    assert (args, kwargs) == ([1, 2], {"z": 3})
    assert set(embed) == {"callbacks", "errbacks", "chain", "chord"}
    info = describe(payload)
    assert info is not None
    assert (info.kind, info.task, info.message_id) == ("celery", "tasks.add", "t-1")


def test_describe_knows_celery_protocol_one_and_ignores_other_payloads() -> None:
    body = base64.b64encode(json.dumps({"task": "old.task", "id": "o-1"}).encode()).decode()
    legacy = json.dumps({"body": body, "properties": {"body_encoding": "base64"}}).encode()
    info = describe(legacy)
    assert info is not None
    assert (info.kind, info.task, info.message_id) == ("celery", "old.task", "o-1")
    assert describe(b"plain bytes") is None
    assert describe(b'{"a": 1}') is None
    assert describe(b"{not json") is None
    with pytest.raises(ConfigurationError, match="list of arguments"):
        dramatiq_message("q", "a", "not a list")  # a str is a Sequence: refused at run time


def test_celery_message_is_consumed_through_the_objq_kombu_transport(tmp_path: Path) -> None:
    from kombu import Connection

    import objq_broker.kombu  # noqa: F401  (registers the objq transport)

    url = (tmp_path / "store").as_uri()
    with Queue(url) as queue:
        queue.enqueue("celery", celery_message("celery", "tasks.add", [2, 3], task_id="t-9"))
    with Connection(f"objq+{url}") as connection:
        simple = connection.SimpleQueue("celery")
        try:
            message = simple.get(timeout=10)
            assert (message.headers["task"], message.headers["id"]) == ("tasks.add", "t-9")
            args, kwargs, _ = message.decode()
            assert (args, kwargs) == ([2, 3], {})
            message.ack()
        finally:
            simple.close()


def _stage_runs(
    store: MemoryStore, name: str, rows: list[tuple[str, int, float]]
) -> list[StagedRun]:
    """Stage ``rows`` (body, priority, delay) as a Spark task does: a bodies object and the
    runs of the jobs that refer to it, numbered from 0."""
    bodies = f"{name}.json"
    store.put(bodies, encode_bodies([(body, False) for body, _, _ in rows]))
    kinds: dict[Literal["ready", "timed"], list[Job]] = {"ready": [], "timed": []}
    for index, (body, priority, delay) in enumerate(rows):
        jobs = kinds["timed" if delay else "ready"]
        jobs.append(
            Job(
                id=f"{name}-{body}",
                queue="q",
                body="",
                seq=len(jobs),
                priority=priority,
                enqueued_at=1_000_000.0,
                visible_at=1_000_000.0 + delay,
                max_attempts=3,
                ref=f"{bodies}#{index}",
            )
        )
    staged = []
    for kind, jobs in kinds.items():
        if jobs:
            ref, data = build_run(f"{name}.{kind}.json", "q", kind, jobs)
            store.put(ref.key, data)
            last = ref.last or ref.next
            staged.append(StagedRun(ref.key, bodies, kind, ref.count, ref.next, last, ref.oldest))
    return staged


def test_staged_runs_take_their_place_in_the_queue_without_entering_the_head() -> None:
    store = MemoryStore("staged-runs")
    clock = ManualClock()
    with Queue(store=store, clock=clock) as queue:
        queue.enqueue("q", b"before")
        runs = _stage_runs(store, "staging/w/0", [("x", 1, 0.0), ("y", 0, 0.0), ("z", 0, 60.0)])
        runs += _stage_runs(store, "staging/w/1", [("w", 0, 0.0)])
        assert queue.enqueue_runs("q", runs, write_id="w") == 4
        queue.enqueue("q", b"after")
        # One reference per run in the head; none of the write's jobs
        blob = store.read(STATE_KEY)
        assert blob is not None
        doc = decode_state(blob.data, "test")
        assert [ref.key for ref in doc.runs["q"]] == [run.key for run in runs]
        assert sorted(job.payload for job in doc.jobs) == [b"after", b"before"]
        assert queue.stats("q").ready == 5 and queue.stats("q").delayed == 1
        # Claimed by priority, then in the order they were enqueued: the write's rows after
        # what came before it, in row order, and before what came after
        claimed = queue.claim("q", 10)
        assert [d.payload for d in claimed] == [b"before", b"y", b"w", b"after", b"x"]
        for delivery in claimed:
            queue.ack(delivery)
        clock.now += 61
        (late,) = queue.claim("q", 10)
        assert late.payload == b"z"
        queue.ack(late)
        queue.flush()
        assert store.list("staging/") == [], "runs and bodies objects outlived their jobs"


def test_refused_staged_runs_change_nothing_and_a_repeated_write_adds_nothing() -> None:
    store = MemoryStore("staged-runs-refused")
    with Queue(store=store) as queue:
        runs = _stage_runs(store, "staging/v/0", [("a", 0, 0.0), ("b", 0, 0.0)])
        assert queue.enqueue_runs("q", runs, write_id="v") == 2
        assert queue.enqueue_runs("q", runs, write_id="v") is None  # a retried commit
        with pytest.raises(ConfigurationError, match="runs not referred to yet"):
            queue.enqueue_runs("q", runs, write_id="v2")
        other = _stage_runs(store, "staging/v/1", [("c", 0, 0.0)])
        again = [msgspec.structs.replace(other[0], bodies=runs[0].bodies)]
        with pytest.raises(ConfigurationError, match="already refer"):
            queue.enqueue_runs("q", again, write_id="v3")
        backwards = [msgspec.structs.replace(other[0], next=(0, 5), last=(0, 1))]
        with pytest.raises(ConfigurationError, match="sorts before"):
            queue.enqueue_runs("q", backwards, write_id="v4")
        too_many = msgspec.structs.asdict(other[0]) | {"count": MAX_RUN_JOBS + 1}
        with pytest.raises(ConfigurationError, match="count"):
            queue.enqueue_runs("q", [StagedRun(**too_many)], write_id="v5")
        overcounted = [msgspec.structs.replace(other[0], groups={"t": 2})]
        with pytest.raises(ConfigurationError, match="at most its 1 jobs in all; found 2"):
            queue.enqueue_runs("q", overcounted, write_id="v6")
        timed = _stage_runs(store, "staging/v/2", [("d", 0, 60.0)])
        with pytest.raises(ConfigurationError, match="in a timed run"):
            queue.enqueue_runs(
                "q", [msgspec.structs.replace(timed[0], groups={"t": 1})], write_id="v7"
            )
        assert queue.stats("q").ready == 2
