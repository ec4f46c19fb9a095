"""What a hostile probe of the hardened tree still got through, each case reproduced: staged
writes naming objq's own objects, values a staged run carried unchecked, a session refused
whole for one bad operation, a full namespace refusing large claims, a claim that found only
poison jobs, a password in a memory URL. Real file stores and a real broker."""

from __future__ import annotations

import json
import math
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import msgspec
import pytest

from objq_broker import ConfigurationError, Queue
from objq_broker.broker.elected import ElectedCommitter
from objq_broker.errors import RequestRefused
from objq_broker.model import ops as model_ops
from objq_broker.model.values import StagedBodies
from objq_broker.storage import open_store
from tests.spark.test_staged_enqueue import _stage_runs


@pytest.mark.parametrize(
    "key", ["state.json", "namespace.json", "runs/x.json", "staging/../state.json", "bodies/a"]
)
def test_a_staged_write_may_name_only_objects_under_staging(tmp_path: Path, key: str) -> None:
    url = (tmp_path / "ns").as_uri()
    with Queue(url, broker="off") as queue:
        queue.enqueue("q", b"seed")
        with pytest.raises(ConfigurationError, match="staging/"):
            queue.enqueue_staged("q", [StagedBodies(key, 1)], write_id="w1")
        (run,) = _stage_runs(open_store(url), "staging/w/0", [("a", 0, 0.0)])  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match="staging/"):
            queue.enqueue_runs("q", [msgspec.structs.replace(run, bodies=key)], write_id="w2")
        assert queue.stats("q").ready == 1
    assert (tmp_path / "ns" / "state.json").exists()


def test_a_freed_object_outside_objqs_folders_is_never_deleted(tmp_path: Path) -> None:
    """Defence in depth: a state naming ``state.json`` as a bodies object (a staged write of a
    release that did not check keys) never makes a commit delete it."""
    url = (tmp_path / "ns").as_uri()
    with Queue(url, broker="off") as queue:
        queue.enqueue("q", b"seed")
        # Built without the builder's checks, as an older release would have taken it
        unchecked = model_ops.EnqueueStaged("q", [StagedBodies("state.json", 1)], ["j1"], "w1")
        assert queue.submit(unchecked).result() == 1
        queue.claim("q", 5)  # the job naming it is dead-lettered: not a bodies object
        queue.flush()
        queue.purge_dead("q")
        queue.flush()
    with Queue(url, broker="off") as reader:
        assert reader.stats("q").in_flight == 1  # the seed, still held: the state is intact


@pytest.mark.parametrize("field", ["oldest", "next", "last"])
def test_a_staged_run_carrying_nan_is_refused(tmp_path: Path, field: str) -> None:
    url = (tmp_path / "ns").as_uri()
    with Queue(url, broker="off") as queue:
        (run,) = _stage_runs(open_store(url), "staging/w/0", [("a", 0, 0.0)])  # type: ignore[arg-type]
        bad: Any = math.nan if field == "oldest" else (math.nan, 0)
        with pytest.raises(ConfigurationError, match=field):
            queue.enqueue_runs("q", [msgspec.structs.replace(run, **{field: bad})], write_id="w")
    with Queue(url, broker="off") as reader:
        assert reader.queues() == []


def test_one_bad_operation_in_a_broker_session_fails_alone(tmp_path: Path) -> None:
    url = (tmp_path / "ns").as_uri()
    with Queue(url, broker="auto") as leader, Queue(url, broker="client") as client:
        leader.declare("q")
        assert isinstance(client.committer, ElectedCommitter)
        failures: list[BaseException] = []
        done = threading.Event()

        def produce() -> None:
            while not done.is_set():
                try:
                    client.enqueue("q", b"good")
                except Exception as exc:
                    failures.append(exc)

        threads = [threading.Thread(target=produce) for _ in range(4)]
        for thread in threads:
            thread.start()
        refused: list[Future[Any]] = []
        try:
            for _ in range(20):  # built without the builder's checks: only the broker refuses
                refused.append(client.submit(model_ops.RetryDead("q", ["x" * 5000])))
                refused.append(client.submit(model_ops.FindJob("\ud800")))
            for future in refused:
                with pytest.raises((RequestRefused, UnicodeEncodeError)):
                    future.result(timeout=30)
        finally:
            done.set()
            for thread in threads:
                thread.join()
        assert failures == []
        assert leader.stats("q").ready > 0


def test_a_full_namespace_still_takes_a_large_claim_by_asking_for_fewer(tmp_path: Path) -> None:
    url = (tmp_path / "ns").as_uri()
    options: dict[str, Any] = {"max_state_bytes": 300_000, "spill_at": None}
    with Queue(url, broker="off", **options) as queue:
        with pytest.raises(Exception, match="kept for consumers"):
            while True:
                queue.enqueue_many("q", [b"b" * 100] * 100)
        found = queue.claim("q", 1000)
        assert 0 < len(found) < 1000
        for delivery in found:
            queue.ack(delivery)


def test_a_claim_that_finds_only_poison_looks_again(tmp_path: Path) -> None:
    root = tmp_path / "ns"
    with Queue(root.as_uri(), broker="off") as queue:
        poison = [job.id for job in queue.enqueue_many("q", [b"\xff poison"] * 5)]
        queue.enqueue("q", b"good")
    doc = json.loads((root / "state.json").read_bytes())
    for job in doc["jobs"]:
        if job["id"] in poison:
            job["body"] = "not base64!"
    (root / "state.json").write_text(json.dumps(doc))
    with Queue(root.as_uri(), broker="off") as queue:
        assert [d.payload for d in queue.claim("q", 5)] == [b"good"]


def test_a_memory_url_with_a_password_is_refused_and_never_shown() -> None:
    with pytest.raises(ConfigurationError) as refused:
        Queue("memory://user:PASS5@x")
    assert "PASS5" not in str(refused.value)
