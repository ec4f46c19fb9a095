"""``objq workers``, ``objq budget`` and ``objq cost``: who is working, and what the namespace
may spend on storage writes and does.

``objq cost`` measures the state's write rate by reading the state twice, ``--over`` apart
(its version counts commits), and prices it: each commit is one PUT of the state object, and
each reader of a changed state one GET. Prices are list prices per 1,000 requests: S3 Standard
(us-east-1) and GCS Standard (class A writes, class B reads); ``--price-per-1000-puts`` and
``--price-per-1000-gets`` price another store. Objects written beside the state (the archive
of finished jobs, runs of deep queues, out-of-line payloads) add to the PUTs: see
``docs/deploy.md`` for measured requests per 1,000 jobs.
"""

from __future__ import annotations

import time
from typing import Any

import click

from objq_broker.cli.commands import command, objq
from objq_broker.cli.context import Context
from objq_broker.cli.output import counted, printable, table
from objq_broker.cli.values import POSITIVE_SECONDS, PRICE, RATE, whole
from objq_broker.model.shown import age

#: List prices in dollars per 1,000 requests: (writes, reads).
PRICES_PER_1000 = {
    "S3 Standard": (0.005, 0.0004),
    "GCS Standard": (0.005, 0.0004),
}
DAY = 86_400
MONTH = 30 * DAY


@command(objq, "workers", "who holds jobs, and who is gone")
def cmd_workers(ctx: Context) -> int:
    snap = ctx.snapshot()
    rows = snap.workers()
    if ctx.json:
        ctx.emit([_worker_dict(row) for row in rows], "")
        return 0
    if not rows:
        print("no worker holds a job (idle workers hold nothing and are not listed)")
        return 0
    now = snap.read_at
    print(
        table(
            ["OWNER", "STATUS", "HOST", "PID", "FRAMEWORK", "QUEUES", "HELD", "OLDEST", "SEEN"],
            [
                [
                    printable(w.owner),
                    w.status,
                    printable(w.host or "-"),
                    w.pid or "-",
                    printable(w.framework or "-"),
                    printable(",".join(w.queues) or "-"),
                    w.jobs_held,
                    _ago(w.oldest_claimed_at, now),
                    _ago(w.last_seen_at, now),
                ]
                for w in rows
            ],
        )
    )
    return 0


def _worker_dict(row: Any) -> dict[str, Any]:
    return {
        "owner": row.owner,
        "status": row.status,
        "host": row.host,
        "pid": row.pid,
        "framework": row.framework,
        "queues": row.queues,
        "jobs_held": row.jobs_held,
        "oldest_claimed_at": row.oldest_claimed_at,
        "last_seen_at": row.last_seen_at,
    }


def _ago(at: float | None, now: float) -> str:
    return "-" if at is None else f"{age(max(now - at, 0.0))} ago"


@command(
    objq,
    "budget",
    "show or set the write budget: at most WRITES_PER_SECOND state writes per second for the "
    "namespace; off: no limit",
)
@click.argument("writes_per_second", required=False, type=RATE, metavar="[WRITES_PER_SECOND]")
def cmd_budget(ctx: Context) -> int:
    given = ctx.args.writes_per_second
    if given is None:
        budget = ctx.snapshot().write_budget
    else:
        budget = ctx.queue(create=True).set_write_budget(None if given == "off" else float(given))
    text = (
        "no write budget: the state is written as often as the work needs"
        if budget is None
        else f"write budget: at most {budget:g} state writes per second"
    )
    ctx.emit({"writes_per_second": budget}, text)
    return 0


@command(objq, "cost", "measure state writes, price them")
@click.option(
    "--over",
    type=POSITIVE_SECONDS,
    default=10.0,
    metavar="SECONDS",
    help="measure for SECONDS (10)",
)
@click.option(
    "--readers",
    type=whole(0, 100_000),
    default=0,
    help="processes reading each new state (direct-mode consumers; 0 with a broker)",
)
@click.option("--price-per-1000-puts", type=PRICE, metavar="USD")
@click.option("--price-per-1000-gets", type=PRICE, metavar="USD")
def cmd_cost(ctx: Context) -> int:
    a = ctx.args
    first = ctx.snapshot()
    time.sleep(a.over)
    second = ctx.snapshot()
    rate = max(second.version - first.version, 0) / max(second.read_at - first.read_at, 1e-9)
    prices = dict(PRICES_PER_1000)
    if a.price_per_1000_puts is not None or a.price_per_1000_gets is not None:
        writes, reads = PRICES_PER_1000["S3 Standard"]
        prices = {"given prices": (a.price_per_1000_puts or writes, a.price_per_1000_gets or reads)}
    report: dict[str, Any] = {
        "measured_seconds": a.over,
        "state_writes_per_second": rate,
        "write_budget": second.write_budget,
        "readers": a.readers,
        "estimates": {},
    }
    for store, (write_price, read_price) in prices.items():
        puts_day = rate * DAY
        gets_day = rate * a.readers * DAY
        day = puts_day / 1000 * write_price + gets_day / 1000 * read_price
        report["estimates"][store] = {
            "puts_per_day": puts_day,
            "gets_per_day": gets_day,
            "dollars_per_day": day,
            "dollars_per_month": day * MONTH / DAY,
        }
    ctx.emit(report, _cost_text(report))
    return 0


def _cost_text(report: dict[str, Any]) -> str:
    budget = report["write_budget"]
    head = (
        f"{report['state_writes_per_second']:.3g} state writes/s measured over "
        f"{report['measured_seconds']:g} s"
        + ("" if budget is None else f" (budget: {budget:g}/s)")
        + f"; {counted(report['readers'], 'reader')} each reading every new state"
    )
    rows = [
        [
            store,
            f"{e['puts_per_day']:,.0f}",
            f"{e['gets_per_day']:,.0f}",
            f"${e['dollars_per_day']:,.2f}",
            f"${e['dollars_per_month']:,.2f}",
        ]
        for store, e in report["estimates"].items()
    ]
    return head + "\n" + table(["STORE", "PUTS/DAY", "GETS/DAY", "$/DAY", "$/MONTH"], rows)
