"""Fetch a project's sdist and unpack some of its folders: how upstream test suites get here.

Shared by ``kombu_suite/``, ``celery_suite/`` and ``dramatiq_suite/``. The sdist of the
*installed* version is downloaded once with ``pip download`` into ``.upstream/<project>/``
(git-ignored) and only the named folders are unpacked, so the project's own package in the
sdist can never shadow the installed one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The repository root.
ROOT = Path(__file__).resolve().parents[2]
#: Cached sdists and unpacked suites live under here, one folder per project.
UPSTREAM_DIR = ROOT / ".upstream"


def fetch_sdist(project: str, version: str, cache_dir: Path) -> Path:
    """The sdist of ``project==version`` in ``cache_dir``, downloaded with pip on first use."""
    pattern = f"{project}-{version}.tar.gz"
    found = sorted(cache_dir.glob(pattern))
    if found:
        return found[0]
    cache_dir.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
        f"{project}=={version}", "-d", str(cache_dir),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    found = sorted(cache_dir.glob(pattern))
    if done.returncode != 0 or not found:
        raise RuntimeError(
            f"pip download of the {project}=={version} sdist into {cache_dir} failed "
            f"(exit {done.returncode}):\n{done.stdout}\n{done.stderr}"
        )
    return found[0]


def unpack_paths(sdist: Path, top: str, paths: Sequence[str], root: Path) -> Path:
    """Unpack ``paths`` (files or folders, relative to the sdist's ``top`` folder) into ``root``.

    Done once: when the first of ``paths`` is already there, nothing is unpacked. The paths are
    staged in a temporary folder and moved into place with one rename, so two runs racing
    (or one killed half-way) never leave a half-unpacked suite behind.
    """
    if (root / paths[0]).exists():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".unpack-", dir=root.parent))
    try:
        with tarfile.open(sdist) as archive:
            members = []
            for member in archive.getmembers():
                inner = member.name.removeprefix(f"{top}/")
                if any(inner == path or inner.startswith(f"{path}/") for path in paths):
                    member.name = f"suite/{inner}"
                    members.append(member)
            missing = [p for p in paths if not any(m.name == f"suite/{p}" for m in members)]
            if missing:
                raise RuntimeError(f"{sdist}: expected {missing} under {top}/, found none")
            # The "data" filter (no links out, no devices) came in Python 3.11.4; Debian's
            # 3.11.2 lacks it. The members were chosen by name above, none starts with "/" or
            # climbs out with "..", and the sdist comes from PyPI by its pinned version.
            if any(m.name.startswith("/") or ".." in m.name.split("/") for m in members):
                raise RuntimeError(f"{sdist}: a member's path leaves the unpack folder")
            safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            archive.extractall(staging, members=members, **safe)  # type: ignore[arg-type]
        try:
            (staging / "suite").rename(root)
        except OSError:  # another run unpacked it first
            if not (root / paths[0]).exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return root


def write_if_changed(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, unless it already holds exactly that."""
    if path.exists() and path.read_text() == text:
        return
    fd, staged = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(staged, path)


#: Outcomes a suite report counts, in the order a summary lists them.
OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed", "deselected")


@dataclass
class SuiteRun:
    """One run of an upstream suite: its pytest exit code, and the JSON report our conftest in
    the suite's folder wrote (counts, failures, skips, unmatched deselect entries, slowest)."""

    title: str  # what ran on what, e.g. "celery 5.7.0 t/integration/test_tasks.py on objq+file"
    returncode: int
    seconds: float
    report: dict[str, Any]
    output: str
    command: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        counts = self.report.get("counts", {})
        return self.returncode == 0 and not counts.get("failed") and not counts.get("error")

    def summary(self, slowest: int = 5) -> str:
        counts = self.report.get("counts", {})
        lines = [
            f"{self.title}: "
            + ", ".join(f"{counts.get(k, 0)} {k}" for k in OUTCOMES)
            + f" in {self.seconds:.1f} s (pytest exit {self.returncode})"
        ]
        for stale in self.report.get("unmatched_deselects", []):
            lines.append(f"  deselect entry matched no test: {stale}")
        for failure in self.report.get("failures", []):
            outcome, nodeid = failure["outcome"].upper(), failure["nodeid"]
            lines.append(f"  {outcome} {nodeid}: {failure['message']}")
        for skip in self.report.get("skips", []):
            lines.append(f"  SKIPPED {skip}")
        for rerun in self.report.get("reruns", []):
            lines.append(f"  RERUN {rerun}")
        ranked = self.report.get("slowest", [])[:slowest]
        if ranked:
            lines.append(
                "  slowest: " + ", ".join(f"{s['nodeid']} {s['seconds']:.1f}s" for s in ranked)
            )
        return "\n".join(lines)
