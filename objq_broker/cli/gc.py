"""``objq gc``: delete the bodies objects, runs and staged objects no state refers to.

The rules are :mod:`objq_broker.engine.garbage`'s: the state is read once, the folders are
listed, and only objects the state does not refer to *and* last written more than
``--older-than`` ago (1h) are deleted, so a commit in flight never loses what it refers to. A
margin shorter than the default is asked about first: it is only safe while no commit takes
that long.
"""

from __future__ import annotations

import click

from objq_broker.cli.commands import command, objq
from objq_broker.cli.context import Context
from objq_broker.cli.inspect import parse_duration
from objq_broker.cli.output import confirm, counted, table
from objq_broker.cli.values import DURATION
from objq_broker.engine.garbage import (
    DEFAULT_OLDER_THAN_SECONDS,
    KINDS,
    Collection,
    collect_garbage,
)
from objq_broker.model.shown import age, size


@command(objq, "gc", "delete objects no state refers to")
@click.option(
    "--older-than",
    type=DURATION,
    metavar="AGE",
    help="only those written longer ago (1h; less asks first)",
)
@click.option("--dry-run", is_flag=True, help="say what would go; delete nothing")
def cmd_gc(ctx: Context) -> int:
    a = ctx.args
    older_than = (
        DEFAULT_OLDER_THAN_SECONDS if a.older_than is None else parse_duration(a.older_than)
    )
    if older_than < DEFAULT_OLDER_THAN_SECONDS and not a.dry_run:
        confirm(
            f"delete unreferenced objects written only {a.older_than} ago? A commit still in "
            "flight may refer to one written since the default margin (1h)",
            yes=ctx.yes,
        )
    found = collect_garbage(ctx.store(), older_than=older_than, dry_run=a.dry_run)
    ctx.emit(found.as_dict(), _text(found))
    return 1 if found.failed else 0


def _text(found: Collection) -> str:
    """The collection for people: a line of totals, then a table by kind."""
    if not found.state_found:
        return "no objq state at this URL: nothing collected (is it the namespace's URL?)"
    total = found.total
    verb = "would delete" if found.dry_run else "deleted"
    head = (
        f"{verb} {counted(total.objects, 'unreferenced object')} ({size(total.bytes)}) "
        f"written over {age(found.older_than_seconds)} ago"
    )
    if found.lock_files:
        head += f", and {counted(found.lock_files, 'lock file')} of deleted keys"
    if found.failed:
        head += f"; {counted(found.failed, 'delete')} failed (tried again next time)"
    rows = [
        (
            kind,
            found.garbage[kind].objects,
            size(found.garbage[kind].bytes),
            found.kept[kind].objects,
            size(found.kept[kind].bytes),
        )
        for kind in KINDS
    ]
    headers = ("kind", "objects", "bytes", "kept (younger)", "kept bytes")
    return f"{head}\n{table(headers, rows)}"
