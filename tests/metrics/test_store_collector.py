"""``StoreCollector`` in a process of its own choosing, on a real ``file://`` store."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from objq_broker.metrics import StoreCollector
from objq_broker.storage import open_store


def test_a_store_with_no_state_yet(tmp_path: Path) -> None:
    # Given an empty directory: nothing was ever committed there
    store = open_store((tmp_path / "store").as_uri())
    registry = CollectorRegistry()
    registry.register(StoreCollector(store))

    # When it is scraped
    text = generate_latest(registry).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}

    # Then the read succeeded and says there is no state: no queues, no last commit
    assert [s.value for s in families["objq_up"].samples] == [1]
    assert [s.value for s in families["objq_state_exists"].samples] == [0]
    assert [s.value for s in families["objq_state_commits"].samples] == [0]
    assert families["objq_queue_jobs"].samples == []
    assert families["objq_state_last_commit_timestamp_seconds"].samples == []
    store.close()
