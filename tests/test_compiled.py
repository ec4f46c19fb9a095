"""The compiled build (``setup.py``): when the tests run against it (``scripts/test-compiled``
sets ``OBJQ_EXPECT_COMPILED``), every module it compiles is imported as its extension, not as
its source beside it; otherwise those runs would test the source again and prove nothing."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def compiled_modules() -> list[str]:
    """The modules ``setup.py`` compiles, as dotted names."""
    listed = re.findall(r'"(objq_broker/[\w/]+)\.py"', (ROOT / "setup.py").read_text())
    return [path.replace("/", ".") for path in listed]


def test_the_build_lists_modules_that_exist() -> None:
    modules = compiled_modules()
    assert modules, "setup.py lists no module to compile"
    for name in modules:
        assert (ROOT / (name.replace(".", "/") + ".py")).is_file(), name


@pytest.mark.skipif(
    not os.environ.get("OBJQ_EXPECT_COMPILED"), reason="the tests run against the source"
)
@pytest.mark.parametrize("name", compiled_modules())
def test_each_compiled_module_is_imported_as_its_extension(name: str) -> None:
    origin = importlib.import_module(name).__file__ or ""
    assert origin.endswith(tuple(EXTENSION_SUFFIXES)), f"{name} came from {origin}"


@pytest.mark.skipif(
    not os.environ.get("OBJQ_EXPECT_COMPILED"), reason="the tests run against the source"
)
def test_a_process_the_tests_start_imports_the_compiled_modules_too(tmp_path: Path) -> None:
    # Workers, brokers and the command line run in processes of their own, started from
    # elsewhere than the copy (here: a temporary folder) and often through a console script.
    found = subprocess.run(
        [sys.executable, "-c", "import objq_broker.model.state as m; print(m.__file__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert found.endswith(tuple(EXTENSION_SUFFIXES)), f"a started process imported {found}"
