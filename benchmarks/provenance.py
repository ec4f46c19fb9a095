"""Which objq source a benchmark measured (shared by the benchmark scripts)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def objq_revision(root: Path) -> str | None:
    """``git <commit>``, marked when objq_broker/ has local changes; None outside a checkout."""
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", "objq_broker"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return f"git {head}" + (" + uncommitted changes in objq_broker/" if dirty else "")


def objq_build() -> str:
    """Where the ``objq_broker`` measured was imported from, and whether its commit path is
    compiled (``setup.py``: the state's module stands for the others), so that a figure says
    which build it is of."""
    import objq_broker
    from objq_broker.model import state

    kind = "pure Python" if (state.__file__ or "").endswith(".py") else "compiled"
    return f"{kind}, from {Path(objq_broker.__file__ or '').parent}"
