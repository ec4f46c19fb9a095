"""The store probe: every real store passes it, a real store whose conditions are dropped on
the way fails it, and a namespace's first commit refuses such a store before it creates
anything."""

from __future__ import annotations

import pytest

from objq_broker import Queue
from objq_broker.errors import ConfigurationError, UnsafeStore
from objq_broker.storage import MemoryStore, ObjectStore, open_store
from objq_broker.storage.faulty import FaultyStore
from objq_broker.storage.probe import (
    CONCURRENT_INCREMENTS,
    CREATE_OVER_EXISTING,
    SCRATCH_PREFIX,
    STALE_VERSION,
    ProbeReport,
    probe_conditions,
    probe_increments,
    probe_store,
    require_conditions,
    skip_condition_check,
)


def never_probe(store: ObjectStore, folder: str) -> ProbeReport:
    raise AssertionError(f"{store.url} was probed, though its check is off or already passed")


def test_every_real_store_passes_the_probe_and_keeps_nothing(store: ObjectStore) -> None:
    report = probe_store(store)
    assert report.passed, report.failed
    assert [check.name for check in report.checks][-1] == CONCURRENT_INCREMENTS
    cheap = probe_conditions(store, "some/folder")
    assert cheap.passed and cheap.requests == 5  # four writes and a delete
    assert store.list() == []


def test_a_store_ignoring_conditions_fails_the_probe(store: ObjectStore) -> None:
    # Given a real store whose writes lose If-Match / If-None-Match on the way
    ignoring = FaultyStore(store, ignore_conditions=True)
    # Then the cheap part catches both, saying what was expected and found
    cheap = probe_conditions(ignoring)
    assert {check.name for check in cheap.failed} == {CREATE_OVER_EXISTING, STALE_VERSION}
    assert all("expected PreconditionFailed" in check.detail for check in cheap.failed)
    # And so does the race: every writer of a round "won", and their increments were lost
    race = probe_increments(ignoring)
    [check] = race.failed
    assert "acknowledged writes were lost" in check.detail
    whole = probe_store(ignoring)  # stops after the cheap part: the race would lose more
    assert [check.name for check in whole.failed] == [check.name for check in cheap.failed]
    assert store.list() == []


def test_first_use_refuses_a_store_ignoring_conditions(store: ObjectStore) -> None:
    ignoring = FaultyStore(store, ignore_conditions=True)
    with Queue(store=ignoring, broker="off") as queue:
        with pytest.raises(UnsafeStore) as refused:
            queue.enqueue("q", b"x" * 100_000)  # a payload large enough for a bodies object
        message = str(refused.value)
        assert store.url in message
        assert CREATE_OVER_EXISTING in message and STALE_VERSION in message
        assert "check_conditions=false" in message and "dangerous" in message
    # Nothing was created: no state, no marker, no payload, no scratch object
    assert store.list() == []


def test_first_use_passes_on_every_real_store_and_probes_once(store: ObjectStore) -> None:
    with Queue(store=store, broker="off") as queue:
        queue.enqueue("q", b"x")
        assert queue.stats("q").ready == 1
    assert not [key for key in store.list() if SCRATCH_PREFIX in key]


def test_a_store_that_passed_is_not_probed_again() -> None:
    store = MemoryStore("probe-once")
    probes: list[str] = []

    def probe(store: ObjectStore, folder: str) -> ProbeReport:
        probes.append(folder)
        return probe_conditions(store, folder)

    require_conditions(store, "state.json", probe=probe)
    require_conditions(store, "other/state.json", probe=probe)
    assert probes == [""]
    # A wrapper that changes what writes send is judged on its own
    with pytest.raises(UnsafeStore):
        require_conditions(FaultyStore(store, ignore_conditions=True), "state.json")


def test_the_probe_sits_beside_the_state_key() -> None:
    seen: list[str] = []

    def probe(store: ObjectStore, folder: str) -> ProbeReport:
        seen.append(folder)
        return probe_conditions(store, folder)

    require_conditions(MemoryStore("probe-folder"), "tenants/a/state.json", probe=probe)
    assert seen == ["tenants/a"]


def test_check_conditions_false_turns_the_first_use_check_off() -> None:
    for store in (
        open_store("memory://probe-off-query?check_conditions=false"),
        open_store("memory://probe-off-keyword", check_conditions=False),
    ):
        require_conditions(store, "state.json", probe=never_probe)
    checked = open_store("memory://probe-on?check_conditions=true")
    with pytest.raises(AssertionError, match="was probed"):
        require_conditions(checked, "state.json", probe=never_probe)
    with pytest.raises(ConfigurationError, match="option 'check_conditions': expected true/false"):
        open_store("memory://x?check_conditions=perhaps")


def test_skipping_the_check_lets_an_ignoring_store_through() -> None:
    # What the option's documentation warns of: nothing stops a store that ignores conditions
    ignoring = FaultyStore(MemoryStore("probe-skipped"), ignore_conditions=True)
    skip_condition_check(ignoring)
    with Queue(store=ignoring, broker="off") as queue:
        queue.enqueue("q", b"x")
        assert queue.stats("q").ready == 1
