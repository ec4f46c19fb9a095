"""``objq exporter``: a real exporter process on a real ``file://`` store, scraped over HTTP."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from objq_broker import Queue
from objq_broker.metrics import StoreCollector
from objq_broker.metrics.reading import JOB_STATES
from objq_broker.storage import open_store
from tests.cli.objq_cli import run_objq
from tests.metrics.exporter_process import Exporter, start_exporter, value
from tests.support.processes import Children, reap

#: Seconds a stopped exporter may take to exit.
EXIT_TIMEOUT_SECONDS = 10.0


def fill_store(url: str) -> None:
    """Given jobs in every state: ``emails`` with ready, delayed, in-flight and dead jobs,
    ``reports`` with ready ones only, ``idle`` declared and empty."""
    with Queue(url, broker="off") as queue:
        queue.declare("idle")
        queue.enqueue_many("emails", [b"one", b"two", b"three", b"four", b"five"])
        queue.enqueue_many("emails", [b"later", b"much later"], delay=3600)
        held = queue.claim("emails", 2, lease=600)
        queue.nack(held[0], error="bad address", retry=False)
        queue.enqueue_many("reports", [b"daily", b"weekly"], priority=1)


def status(url: str) -> dict[str, Any]:
    result = run_objq("status", "--json", url=url)
    assert result.code == 0, result.stderr
    document: dict[str, Any] = result.json()
    return document


@pytest.fixture
def filled_url(tmp_path: Path) -> str:
    url = (tmp_path / "store").as_uri()
    fill_store(url)
    return url


@pytest.fixture
def exporter(children: Children, filled_url: str, tmp_path: Path) -> Exporter:
    return start_exporter(children, filled_url, tmp_path / "exporter.log")


def test_scraped_numbers_equal_objq_status(exporter: Exporter, filled_url: str) -> None:
    # Given the status read just before and just after a scrape of an unchanging store
    before = status(filled_url)
    families = exporter.scrape()
    after = status(filled_url)

    # Then every queue's jobs by state are the numbers objq status shows
    scraped_queues = {s.labels["queue"] for s in families["objq_queue_jobs"].samples}
    assert scraped_queues == {q["queue"] for q in before["queues"]} == {"emails", "reports", "idle"}
    for shown in before["queues"]:
        for state in JOB_STATES:
            scraped = value(families, "objq_queue_jobs", queue=shown["queue"], state=state)
            assert scraped == shown[state] == _queue(after, shown["queue"])[state]
    emails = _queue(before, "emails")
    assert (emails["ready"], emails["delayed"], emails["in_flight"], emails["dead"]) == (3, 2, 1, 1)

    # And the oldest ready age lies between the two reads (0 where nothing is ready)
    for shown in before["queues"]:
        age = value(families, "objq_queue_oldest_ready_age_seconds", queue=shown["queue"])
        first = shown["oldest_ready_age_seconds"] or 0.0
        last = _queue(after, shown["queue"])["oldest_ready_age_seconds"] or 0.0
        assert first <= age <= last
    assert _queue(before, "idle")["oldest_ready_age_seconds"] is None

    # And the state's facts are the ones status shows above its table
    assert value(families, "objq_state_exists") == before["exists"] == 1
    assert value(families, "objq_state_commits") == before["version"] == after["version"]
    assert value(families, "objq_state_size_bytes") == before["size_bytes"]
    # (the dead-lettered job's record, which the state keeps until records fill an object)
    assert value(families, "objq_archive_tail_records") == before["archive_tail_records"] == 1
    committed_at = value(families, "objq_state_last_commit_timestamp_seconds")
    assert committed_at == pytest.approx(before["committed_at"], abs=1e-6)
    age = value(families, "objq_state_last_commit_age_seconds")
    assert before["read_at"] - before["committed_at"] <= age
    assert age <= after["read_at"] - after["committed_at"]
    assert before["broker"] is None and value(families, "objq_broker_registered") == 0
    assert value(families, "objq_up") == 1
    assert value(families, "objq_scrape_errors") == 0


def test_every_family_of_the_collector_is_in_one_scrape(
    exporter: Exporter, filled_url: str
) -> None:
    # Given the families the collector says it yields (read without touching the store)
    store = open_store(filled_url)
    declared = {family.name: family.type for family in StoreCollector(store).describe()}
    store.close()
    assert {"objq_up", "objq_queue_jobs", "objq_state_commits"} <= set(declared)

    # When the exporter is scraped once
    families = exporter.scrape()

    # Then each of them is there, with at least one sample, and with the type it declared
    assert set(declared) <= set(families)
    for name, kind in declared.items():
        assert families[name].samples, name
        assert families[name].type == kind, name


def _corrupt_state(store: Path) -> Callable[[], None]:
    state = store / "state.json"
    original = state.read_bytes()
    state.write_bytes(b'{"format": 9}')

    def restore() -> None:
        state.write_bytes(original)

    return restore


def _replace_directory_with_a_file(store: Path) -> Callable[[], None]:
    aside = store.with_name("store-aside")
    store.rename(aside)
    store.write_text("not a directory")

    def restore() -> None:
        store.unlink()
        aside.rename(store)

    return restore


@pytest.mark.parametrize(
    "break_store",
    [_corrupt_state, _replace_directory_with_a_file],
    ids=["state-corrupt", "directory-replaced-by-a-file"],
)
def test_a_store_that_cannot_be_read_gives_up_0_and_the_exporter_keeps_serving(
    exporter: Exporter, tmp_path: Path, break_store: Callable[[Path], Callable[[], None]]
) -> None:
    # Given an exporter that read its store once
    assert value(exporter.scrape(), "objq_up") == 1

    # When the store can no longer be read
    restore = break_store(tmp_path / "store")

    # Then each scrape answers objq_up 0, counts the failure and shows no stale numbers
    for failures in (1, 2):
        families = exporter.scrape()
        assert value(families, "objq_up") == 0
        assert value(families, "objq_scrape_errors") == failures
        assert "objq_queue_jobs" not in families
    # And each failure is one line of the exporter's log, naming the store
    failed = [line for line in exporter.output().splitlines() if "failed" in line]
    assert len(failed) == 2, exporter.output()
    assert all(line.startswith("objq exporter: reading file://") for line in failed)

    # And once the store is back, the next scrape reads it again
    restore()
    families = exporter.scrape()
    assert value(families, "objq_up") == 1
    assert value(families, "objq_scrape_errors") == 2
    assert value(families, "objq_queue_jobs", queue="emails", state="dead") == 1
    assert exporter.process.poll() is None


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_the_exporter_with_status_0(
    exporter: Exporter, children: Children, sig: signal.Signals
) -> None:
    # Given a running exporter that was scraped
    exporter.scrape()

    # When it gets the signal
    children.send_signal(exporter.process, sig)

    # Then it exits 0, saying so
    assert reap(exporter.process, timeout=EXIT_TIMEOUT_SECONDS) == 0
    assert exporter.output().splitlines()[-1] == "objq exporter: stopped"


def test_json_output_says_where_it_serves(
    children: Children, filled_url: str, tmp_path: Path
) -> None:
    # Given an exporter asked for JSON output
    exporter = start_exporter(children, filled_url, tmp_path / "exporter.log", "--json")

    # Then its first line is one JSON document naming the store and the endpoint
    event = json.loads(exporter.output().splitlines()[0])
    assert event == {"event": "serving", "url": filled_url, "metrics": exporter.url}

    # And its last, once stopped, says so
    assert children.stop(exporter.process, EXIT_TIMEOUT_SECONDS)
    assert exporter.process.returncode == 0
    assert json.loads(exporter.output().splitlines()[-1]) == {"event": "stopped", "url": filled_url}


def _queue(status_document: dict[str, Any], name: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [q for q in status_document["queues"] if q["queue"] == name]
    [queue] = found
    return queue
