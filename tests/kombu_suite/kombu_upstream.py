"""kombu's own transport-generic integration tests (``t/integration/common.py``), fetched from
the sdist of the installed kombu and loaded as a module the objq test classes subclass.

The sdist is downloaded once (``pip download``) into ``.upstream/kombu/`` (git-ignored) and only
``t/integration/common.py`` is unpacked. Run the suite with::

    python -m pytest tests/kombu_suite -p no:cacheprovider -rA
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from tests.support import upstream_sdist

#: The one file of kombu's sdist the suite needs (the generic test classes).
COMMON = "t/integration/common.py"
#: Module name the file is loaded under.
MODULE_NAME = "kombu_upstream_common"


def installed_version() -> str:
    return importlib.metadata.version("kombu")


def suite_root(version: str) -> Path:
    cache = upstream_sdist.UPSTREAM_DIR / "kombu"
    sdist = upstream_sdist.fetch_sdist("kombu", version, cache)
    return upstream_sdist.unpack_paths(
        sdist, f"kombu-{version}", [COMMON], cache / f"kombu-{version}-suite"
    )


def load_common() -> ModuleType:
    """kombu's ``t/integration/common.py`` of the installed version, imported."""
    if MODULE_NAME in sys.modules:
        return sys.modules[MODULE_NAME]
    path = suite_root(installed_version()) / COMMON
    spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"{path}: cannot be loaded as a module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE_NAME] = module
    spec.loader.exec_module(module)
    return module
