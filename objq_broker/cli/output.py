"""What the ``objq`` command prints: tables for people, JSON for scripts, a progress bar, and
the confirmation asked before anything is deleted.

Results go to stdout; progress, prompts and errors go to stderr, so ``objq ... --json | jq``
always receives clean JSON.

Whatever the output for people shows from the store (payloads, errors, queue names, lease
owners) passes through :func:`printable` first: anyone who can write to the bucket chooses those
strings, and a raw escape sequence in one could clear the operator's screen, retitle the
terminal or forge lines of the output. ``--json`` output is left as it is (JSON escapes
control characters itself; a program reads it, not a terminal).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

from objq_broker.errors import redacted

#: Seconds between two redraws of a progress bar (drawing costs more than the work it shows).
PROGRESS_REDRAW_SECONDS = 0.1
#: Characters of the bar itself.
PROGRESS_WIDTH = 30
#: Characters a terminal acts on instead of showing: C0 (newline and tab included), DEL, C1,
#: the Unicode bidirectional controls (which reorder what follows, so text can read other than
#: it is) and the line and paragraph separators.
_BIDI_CONTROLS = (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
_UNSAFE = (*range(0x20), 0x7F, *range(0x80, 0xA0), *_BIDI_CONTROLS, 0x2028, 0x2029)
_NAMED = {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}
_ESCAPES = {
    code: _NAMED.get(code) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
    for code in _UNSAFE
}


class UsageError(Exception):
    """The command line asks for something impossible; ``objq`` exits with status 2."""


class Cancelled(Exception):
    """The operator declined a confirmation; ``objq`` exits with status 1."""


def printable(text: object) -> str:
    """``text`` as one line that is safe to show on a terminal: every character a terminal would
    act on is written as its Python escape instead (``\\x1b``, ``\\n``, ``\\u202e``).

    >>> printable("ok\\x1b[2J\\nfake line\\u202e")
    'ok\\\\x1b[2J\\\\nfake line\\\\u202e'
    """
    return str(text).translate(_ESCAPES)


class EscapingFormatter(logging.Formatter):
    """A log formatter whose messages go through :func:`printable` (they may quote what the
    store holds) and, with their tracebacks, through :func:`~objq_broker.errors.redacted`; a
    traceback keeps its lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return printable(redacted(super().formatMessage(record)))

    def formatException(self, ei: Any) -> str:
        # A logged traceback's SDK messages quote endpoints as given, user:password@ too.
        return redacted(super().formatException(ei))


def print_json(value: Any, stream: TextIO | None = None) -> None:
    """One JSON document on one line."""
    target = sys.stdout if stream is None else stream
    target.write(json.dumps(value, separators=(",", ":"), ensure_ascii=False) + "\n")
    target.flush()


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain aligned table; numbers are right-aligned."""
    cells = [[_cell(value) for value in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, text in enumerate(row):
            widths[i] = max(widths[i], len(text))
    numeric = [
        all(isinstance(row[i], int | float) or row[i] is None for row in rows) and bool(rows)
        for i in range(len(headers))
    ]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(widths[i]) if numeric[i] else v.ljust(widths[i]) for i, v in enumerate(values)
        ]
        return "  ".join(parts).rstrip()

    return "\n".join([line([printable(h) for h in headers]), *(line(row) for row in cells)])


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return printable(value)


def iso(at: float | None) -> str | None:
    return None if not at else datetime.fromtimestamp(at, UTC).isoformat()


def confirm(question: str, *, yes: bool, stdin: TextIO | None = None) -> None:
    """Ask ``question`` on stderr and read the answer from stdin; :class:`Cancelled` unless it
    is yes. ``yes`` (the ``--yes`` flag) skips the question. Without a terminal on stdin there
    is nobody to ask, so the command is refused rather than guessed."""
    if yes:
        return
    source = sys.stdin if stdin is None else stdin
    if source is None or not source.isatty():
        raise UsageError(
            f"{question.rstrip('?')}: confirmation needed, but stdin is not a terminal; "
            "pass --yes to confirm"
        )
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    answer = source.readline().strip().lower()
    if answer not in ("y", "yes"):
        raise Cancelled(f"cancelled: the answer was {answer!r}, not 'yes'")


class Progress:
    """A one-line progress bar on stderr, drawn only when stderr is a terminal.

    >>> bar = Progress(100, "enqueue", enabled=False)
    >>> bar.update(50)
    >>> bar.close()
    """

    def __init__(
        self,
        total: int,
        label: str,
        *,
        stream: TextIO | None = None,
        enabled: bool | None = None,
    ) -> None:
        self.total = max(total, 0)
        self.label = label
        self.stream = sys.stderr if stream is None else stream
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.done = 0
        self.note = ""
        self._started = time.monotonic()
        self._drawn = 0.0

    def update(self, done: int, note: str = "") -> None:
        self.done = min(done, self.total) if self.total else done
        self.note = note
        now = time.monotonic()
        if self.enabled and now - self._drawn >= PROGRESS_REDRAW_SECONDS:
            self._drawn = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        fraction = self.done / self.total if self.total else 1.0
        filled = int(fraction * PROGRESS_WIDTH)
        elapsed = now - self._started
        rate = f"{self.done / elapsed:,.0f}/s" if elapsed >= 0.5 else ""  # too early to tell
        bar = "#" * filled + "." * (PROGRESS_WIDTH - filled)
        text = (
            f"\r{self.label} [{bar}] {self.done:,}/{self.total:,} {fraction:4.0%} "
            f"{rate} {self.note}"
        )
        self.stream.write(text.ljust(79) + "\x1b[K")
        self.stream.flush()

    def close(self) -> None:
        """Draw the final state and end the line."""
        if self.enabled:
            self._draw(time.monotonic())
            self.stream.write("\n")
            self.stream.flush()
