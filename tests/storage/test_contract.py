"""The storage contract, run against every backend over its real protocol.

The cases are the public ones of :mod:`objq_broker.testing` (one contract, not two); this
module runs each on every backend, and checks that a real store whose conditions are dropped
on the way fails them. The first cases prove that conditions are enforced: an emulator that
silently ignores them must turn this suite red, never green.
"""

from __future__ import annotations

import pytest

from objq_broker.storage import MemoryStore, ObjectStore
from objq_broker.storage.faulty import FaultyStore
from objq_broker.testing import CONTRACT, ContractCase, ContractViolation, check_store

#: The cases a store that ignores conditions must fail (the others do not race or condition).
CONDITION_CASES = (
    "stale_version_write_fails",
    "create_over_existing_fails",
    "if_version_on_missing_object_fails",
    "exactly_one_of_racing_writers_wins",
    "racing_creates_have_one_winner",
    "concurrent_increments_lose_nothing",
)


@pytest.mark.parametrize("case", CONTRACT, ids=str)
def test_contract(case: ContractCase, store: ObjectStore, store_url: str) -> None:
    case.run(store, url=store_url)


def test_a_store_ignoring_conditions_breaks_the_contract(store: ObjectStore) -> None:
    # Given a real store whose writes lose their conditions on the way
    ignoring = FaultyStore(store, ignore_conditions=True)
    # Then every case that rests on a condition fails, with what was expected and found
    report = check_store(ignoring)
    assert not report.passed
    failed = {result.name: result.detail for result in report.failed}
    assert set(CONDITION_CASES) <= set(failed), failed
    assert "expected PreconditionFailed, found the call accepted" in failed[CONDITION_CASES[0]]
    with pytest.raises(ContractViolation, match="expected PreconditionFailed"):
        CONTRACT[0].run(ignoring)
    # And the cases clean up after themselves
    assert store.list() == []


def test_check_store_by_url_runs_every_case(store_url: str) -> None:
    report = check_store(store_url)
    assert report.passed, report.failed
    assert [result.name for result in report.results] == [case.name for case in CONTRACT]
    assert {result.outcome for result in report.results} == {"passed"}


def test_an_adapter_object_skips_only_the_cases_that_need_a_url() -> None:
    store = MemoryStore("contract-adapter-object")
    report = check_store(store)
    assert report.passed, report.failed
    skipped = [result.name for result in report.results if result.outcome == "skipped"]
    assert skipped == [case.name for case in CONTRACT if case.needs_url]
    assert store.list() == []


def test_s3_versions_repeat_for_identical_content(backend: str, store: ObjectStore) -> None:
    # A fact of S3 the contract allows (ETags are MD5 digests): the queue state carries a
    # monotonic counter so its bytes, and so its ETag, never repeat. Elsewhere they never do.
    v1 = store.write("k", b"A")
    store.write("k", b"B")
    v3 = store.write("k", b"A")
    assert (v3 == v1) == (backend in ("s3", "seaweedfs"))
