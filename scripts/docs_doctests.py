"""A griffe extension for the docs site: docstring examples (``>>>`` lines and their output)
become fenced ``pycon`` blocks, so Markdown shows them as code instead of nested quotes.

Loaded by mkdocstrings (``extensions:`` in ``mkdocs.yml``); the docstrings themselves stay
plain doctests, which ``tests/docs/test_doctests.py`` runs.
"""

from __future__ import annotations

from typing import Any

import griffe


def fence_examples(text: str) -> str:
    """``text`` with each run of doctest lines (a ``>>>`` line, its ``...`` continuations and
    the output up to a blank line) inside a ```` ```pycon ```` fence at its indentation."""
    lines = text.splitlines()
    out: list[str] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        stripped = line.lstrip()
        if not stripped.startswith(">>>"):
            out.append(line)
            index += 1
            continue
        indent = line[: len(line) - len(stripped)]
        out.append(f"{indent}```pycon")
        while index < len(lines) and lines[index].strip():
            out.append(lines[index])
            index += 1
        out.append(f"{indent}```")
    return "\n".join(out)


class DoctestFences(griffe.Extension):
    """Fence the examples of every docstring griffe loads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None and ">>>" in obj.docstring.value:
            obj.docstring.value = fence_examples(obj.docstring.value)
