"""An earlier release of objq, checked out from this repository's history and run for real:
what a host not yet upgraded does to a state the new code wrote."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

#: Writes one job with the release it runs under, to the URL it is given.
ENQUEUE_ONE = (
    "import sys\n"
    "from objq_broker import Queue\n"
    "with Queue(sys.argv[1], broker='off') as q:\n"
    "    q.enqueue('q', b'from the earlier release')\n"
)


def check_out(commit: str, into: Path) -> Path:
    """The library as of ``commit``, under ``into``; skips where there is no history."""
    root = Path(__file__).resolve().parents[2]
    try:
        archive = subprocess.run(
            ["git", "-C", str(root), "archive", commit, "objq_broker"],
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"no git history to check the earlier release out of: {exc}")
    earlier = into / f"objq-{commit}"
    earlier.mkdir()
    subprocess.run(["tar", "-x", "-C", str(earlier)], input=archive, check=True)
    return earlier


def run_under(earlier: Path, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``script`` run by a Python that imports objq from ``earlier``."""
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(earlier)},
        cwd=earlier,  # ``python -c`` imports from its working directory first
        timeout=120,
        check=False,
    )
