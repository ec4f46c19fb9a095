"""``objq results``: the results and rate-limit objects kept beside the queue."""

from __future__ import annotations

import click

from objq_broker.cli.commands import command, kept_results
from objq_broker.cli.context import Context, open_existing
from objq_broker.cli.inspect import parse_duration
from objq_broker.cli.output import confirm, counted
from objq_broker.cli.values import DURATION
from objq_broker.results.store import ResultStore


@command(kept_results, "purge", "delete expired results")
@click.option(
    "--older-than", type=DURATION, metavar="AGE", help="also those stored before (7d, 12h)"
)
@click.option("--prefix", default="results/", help="where they are (results/)")
def cmd_results_purge(ctx: Context) -> int:
    """Delete expired results, and with ``--older-than`` those stored longer ago."""
    a = ctx.args
    older_than = None if a.older_than is None else parse_duration(a.older_than)
    # The URL of a Celery result backend (objq+file://...) names the same store.
    url = ctx.url.removeprefix("objq+")
    if older_than is not None:
        confirm(
            f"delete every result under {url}/{a.prefix} stored more than {a.older_than} ago, "
            "expired or not?",
            yes=ctx.yes,
        )
    store = open_existing(url)
    try:
        deleted = ResultStore(store, a.prefix).purge(older_than=older_than)
    finally:
        store.close()
    ctx.emit(
        {"deleted": deleted, "prefix": a.prefix},
        f"{counted(deleted, 'result')} deleted under {a.prefix}",
    )
    return 0
