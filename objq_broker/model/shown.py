"""Times, durations and sizes as people read them: one way for the command line and the
dashboard.

>>> when(1_795_000_000), age(90), age(5400), size(999), size(1_500_000)
('2026-11-18 11:06:40Z', '90 s', '90 min', '999 B', '1.5 MB')
"""

from __future__ import annotations

from datetime import UTC, datetime


def when(at: float | None) -> str:
    """A Unix time as ``2026-11-26 02:44:03Z``, or '-' (none, or 0: never)."""
    if not at:
        return "-"
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def age(seconds: float | None) -> str:
    """A duration: ``42 s``, ``3 min``, ``2.5 h``, ``4.0 d``, or '-'."""
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def size(count: int) -> str:
    """Bytes: ``999 B``, ``6.4 KB``, ``1.5 MB``, ``2.0 GB`` (powers of 1,000)."""
    value = float(count)
    for unit in ("B", "KB", "MB"):
        if value < 1000:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} GB"
