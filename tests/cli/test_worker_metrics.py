"""``objq worker --metrics-listen``: a running worker serves its own Prometheus metrics."""

from __future__ import annotations

import json
import signal
import urllib.request
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from tests.cli.objq_cli import Objq, Workers, one_line_error
from tests.support.waiting import wait_for


def _scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        family.name: [(s.labels, s.value) for s in family.samples]
        for family in text_string_to_metric_families(text)
    }


def test_a_worker_serves_its_counters_and_the_store_s(
    objq: Objq, file_url: str, workers: Callable[[str], Workers]
) -> None:
    # Given a worker with metrics on a port the system picks, and three jobs
    assert objq("declare", "work", url=file_url).code == 0
    for n in range(3):
        assert objq("enqueue-cmd", "work", "--", "true", str(n), url=file_url).code == 0
    worker = workers(file_url).start("--queue", "work", "--metrics-listen", "127.0.0.1:0")
    assert worker.stdout is not None
    first = json.loads(worker.stdout.readline())
    assert first["event"] == "metrics", first
    # When the jobs are done and the endpoint is scraped
    wait_for(
        lambda: objq("status", "--json", url=file_url).json()["queues"][0]["ready"] == 0,
        30,
        "the worker to take the jobs",
    )

    def acked() -> float:
        [(_, value)] = _scrape(first["metrics"])["objq_jobs_acked"]
        return value

    wait_for(lambda: acked() == 3, 30, "three acks counted")
    families = _scrape(first["metrics"])
    # Then its own counters, the store's numbers and its process are there
    assert families["objq_jobs_claimed"][0][1] == 3
    assert {labels["kind"] for labels, _ in families["objq_storage_requests"]} >= {"read", "write"}
    assert ({"queue": "work", "state": "ready"}, 0.0) in [
        ({k: v for k, v in labels.items() if k != "store"}, value)
        for labels, value in families["objq_queue_jobs"]
    ]
    assert "process_cpu_seconds" in families
    worker.send_signal(signal.SIGTERM)
    worker.communicate(timeout=30)
    assert worker.returncode == 0


def test_a_bad_metrics_address_is_a_usage_error(objq: Objq, file_url: str) -> None:
    result = objq("worker", "--queue", "work", "--metrics-listen", "nowhere", url=file_url)
    one_line_error(result, 2, "HOST:PORT", "nowhere")
