"""MkDocs hooks for the docs site (``hooks:`` in ``mkdocs.yml``).

The docstrings cross-reference in reStructuredText roles (``:class:`~objq_broker.queue.Queue```),
which Markdown renders as the role's name followed by code. Shown as the code alone, with the
module path dropped where the role asks for it (``~``), as Sphinx would.
"""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj):<code>(~?)([^<]+)</code>")


def _shown(match: re.Match[str]) -> str:
    short, target = match.group(1), match.group(2)
    return f"<code>{target.rsplit('.', 1)[-1] if short else target}</code>"


def on_page_content(html: str, **_: Any) -> str:
    """The page's HTML with every reStructuredText role shown as its code."""
    return _ROLE.sub(_shown, html)
