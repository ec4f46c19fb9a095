"""``CommitCollector``: a process's own commit counters, from a real queue on a real store."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from objq_broker import Queue
from objq_broker.errors import ConfigurationError
from objq_broker.metrics import CommitCollector
from objq_broker.metrics.commits import ENGINE_FAMILIES


def test_the_counters_are_the_queues_own(tmp_path: Path) -> None:
    # Given a queue that committed some work, its collector registered
    url = (tmp_path / "store").as_uri()
    with Queue(url, broker="off") as queue:
        registry = CollectorRegistry()
        registry.register(CommitCollector(queue))
        queue.enqueue_many("emails", [b"a", b"b", b"c"])
        for delivery in queue.claim("emails", 3):
            queue.ack(delivery)
        queue.flush()
        counts = queue.metrics().snapshot()

        # When it is scraped
        text = generate_latest(registry).decode()

    # Then every counter of Queue.metrics() is there, labelled with the store, same value
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for field, family in ENGINE_FAMILIES.items():
        [sample] = families[family.name.removesuffix("_total")].samples
        assert sample.labels == {"store": url}
        assert sample.value == counts[field], field
    assert counts["state_writes"] >= 2 and counts["ops"] >= 5


def test_every_engine_counter_has_a_family(tmp_path: Path) -> None:
    with Queue((tmp_path / "store").as_uri(), broker="off") as queue:
        assert set(ENGINE_FAMILIES) == set(queue.metrics().snapshot())


def test_two_queues_on_one_store_are_refused(tmp_path: Path) -> None:
    url = (tmp_path / "store").as_uri()
    with (
        Queue(url, broker="off") as first,
        Queue(url, broker="off") as second,
        pytest.raises(ConfigurationError, match="one queue per store"),
    ):
        CommitCollector(first, second)


@pytest.mark.parametrize("broker", ["off", "auto"])
def test_storage_requests_and_bytes_are_what_the_store_was_asked(
    tmp_path: Path, broker: str
) -> None:
    # Given a queue on a directory: what its state object weighs is known from the disk
    root = tmp_path / "store"
    url = root.as_uri()
    with Queue(url, broker=broker, archive=False) as queue:
        registry = CollectorRegistry()
        registry.register(CommitCollector(queue))
        queue.declare("emails")  # (and, with broker="auto", the election's write)
        before = queue.storage_meter.snapshot()
        # When it commits three enqueues, one at a time
        for payload in (b"a", b"b", b"c"):
            queue.enqueue("emails", payload)
        after = queue.storage_meter.snapshot()
        text = generate_latest(registry).decode()
        state_bytes = (root / "state.json").stat().st_size
    # Then three conditional writes were counted, with at least the last state's bytes
    assert after.requests["write"] - before.requests["write"] == 3
    assert after.bytes_written - before.bytes_written >= state_bytes
    # No bodies, no archive (the store probe of the first commit deleted its scratch object)
    assert after.requests["put"] - before.requests["put"] == 0
    assert after.requests["delete"] - before.requests["delete"] == 0
    # And the scrape shows the same counts by kind and by direction
    families = {f.name: f for f in text_string_to_metric_families(text)}
    requests = {s.labels["kind"]: s.value for s in families["objq_storage_requests"].samples}
    assert requests["write"] == after.requests["write"]
    assert set(requests) == {"read", "write", "put", "get", "delete", "list"}
    moved = {s.labels["direction"]: s.value for s in families["objq_storage_bytes"].samples}
    assert moved == {"read": after.bytes_read, "written": after.bytes_written}


def test_a_failed_request_is_counted_too() -> None:
    from objq_broker.errors import ObjectNotFound
    from objq_broker.storage import MemoryStore
    from objq_broker.storage.metered import MeteredStore

    store = MeteredStore(MemoryStore())
    with pytest.raises(ObjectNotFound):
        store.get("missing")
    assert store.meter.snapshot().requests["get"] == 1


@pytest.mark.parametrize("broker", ["off", "auto"])
def test_commit_durations_are_a_histogram_of_every_commit(tmp_path: Path, broker: str) -> None:
    with Queue((tmp_path / "store").as_uri(), broker=broker) as queue:
        registry = CollectorRegistry()
        registry.register(CommitCollector(queue))
        for n in range(5):
            queue.enqueue("emails", bytes([n]))
        queue.flush()
        text = generate_latest(registry).decode()
        durations = queue.metrics().commit_durations
    [family] = [
        f
        for f in text_string_to_metric_families(text)
        if f.name == "objq_engine_commit_duration_seconds"
    ]
    buckets = {s.labels["le"]: s.value for s in family.samples if s.name.endswith("_bucket")}
    [count] = [s.value for s in family.samples if s.name.endswith("_count")]
    [total] = [s.value for s in family.samples if s.name.endswith("_sum")]
    # Every commit this process made is counted once, in a bucket at least as long as it took
    assert count == buckets["+Inf"] == sum(durations.counts) >= 5
    assert list(buckets.values()) == sorted(buckets.values())  # cumulative
    assert total == pytest.approx(durations.total_seconds) and total > 0
