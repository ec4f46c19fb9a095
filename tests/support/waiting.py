"""Waiting for something to happen: poll a condition until it holds or a deadline passes.

A test that waits for a worker, a server or a queue asks ``wait_for`` instead of sleeping a
fixed time: it goes on as soon as the condition holds, and when it never does the failure says
what did not happen and, given ``progress``, how far it got.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

#: Seconds between two checks of a condition, unless a caller asks for another interval.
POLL_INTERVAL_SECONDS = 0.05


class TimedOut(AssertionError):
    """A condition did not hold before its deadline (an assertion: the test fails with it)."""


def wait_for(
    condition: Callable[[], T | None],
    timeout: float,
    what: str,
    *,
    interval: float = POLL_INTERVAL_SECONDS,
    progress: Callable[[], object] | None = None,
) -> T:
    """Call ``condition`` every ``interval`` seconds until it returns a truthy value; return it
    (never None, so a condition that returns ``X | None`` gives an ``X``).

    Raises ``TimedOut`` naming ``what`` (and showing ``progress()``, if given) when ``timeout``
    seconds pass first. An exception from ``condition`` ends the wait at once: a condition can
    fail fast, for instance when a process it waits on has exited.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            seen = f"; {progress()}" if progress is not None else ""
            raise TimedOut(f"timed out after {timeout:g} s waiting for {what}{seen}")
        time.sleep(interval)


def wait_for_pid(path: Path, timeout: float, what: str) -> int:
    """Wait until a child has written its pid to ``path``, and return it.

    A child's ``write_text`` creates the file before it writes to it, so a file that exists
    may still be empty: waiting for the file alone can read nothing.
    """

    def written() -> int | None:
        text = path.read_text() if path.exists() else ""
        return int(text) if text.strip().isdigit() else None

    return wait_for(written, timeout, what)
