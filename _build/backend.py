"""The build backend: setuptools', asking for mypy too when ``OBJQ_COMPILE=1`` asks for the
compiled build (``setup.py``), so that a pip install from source compiles in its own build
environment. Without it, nothing changes: a pure-Python build needs setuptools alone."""

from __future__ import annotations

import os
from typing import Any

from setuptools.build_meta import *  # noqa: F403 (every hook this file does not change)


def _compiler() -> list[str]:
    """mypy (with mypyc), and msgspec, whose types the compiled modules are checked against."""
    if os.environ.get("OBJQ_COMPILE", "") in ("", "0"):
        return []
    return ["mypy>=1.11", "msgspec>=0.18"]


# Not setuptools' own answer, which runs setup.py, and that imports mypyc before it is there.
# setup.py asks for nothing else (no setup_requires): setuptools and wheel come from
# pyproject.toml's build-system.requires.
def get_requires_for_build_wheel(config_settings: dict[str, Any] | None = None) -> list[str]:
    return _compiler()


def get_requires_for_build_editable(config_settings: dict[str, Any] | None = None) -> list[str]:
    return _compiler()
