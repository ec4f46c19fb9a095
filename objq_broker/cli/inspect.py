"""Commands that only read: ``status``, ``jobs list|show``, ``dead list``, ``config show``,
``archive list|cat``. None of them writes to the store."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import click
import msgspec

from objq_broker.cli.commands import archive, command, config, dead, jobs, objq
from objq_broker.cli.context import Context
from objq_broker.cli.output import UsageError, counted, print_json, printable, table
from objq_broker.cli.render import job_dict, payload_fields, payload_preview
from objq_broker.cli.values import DURATION, MOMENT, whole
from objq_broker.engine.snapshot import ACTIVE_CLIENT_SECONDS, Snapshot
from objq_broker.errors import JobNotFound
from objq_broker.model import durations
from objq_broker.model.records import Job, QueueConfig
from objq_broker.model.shown import age, size, when

#: What ``jobs list --state`` may name.
JOB_STATES = ["ready", "delayed", "in-flight", "dead"]


def parse_duration(text: str) -> float:
    """Seconds from ``90``, ``90s``, ``15m``, ``2h`` or ``7d``."""
    return durations.parse_duration(text)


def parse_time(text: str) -> float:
    """A Unix time from an ISO 8601 date/time (UTC unless it says otherwise), a Unix time
    in seconds, or a duration (``2h``) meaning that long ago."""
    return durations.parse_time(text, time.time())


# --- status ----------------------------------------------------------------------------------


#: The window of the finished-job counts of ``objq status``.
FINISHED_WINDOW_SECONDS = 3600.0
#: The outcomes ``objq status`` counts (a job a framework sent again, "retried", counts as the
#: new job it became).
FINISHED_OUTCOMES = ("done", "failed", "dead")


def finished_counts(snap: Snapshot) -> dict[str, dict[str, int]]:
    """Per queue, how many jobs finished done, failed and dead in the hour before ``snap``
    was read. Read from the state's archive tail and the archive objects of that hour (a LIST
    of the day's folder, a GET per object; see ``engine.archive``), never the whole archive;
    each job counts once, with the worst outcome its records say."""
    from objq_broker.engine.archive import iter_archive, worst_outcomes

    counts = {name: dict.fromkeys(FINISHED_OUTCOMES, 0) for name in snap.queue_names()}
    if not snap.exists:
        return counts
    since = snap.read_at - FINISHED_WINDOW_SECONDS
    records = iter_archive(snap.store, since, None, tail=snap.archive_tail)
    for (queue, _), outcome in worst_outcomes(records).items():
        if queue in counts and outcome in FINISHED_OUTCOMES:
            counts[queue][outcome] += 1
    return counts


def status_dict(snap: Snapshot) -> dict[str, Any]:
    queues = []
    finished = finished_counts(snap)
    for name in snap.queue_names():
        stats = snap.stats(name)
        queues.append(
            {
                "queue": name,
                "ready": stats.ready,
                "delayed": stats.delayed,
                "in_flight": stats.in_flight,
                "dead": stats.dead,
                "oldest_ready_age_seconds": stats.oldest_ready_age_seconds,
                "groups": stats.groups,
                "busiest_groups": [msgspec.structs.asdict(group) for group in stats.busiest],
                # Jobs that finished in the last hour, by outcome (the archive's records).
                "last_hour": finished[name],
            }
        )
    return {
        "url": snap.store.url,
        "exists": snap.exists,
        "version": snap.version,
        "size_bytes": snap.size_bytes,
        "committed_at": snap.committed_at,
        "read_at": snap.read_at,
        "broker": _broker_dict(snap),
        "write_budget": snap.write_budget,
        # Finished jobs whose records the state still holds (``objq archive list``).
        "archive_tail_records": len(snap.archive_tail),
        "queues": queues,
    }


def _broker_dict(snap: Snapshot) -> dict[str, Any] | None:
    record = snap.broker
    if record is None:
        return None
    return {
        "address": record.address,
        "epoch": record.epoch,
        "since": record.since,
        "secured": record.secured,
        "active_clients": snap.broker_clients(ACTIVE_CLIENT_SECONDS),
    }


def status_text(status: dict[str, Any]) -> str:
    if not status["exists"]:
        return f"{printable(status['url'])}: no state yet (nothing was ever enqueued here)"
    committed = status["committed_at"]
    since = None if committed is None else max(status["read_at"] - committed, 0.0)
    head = (
        f"{printable(status['url'])}  state version {status['version']:,}, "
        f"{size(status['size_bytes'])}, last commit {when(committed)} ({age(since)} ago)"
    )
    rows = [
        [
            q["queue"],
            q["ready"],
            q["delayed"],
            q["in_flight"],
            q["dead"],
            age(q["oldest_ready_age_seconds"]),
            *(q["last_hour"][outcome] for outcome in FINISHED_OUTCOMES),
        ]
        for q in status["queues"]
    ]
    broker = status.get("broker")
    if broker is not None:
        head += (
            f"\nbroker {printable(broker['address'])} (epoch {broker['epoch']}, since "
            f"{when(broker['since'])}), {counted(broker['active_clients'], 'client')} committed "
            "in the "
            f"last {age(ACTIVE_CLIENT_SECONDS)}"
        )
    if status.get("write_budget") is not None:
        head += f"\nwrite budget: at most {status['write_budget']:g} state writes per second"
    if status.get("archive_tail_records"):
        head += (
            f"\narchive tail: {counted(status['archive_tail_records'], 'finished job')} kept "
            "in the state until they fill an archive object"
        )
    if not rows:
        return head + "\nno queues declared"
    headers = [
        "QUEUE",
        "READY",
        "DELAYED",
        "IN FLIGHT",
        "DEAD",
        "OLDEST READY",
        *(f"{outcome.upper()} 1H" for outcome in FINISHED_OUTCOMES),
    ]
    grouped = [q for q in status["queues"] if q.get("groups")]
    if grouped:  # a column only where some queue's jobs name groups
        headers.append("GROUPS")
        for row, q in zip(rows, status["queues"], strict=True):
            row.append(q.get("groups") or "")
    return head + "\n" + table(headers, rows) + "".join(map(_busiest_text, grouped))


def _busiest_text(queue: dict[str, Any]) -> str:
    """The line naming a queue's busiest groups."""
    busiest = ", ".join(
        f"{printable(g['group'])} ({g['ready']:,} ready, {g['in_flight']:,} in flight, "
        f"oldest {age(g['oldest_ready_age_seconds'])})"
        for g in queue["busiest_groups"]
    )
    return f"\nbusiest groups of {printable(queue['queue'])}: {busiest}"


@command(objq, "status", "a table of every queue")
@click.option(
    "--watch",
    type=DURATION,
    is_flag=False,
    flag_value="2s",
    metavar="EVERY",
    help="refresh every EVERY (2s)",
)
def cmd_status(ctx: Context) -> int:
    watch = ctx.args.watch
    if watch is None:
        status = status_dict(ctx.snapshot())
        ctx.emit(status, status_text(status))
        return 0
    interval = parse_duration(watch)
    clear = sys.stdout.isatty() and not ctx.json
    try:
        while True:
            status = status_dict(ctx.snapshot())
            if clear:
                sys.stdout.write("\x1b[H\x1b[2J")
            ctx.emit(status, status_text(status))
            time.sleep(max(interval, 0.1))
    except KeyboardInterrupt:  # the way to leave --watch
        return 0


# --- jobs ------------------------------------------------------------------------------------


@command(jobs, "list", "jobs of a queue, in claim order")
@click.argument("queue")
@click.option("--state", type=click.Choice(JOB_STATES))
@click.option("--limit", type=whole(), default=100, help="at most this many (100)")
def cmd_jobs_list(ctx: Context) -> int:
    snap = ctx.snapshot()
    found = snap.jobs(ctx.args.queue, ctx.args.state, ctx.args.limit)
    rows = [(state, snap.fill(job)) for state, job in found]
    if ctx.json:
        print_json([job_dict(job, state) for state, job in rows])
        return 0
    print(jobs_table(rows, snap.read_at) if rows else f"queue {ctx.args.queue!r}: no jobs")
    return 0


def jobs_table(rows: Sequence[tuple[str, Job]], now: float) -> str:
    def note(state: str, job: Job) -> str:
        if state == "delayed":
            return f"in {age(job.visible_at - now)}"
        if state == "in-flight" and job.lease is not None:
            return f"{job.lease.owner}, lease {age(max(job.lease.expires_at - now, 0))}"
        return job.error or ""

    return table(
        ["ID", "STATE", "PRI", "DELIVERIES", "PAYLOAD", "NOTE"],
        [
            [
                job.id,
                state,
                job.priority,
                f"{job.attempts} of {job.max_attempts}",
                payload_preview(job),
                note(state, job)[:60],
            ]
            for state, job in rows
        ],
    )


@command(jobs, "show", "one job, payload included")
@click.argument("id")
def cmd_jobs_show(ctx: Context) -> int:
    snap = ctx.snapshot()
    found = snap.find(ctx.args.id)
    if found is None:
        raise JobNotFound(
            f"job {ctx.args.id!r}: not in the state of {snap.store.url} (finished jobs are in "
            "the archive: objq archive cat)"
        )
    state, job = found
    record = job_dict(snap.fill(job), state)
    if ctx.json:
        print_json(record)
        return 0
    for name, value in record.items():
        shown = f"{when(value)} ({value})" if name.endswith("_at") and value else value
        print(f"{name:>16}: {'-' if shown is None else printable(shown)}")
    return 0


@command(dead, "list", "dead letters of a queue")
@click.argument("queue")
def cmd_dead_list(ctx: Context) -> int:
    ctx.args.state = "dead"
    ctx.args.limit = None
    return cmd_jobs_list(ctx)


# --- config ----------------------------------------------------------------------------------


@command(config, "show", "settings of one queue or all")
@click.argument("queue", required=False)
def cmd_config_show(ctx: Context) -> int:
    snap = ctx.snapshot()
    names = [ctx.args.queue] if ctx.args.queue else snap.queue_names()
    configs = {name: snap.config(name) for name in names}
    if ctx.json:
        print_json({name: config_dict(config) for name, config in configs.items()})
        return 0
    if not configs:
        print("no queues declared")
        return 0
    fields = list(config_dict(next(iter(configs.values()))))
    rows = [[name, *config_dict(config).values()] for name, config in configs.items()]
    print(table(["QUEUE", *(f.replace("_seconds", " (s)") for f in fields)], rows))
    return 0


def config_dict(config: QueueConfig) -> dict[str, Any]:
    """Every setting of ``config``, the group settings as they act when unset (no cap,
    fair), so every queue shows the same keys."""
    out: dict[str, Any] = msgspec.to_builtins(config)
    out.pop("group_concurrency", None)
    out.pop("fairness", None)
    return out | {"group_concurrency": config.group_cap, "fairness": config.fair}


# --- archive ---------------------------------------------------------------------------------


def _range(ctx: Context) -> tuple[float | None, float | None]:
    since = None if ctx.args.since is None else parse_time(ctx.args.since)
    until = None if ctx.args.until is None else parse_time(ctx.args.until)
    if since is not None and until is not None and until <= since:
        raise UsageError(f"--until ({when(until)}) must be later than --since ({when(since)})")
    return since, until


@command(archive, "list", "archive objects in a time range")
@click.option("--since", type=MOMENT, metavar="TIME", help="ISO 8601, Unix seconds or an age (2h)")
@click.option("--until", type=MOMENT, metavar="TIME")
def cmd_archive_list(ctx: Context) -> int:
    """The archive objects of a range, then the tail the state keeps when any of its records
    finished in the range (``engine.archive``), named by the state's key, with its count."""
    from objq_broker.engine.archive import (
        TAIL_KEY,
        archive_keys,
        finished_within,
        floor_hour,
        key_hour,
        read_tail,
    )

    since, until = _range(ctx)
    store = ctx.store()
    tail = [r for r in read_tail(store) if finished_within(r, since, until)]
    # (hour, key, records in the tail: None for an object)
    rows: list[tuple[datetime, str, int | None]] = [
        (key_hour(k), k, None) for k in archive_keys(store, since, until)
    ]
    if tail:
        rows.append((floor_hour(tail[0].job.finished_at or 0.0), TAIL_KEY, len(tail)))
    if ctx.json:
        print_json(
            [
                {"key": key, "hour": hour.isoformat()}
                | ({} if count is None else {"tail_records": count})
                for hour, key, count in rows
            ]
        )
    elif rows:
        note = "the state's tail: {}, not yet an object"
        shown = [
            [
                f"{hour:%Y-%m-%d %H}h",
                key,
                "" if count is None else note.format(counted(count, "record")),
            ]
            for hour, key, count in rows
        ]
        print(table(["HOUR (UTC)", "KEY", ""], shown))
    else:
        print("no archive objects in range")
    return 0


@command(archive, "cat", "archived jobs in a time range, as JSON lines")
@click.option("--since", type=MOMENT, metavar="TIME", help="ISO 8601, Unix seconds or an age (2h)")
@click.option("--until", type=MOMENT, metavar="TIME")
@click.option("--queue")
def cmd_archive_cat(ctx: Context) -> int:
    """Archive records as JSON lines (``--json`` or not: they are records, not a report)."""
    from objq_broker.engine.archive import iter_archive

    since, until = _range(ctx)
    wanted = ctx.args.queue
    for record in iter_archive(ctx.store(), since, until):
        job = record.job
        if wanted is not None and job.queue != wanted:
            continue
        line = job_dict(job, record.outcome, payload=False)  # state: "done" or "dead"
        line["commit_id"] = record.commit_id
        line.update(payload_fields(job))
        print_json(line)
    return 0
