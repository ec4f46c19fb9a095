"""Every ``>>>`` example in ``objq_broker``'s docstrings runs and shows what it says.

A module whose optional dependency is not installed (an extra: ``pip install
'objq-broker[spark]'``, say) is skipped with the reason; ``objq_broker/cli/`` is left to its own
tests while it is rewritten. Each module runs in a temporary working directory, so an example
that opens ``file://objq-data`` writes there.
"""

from __future__ import annotations

import doctest
import importlib
import os
import pkgutil
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

import objq_broker

#: Packages whose examples are not collected here.
SKIPPED_PACKAGES = ("objq_broker.cli",)
#: Doctest flags every example runs with.
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _module_names() -> list[str]:
    root = Path(objq_broker.__file__).parent
    names = [objq_broker.__name__]
    for info in pkgutil.walk_packages([str(root)], prefix="objq_broker."):
        if info.name.startswith(SKIPPED_PACKAGES) or info.name.endswith("__main__"):
            continue
        names.append(info.name)
    return sorted(
        name for name in names if ">>>" in Path(_source(name)).read_text(encoding="utf-8")
    )


def _source(name: str) -> str:
    """The ``.py`` file of module ``name`` (beside its extension, in a compiled build)."""
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin is not None, name
    origin = Path(spec.origin)
    return str(
        origin if origin.suffix == ".py" else origin.parent / f"{name.rpartition('.')[2]}.py"
    )


def _import(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        # An extra that is not installed: the adapter names the pip install to run.
        pytest.skip(f"{name}: {exc}")


@pytest.fixture
def in_tmp_path(tmp_path: Path) -> Iterator[Path]:
    """The test in ``tmp_path``; the process's global Dramatiq broker (an example may set one)
    put back as it was, so later tests in this process do not use an example's broker."""
    before = Path.cwd()
    dramatiq_broker = sys.modules.get("dramatiq.broker")
    global_broker = getattr(dramatiq_broker, "global_broker", None)
    os.chdir(tmp_path)
    try:
        yield tmp_path
    finally:
        os.chdir(before)
        dramatiq_broker = sys.modules.get("dramatiq.broker")
        if dramatiq_broker is not None:
            setattr(dramatiq_broker, "global_broker", global_broker)  # noqa: B010 (a ModuleType)


def test_the_modules_with_examples_are_found() -> None:
    names = _module_names()
    assert "objq_broker" in names
    assert "objq_broker.queue" in names
    assert not [name for name in names if name.startswith(SKIPPED_PACKAGES)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", _module_names())
def test_the_examples_of_a_module_run(name: str, in_tmp_path: Path) -> None:
    module = _import(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    tests = [test for test in finder.find(module, name) if test.examples]
    if not tests and not (module.__file__ or "").endswith(".py"):
        # Compiled (setup.py): doctest finds no docstring of a compiled class or function.
        # They are the source's, whose examples the build from source runs.
        pytest.skip(f"{name} is compiled: its examples run against the source")
    assert tests, f"{name} has '>>>' in its source but no example doctest finds"
    for test in tests:
        runner.run(test)
    results = runner.summarize(verbose=False)
    assert results.failed == 0, f"{results.failed} of {results.attempted} examples failed in {name}"
