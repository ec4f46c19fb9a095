"""``objq check-store [URL]``: does this store really compare and set?

Runs :func:`~objq_broker.storage.probe.probe_store` on scratch objects beside the namespace's
state (deleted afterwards): a create over an existing object and a write conditioned on a
stale version must both be refused, an update from the current version must land, and writers
racing from one version must lose nothing. A store that fails would lose jobs silently; the
command says which check failed and exits 1. The URL comes as an argument or as ``--url``
(``$OBJQ_URL``); a local directory must exist.
"""

from __future__ import annotations

import click

from objq_broker.cli.commands import command, objq
from objq_broker.cli.context import Context
from objq_broker.cli.output import UsageError, counted, printable, table
from objq_broker.cli.values import whole
from objq_broker.storage.probe import DEFAULT_ROUNDS, DEFAULT_WRITERS, ProbeReport, probe_store


@command(
    objq,
    "check-store",
    "check that the store enforces conditional writes (compare-and-set); URL defaults to --url",
)
@click.argument("store_url", required=False, metavar="[URL]")
@click.option(
    "--writers",
    type=whole(2, 64),
    default=DEFAULT_WRITERS,
    help=f"writers racing each round ({DEFAULT_WRITERS})",
)
@click.option(
    "--rounds",
    type=whole(1, 1000),
    default=DEFAULT_ROUNDS,
    help=f"rounds of the race ({DEFAULT_ROUNDS})",
)
def cmd_check_store(ctx: Context) -> int:
    given = ctx.args.store_url
    if given is not None:
        other = getattr(ctx.args, "url", None)
        if other is not None and other != given:
            raise UsageError(
                "check-store: expected the store once, found URL and --url naming two; "
                "give one of them"
            )
        ctx.args.url = given
    report = probe_store(ctx.store(), writers=ctx.args.writers, rounds=ctx.args.rounds)
    ctx.emit(report.as_dict(), _text(report))
    return 0 if report.passed else 1


def _text(report: ProbeReport) -> str:
    rows = [("ok" if c.passed else "FAILED", c.name, c.detail) for c in report.checks]
    verdict = (
        "it enforces conditional writes: objq can use it"
        if report.passed
        else "it does NOT enforce conditional writes: objq refuses it (jobs would be lost "
        "silently); fix or replace the store"
    )
    return "\n".join(
        [
            f"{printable(report.url)}: {counted(len(report.checks), 'check')}, "
            f"{counted(report.requests, 'request')}",
            table(["result", "check", "seen"], rows),
            f"{'ok' if report.passed else 'FAILED'}: {verdict}",
        ]
    )
