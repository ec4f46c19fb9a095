"""What the ``objq`` command prints: tables for people, JSON for scripts, a progress bar, and
the confirmation asked before anything is deleted; the tables, the bar and the prompt are
rich's.

Results go to stdout; progress, prompts and errors go to stderr, so ``objq ... --json | jq``
always receives clean JSON.

Whatever the output for people shows from the store (payloads, errors, queue names, lease
owners) passes through :func:`printable` first: anyone who can write to the bucket chooses those
strings, and a raw escape sequence in one could clear the operator's screen, retitle the
terminal or forge lines of the output. It reaches rich as ``Text``, never as markup, so a
``[bold]`` in a payload stays those characters. ``--json`` output is left as it is (JSON escapes
control characters itself; a program reads it, not a terminal).
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TextIO

from objq_broker.errors import redacted

if TYPE_CHECKING:
    from rich.console import Console

# rich is imported where it draws: a command that prints JSON, or one line, never loads it.

#: Width of what is written to a file or a pipe: a table is as wide as its rows, never wrapped
#: (a program reading it reads one row per line).
UNWRAPPED_WIDTH = 10_000
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


def console(stream: TextIO) -> Console:
    """A rich console on ``stream`` that adds nothing of its own to what it shows: no
    highlighting of numbers or URLs, no markup, no emoji codes. Off a terminal, nothing is
    wrapped and nothing styled."""
    from rich.console import Console

    terminal = stream.isatty()
    return Console(
        file=stream,
        highlight=False,
        markup=False,
        emoji=False,
        width=None if terminal else UNWRAPPED_WIDTH,
    )


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """An aligned table as text for stdout; numbers are right-aligned, headers bold on a
    terminal."""
    from rich.table import Table
    from rich.text import Text

    grid = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for i, header in enumerate(headers):
        numeric = bool(rows) and all(
            isinstance(row[i], int | float) or row[i] is None for row in rows
        )
        grid.add_column(Text(printable(header)), justify="right" if numeric else "left")
    for row in rows:
        grid.add_row(*(Text(_cell(value)) for value in row))
    out = console(sys.stdout)
    with out.capture() as captured:
        out.print(grid)
    return "\n".join(line.rstrip() for line in captured.get().splitlines())


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return printable(value)


def counted(count: int, noun: str) -> str:
    """``count`` and ``noun``, plural unless it is one: ``1 job``, ``2 jobs``."""
    return f"{count:,} {noun if count == 1 else noun + 's'}"


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
    from rich.prompt import Prompt
    from rich.text import Text

    try:
        answer = Prompt.ask(
            Text(f"{printable(question)} [y/N]"),
            console=console(sys.stderr),
            default="",
            show_default=False,
            stream=None if stdin is None else stdin,
        )
    except EOFError:  # the terminal closed: nobody said yes
        answer = ""
    if answer.strip().lower() not in ("y", "yes"):
        raise Cancelled(f"cancelled: the answer was {answer.strip()!r}, not 'yes'")


@contextmanager
def progress(total: int, label: str, *, enabled: bool) -> Iterator[Callable[[int, str], None]]:
    """A progress bar on stderr while the block runs, drawn only when it is ``enabled`` and
    stderr is a terminal. The block is given a function to say how many of ``total`` are
    done, with a note.

    >>> with progress(100, "enqueue", enabled=False) as advance:
    ...     advance(50, "half way")
    """
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
    )
    from rich.progress import Progress as Bar

    out = console(sys.stderr)
    bar = Bar(
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[note]}", markup=False),
        console=out,
        disable=not (enabled and out.is_terminal),
    )
    task = bar.add_task(printable(label), total=total, note="")

    def advance(done: int, note: str = "") -> None:
        bar.update(task, completed=done, note=printable(note))

    with bar:
        yield advance
