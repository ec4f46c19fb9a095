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
