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
