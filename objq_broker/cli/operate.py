"""Commands that change a namespace: ``declare``, ``enqueue``, ``enqueue-cmd``,
``dead retry|purge``, ``purge``, ``requeue-stale``, ``config set`` and ``worker``."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from objq_broker import builders
from objq_broker.cli import cmdjob
from objq_broker.cli.commands import (
    CommandAfterDashes,
    F,
    Handler,
    command,
    config,
    dead,
    objq,
    queues,
)
from objq_broker.cli.context import Context
from objq_broker.cli.inspect import config_dict, parse_duration
from objq_broker.cli.output import Cancelled, UsageError, confirm, counted, progress
from objq_broker.cli.values import (
    DURATION,
    DURATION_SETTINGS,
    FLAG,
    FLAGS,
    POSITIVE_DURATION,
    SETTINGS,
    UTF8,
    checked_setting,
    whole,
)
from objq_broker.model.checks import MAX_ATTEMPTS, MAX_CLAIM, PRIORITY_RANGE
from objq_broker.queue import Queue
from objq_broker.typed.schema import PayloadInvalid, Schema

#: Jobs per commit of a bulk enqueue (each batch is all-or-none).
DEFAULT_ENQUEUE_BATCH = 1000
#: A file of payloads, one a line, checked before the store is opened; '-' is stdin.
PAYLOADS = click.Path(exists=True, dir_okay=False, readable=True, allow_dash=True)


def settings_options(handler: Handler) -> Handler:
    """``declare``'s option for each setting, checked as ``config set`` checks it."""
    for name in reversed(SETTINGS):
        if name in DURATION_SETTINGS:
            option = click.option(f"--{name}", type=POSITIVE_DURATION, metavar="VALUE")
        elif name == "group-concurrency":
            option = click.option(f"--{name}", type=whole(1, MAX_CLAIM), metavar="N")
        elif name == "fairness":
            option = click.option(f"--{name}", type=FLAG, metavar="on|off")
        else:  # max-attempts: the queue API's refusal names it, as for `config set`
            option = click.option(f"--{name}", metavar="VALUE")
        handler = option(handler)
    return handler


def setting_value(name: str, raw: str) -> tuple[str, float | int | bool | None]:
    """The stored field and value for a setting given as ``lease 30s``, ``max_attempts 3``,
    ``group-concurrency 1`` (``none`` lifts the cap) or ``fairness off``."""
    lookup = {**SETTINGS, **{field: field for field in SETTINGS.values()}}
    stored = lookup.get(name) or lookup.get(name.replace("_", "-"))
    if stored is None:
        raise UsageError(f"setting {name!r}: expected one of {', '.join(SETTINGS)}")
    if stored == "fairness":
        flag = FLAGS.get(raw.lower())
        if flag is None:
            raise UsageError(f"fairness: expected on or off, found {raw!r}")
        return stored, flag
    if stored == "group_concurrency" and raw.lower() == "none":
        return stored, None
    if stored in ("max_attempts", "group_concurrency"):
        try:
            return stored, int(raw)
        except ValueError:
            shown_name = stored.replace("_", "-")
            raise UsageError(f"{shown_name}: expected a whole number, found {raw!r}") from None
    return stored, parse_duration(raw)


def _settings(ctx: Context) -> dict[str, float | int | bool | None]:
    given = {name: getattr(ctx.args, name.replace("-", "_"), None) for name in SETTINGS}
    return dict(setting_value(name, str(raw)) for name, raw in given.items() if raw is not None)


def job_options(function: F) -> F:
    """The settings of the jobs an enqueue makes, as ``enqueue`` and ``enqueue-cmd`` take them."""
    for option in reversed(
        [
            click.option(
                "--priority", type=whole(*PRIORITY_RANGE), default=0, help="lower runs first (0)"
            ),
            click.option(
                "--delay",
                type=DURATION,
                metavar="SECONDS",
                help="run no earlier than this (30s, 2h)",
            ),
            click.option("--max-attempts", type=whole(1, MAX_ATTEMPTS)),
            click.option(
                "--group",
                type=UTF8,
                metavar="NAME",
                help="the group (tenant) of the jobs: claims are fair among groups",
            ),
            click.option("--key", type=UTF8, help="idempotency key"),
        ]
    ):
        function = option(function)
    return function


def dead_letters_chosen(function: F) -> F:
    """A queue and which of its dead letters: IDs, or ``--all`` (:func:`_chosen_ids`)."""
    function = click.option("--all", is_flag=True, help="all of the queue's dead letters")(function)
    function = click.argument("ids", nargs=-1, metavar="[ID]...")(function)
    return click.argument("queue")(function)


@command(objq, "declare", "declare a queue")
@click.argument("queue")
@settings_options
def cmd_declare(ctx: Context) -> int:
    ctx.snapshot(create=True)
    queue = ctx.queue(create=True)
    settings = _settings(ctx)
    created = queue.declare(ctx.args.queue, **settings)
    config = queue.configure(ctx.args.queue, **settings) if settings and not created else None
    config = config or queue.config(ctx.args.queue)
    result = {"queue": ctx.args.queue, "created": created, "config": config_dict(config)}
    ctx.emit(result, f"queue {ctx.args.queue!r} {'declared' if created else 'already declared'}")
    return 0


def _shown_setting(value: float | int | bool | None) -> str:
    if value is None or isinstance(value, bool):
        return {None: "none", True: "on", False: "off"}[value]
    return f"{value:g}"


@command(
    config,
    "set",
    f"set one: QUEUE KEY VALUE. KEY: {', '.join(SETTINGS)}. VALUE: a number; durations take "
    "s/m/h/d; fairness: on or off; group-concurrency: none lifts the cap",
)
@click.argument("queue")
@click.argument("key", metavar="KEY")
@click.argument("value", metavar="VALUE", callback=checked_setting)
def cmd_config_set(ctx: Context) -> int:
    ctx.snapshot()
    stored, value = setting_value(ctx.args.key, ctx.args.value)
    config = ctx.queue().configure(ctx.args.queue, **{stored: value})
    ctx.emit(
        {"queue": ctx.args.queue, "config": config_dict(config)},
        f"queue {ctx.args.queue!r}: {stored} = {_shown_setting(value)}",
    )
    return 0


# --- enqueue ---------------------------------------------------------------------------------


def _enqueue_options(ctx: Context) -> dict[str, Any]:
    a = ctx.args
    return {
        "priority": a.priority,
        "delay": None if a.delay is None else parse_duration(a.delay),
        "max_attempts": a.max_attempts,
        "group": a.group,
    }


@command(objq, "enqueue", "add jobs: one (PAYLOAD, as text), or a file's")
@click.argument("queue")
@click.argument("payload", required=False, type=UTF8)
@click.option("--file", type=PAYLOADS, metavar="F", help="one payload per line of F ('-': stdin)")
@click.option("--jsonl", type=PAYLOADS, metavar="F", help="one JSON document per line of F")
@click.option(
    "--schema",
    metavar="MODULE:TYPE",
    help="check every payload against this type before anything is committed",
)
@click.option(
    "--batch",
    type=whole(),
    default=DEFAULT_ENQUEUE_BATCH,
    help=f"jobs per commit ({DEFAULT_ENQUEUE_BATCH})",
)
@click.option(
    "--group-field",
    type=UTF8,
    metavar="FIELD",
    help="with --jsonl: each line's top-level FIELD names its job's group",
)
@job_options
def cmd_enqueue(ctx: Context) -> int:
    a = ctx.args
    given = [name for name in ("payload", "file", "jsonl") if getattr(a, name) is not None]
    if len(given) != 1:
        raise UsageError(
            "enqueue: expected exactly one of PAYLOAD, --file F or --jsonl F, found "
            + (", ".join(given) or "none")
        )
    if a.key is not None and a.payload is None:
        raise UsageError("enqueue: --key names one job; it cannot be used with --file or --jsonl")
    if a.group_field is not None and (a.jsonl is None or a.group is not None):
        raise UsageError(
            "enqueue: --group-field reads each line's group from --jsonl; expected --jsonl "
            "and no --group, found " + ("--group" if a.group is not None else "no --jsonl")
        )
    options = _enqueue_options(ctx)
    schema = _schema(a.schema)
    if a.payload is not None:
        payload = _checked(schema, a.payload.encode(), "PAYLOAD")
        return _enqueue_one(ctx, payload, key=a.key, **options)
    lines = _read_payloads(a.file or a.jsonl, jsonl=a.jsonl is not None, schema=schema)
    payloads = list(lines)
    groups = None if a.group_field is None else _groups(payloads, a.group_field, a.jsonl)
    ctx.snapshot(create=True)
    queue = ctx.queue(create=True)
    ids: list[str] = []
    try:
        with progress(len(payloads), f"enqueue {a.queue}", enabled=not ctx.json) as advance:
            for start in range(0, len(payloads), a.batch):
                chunk = slice(start, start + a.batch)
                ids += _enqueue_chunk(
                    queue,
                    a.queue,
                    payloads[chunk],
                    None if groups is None else groups[chunk],
                    options,
                )
                advance(len(ids), "")
    except KeyboardInterrupt:
        raise Cancelled(
            f"interrupted: {len(ids)} of {counted(len(payloads), 'job')} were enqueued to "
            f"{a.queue!r}, the rest were not"
        ) from None
    commits = -(-len(payloads) // a.batch)
    ctx.emit(
        {"queue": a.queue, "enqueued": len(ids), "ids": ids},
        f"enqueued {counted(len(ids), 'job')} to {a.queue!r} in {counted(commits, 'commit')}",
    )
    return 0


def _groups(payloads: list[bytes], field: str, path: str) -> list[str | None]:
    """Each JSON line's ``field`` (None where it has none), checked as a group name before
    anything is enqueued."""
    found: list[str | None] = []
    for number, payload in enumerate(payloads, 1):
        document = json.loads(payload)
        group = document.get(field) if isinstance(document, dict) else None
        if group is not None and (not isinstance(group, str) or not group):
            raise UsageError(
                f"{path}, document {number}: expected {field!r} to be a group name (a "
                f"non-empty string), found {json.dumps(group)[:40]}"
            )
        found.append(group)
    return found


def _enqueue_chunk(
    queue: Queue,
    name: str,
    payloads: list[bytes],
    groups: list[str | None] | None,
    options: dict[str, Any],
) -> list[str]:
    """Enqueue ``payloads`` to ``name`` in one commit (each of its group, if ``groups``); the
    job ids, in the payloads' order."""
    if groups is None:
        return [job.id for job in queue.enqueue_many(name, payloads, **options)]
    given = {key: value for key, value in options.items() if key != "group"}
    op = builders.enqueue(name, payloads, groups=groups, **given)
    return [job.id for job in queue.submit(op).result()]


def _enqueue_one(ctx: Context, payload: bytes, *, key: str | None, **options: Any) -> int:
    ctx.snapshot(create=True)
    job = ctx.queue(create=True).enqueue(ctx.args.queue, payload, key=key, **options)
    ctx.emit({"queue": ctx.args.queue, "enqueued": 1, "ids": [job.id]}, job.id)
    return 0


def _schema(path: str | None) -> Schema[Any] | None:
    """The type ``--schema`` names, its module imported from the current directory too (as
    ``celery -A`` does): the ``objq`` script puts only its own directory on the path."""
    if path is None:
        return None
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    return Schema.from_path(path)


def _checked(schema: Schema[Any] | None, payload: bytes, where: str) -> bytes:
    """``payload``, or a usage error if it does not validate against ``schema``."""
    if schema is not None:
        try:
            schema.decode(payload, where=where)
        except PayloadInvalid as exc:
            raise UsageError(str(exc)) from None
    return payload


def _read_payloads(path: str, *, jsonl: bool, schema: Schema[Any] | None) -> Iterator[bytes]:
    """One payload per non-empty line (``-`` reads stdin); JSON lines, and lines against a
    schema, are checked first, so a bad line refuses the whole file before anything is
    enqueued."""
    if path == "-":
        data = sys.stdin.buffer.read()
    else:
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise UsageError(f"enqueue: cannot read {path!r}: {exc.strerror or exc}") from None
    for number, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        if jsonl:
            try:
                json.loads(line)
            except ValueError as exc:
                raise UsageError(
                    f"{path}, line {number}: expected a JSON document, found {line[:40]!r} ({exc})"
                ) from None
        yield _checked(schema, line.strip() if jsonl else line, f"{path}, line {number}")


@command(
    objq,
    "enqueue-cmd",
    "add a command job: QUEUE [options] -- COMMAND [ARGS...]",
    cls=CommandAfterDashes,
)
@click.argument("queue")
@click.option("--shell", is_flag=True, help="run the words with /bin/sh -c")
@click.option(
    "--timeout", type=POSITIVE_DURATION, metavar="SECONDS", help="kill it after this long"
)
@click.option("--env", type=UTF8, multiple=True, metavar="NAME=VALUE")
@click.option("--cwd", type=UTF8, metavar="DIR")
@job_options
def cmd_enqueue_cmd(ctx: Context) -> int:
    a = ctx.args
    argv = list(a.argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        raise UsageError("enqueue-cmd: expected a command after '--', found none")
    env: dict[str, str] = {}
    for item in a.env or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"--env: expected NAME=VALUE, found {item!r}")
        env[name] = value
    job = cmdjob.CommandJob(
        argv=[" ".join(argv)] if a.shell else argv,
        shell=a.shell,
        timeout=None if a.timeout is None else parse_duration(a.timeout),
        env=env,
        cwd=a.cwd,
    )
    return _enqueue_one(ctx, job.encode(), key=a.key, **_enqueue_options(ctx))


# --- dead letters, purge, stale leases -------------------------------------------------------


def _chosen_ids(ctx: Context, what: str) -> list[str] | None:
    if bool(ctx.args.ids) == bool(ctx.args.all):
        raise UsageError(
            f"dead {what}: expected job ids or --all (one of them), found "
            + ("both" if ctx.args.ids else "neither")
        )
    return None if ctx.args.all else list(ctx.args.ids)


@command(dead, "retry", "move dead letters back to their queue")
@dead_letters_chosen
def cmd_dead_retry(ctx: Context) -> int:
    ids = _chosen_ids(ctx, "retry")
    ctx.snapshot()
    retried = ctx.queue().retry_dead(ctx.args.queue, ids)
    ctx.emit(
        {"queue": ctx.args.queue, "retried": retried},
        f"queue {ctx.args.queue!r}: {counted(len(retried), 'dead letter')} back in the queue",
    )
    return 0


@command(dead, "purge", "delete dead letters (asks first)")
@dead_letters_chosen
def cmd_dead_purge(ctx: Context) -> int:
    ids = _chosen_ids(ctx, "purge")
    snap = ctx.snapshot()
    count = len(snap.dead_letters(ctx.args.queue)) if ids is None else len(ids)
    confirm(
        f"delete {counted(count, 'dead letter')} of queue {ctx.args.queue!r} for good?",
        yes=ctx.yes,
    )
    purged = ctx.queue().purge_dead(ctx.args.queue, ids)
    ctx.emit(
        {"queue": ctx.args.queue, "purged": purged},
        f"queue {ctx.args.queue!r}: {counted(purged, 'dead letter')} deleted",
    )
    return 0


@command(objq, "purge", "delete ready and delayed jobs")
@click.argument("queue")
def cmd_purge(ctx: Context) -> int:
    snap = ctx.snapshot()
    stats = snap.stats(ctx.args.queue)
    count = stats.ready + stats.delayed
    confirm(
        f"delete the {counted(count, 'ready and delayed job')} of queue {ctx.args.queue!r} "
        "for good?",
        yes=ctx.yes,
    )
    purged = ctx.queue().purge(ctx.args.queue)
    ctx.emit(
        {"queue": ctx.args.queue, "purged": purged},
        f"queue {ctx.args.queue!r}: {counted(purged, 'job')} deleted (jobs in flight finish "
        "normally)",
    )
    return 0


@command(queues, "delete", "delete a queue and all its jobs")
@click.argument("queue")
def cmd_queue_delete(ctx: Context) -> int:
    name = ctx.args.queue
    stats = ctx.snapshot().stats(name)  # an unknown queue stops here, with its one-line error
    jobs = stats.ready + stats.delayed + stats.in_flight + stats.dead
    confirm(
        f"delete queue {name!r}, its settings and its {counted(jobs, 'job')} "
        f"({stats.in_flight} in flight, {stats.dead} dead) for good?",
        yes=ctx.yes,
    )
    deleted = ctx.queue().delete_queue(name)
    ctx.emit(
        {"queue": name, "deleted_jobs": deleted},
        f"queue {name!r} deleted with {counted(deleted, 'job')} (a worker still holding one "
        "of them gets LeaseLost when it settles it)",
    )
    return 0


@command(objq, "requeue-stale", "expire stale leases now")
def cmd_requeue_stale(ctx: Context) -> int:
    ctx.snapshot()
    count = ctx.queue().expire()
    ctx.emit(
        {"requeued": count},
        f"{counted(count, 'job')} whose lease had expired "
        + ("is back in its queue" if count == 1 else "are back in their queues"),
    )
    return 0
