"""Dramatiq's own broker-generic tests, run against ObjqBroker on each local backend.

The suite comes from the sdist of the installed Dramatiq (downloaded once into ``.upstream/``)
and runs in a subprocess with its own pytest settings; see ``dramatiq_upstream.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.dramatiq_suite.dramatiq_upstream import (
    BACKENDS,
    RUN_TIMEOUT_SECONDS,
    prepare_suite,
    run_suite,
)


@pytest.fixture(scope="module")
def suite_root() -> Path:
    return prepare_suite()


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_SECONDS + 60)
@pytest.mark.parametrize("backend", BACKENDS)
def test_dramatiq_suite_passes_on_objq(suite_root: Path, backend: str, tmp_path: Path) -> None:
    # Given Dramatiq's own tests, with stub_broker = ObjqBroker on this backend
    # When they run
    run = run_suite(suite_root, backend, tmp_path / "report.json")
    print(run.summary())

    # Then every test ran and passed; the only deselected ones are listed with reasons
    assert run.report, f"the suite wrote no report:\n{run.output[-5000:]}"
    assert not run.report["unmatched_deselects"], run.summary()
    assert run.ok, f"{run.summary()}\n\n{run.output[-20000:]}"
