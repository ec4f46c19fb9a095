"""The ``objq`` command line on click: every command, its options and its help text.

Option values are checked as they are parsed (:mod:`objq_broker.cli.values`, click's
``IntRange`` and ``Choice``): a value the store or the queue API would refuse is refused here,
naming its option, before the store is opened. The options every command takes (``--url``,
``--json``, ``--debug``, ``--yes``) are accepted before the command word or after it: each
command and group declares them, and all of them write to the one :class:`Globals` of the run.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import click

from objq_broker import __version__
from objq_broker.broker.settings import BrokerOptions
from objq_broker.cli import (
    broker,
    checkstore,
    dashboard,
    demo,
    exporter,
    fleet,
    gc,
    inspect,
    operate,
    results,
)
from objq_broker.cli.context import Context
from objq_broker.cli.values import (
    DURATION,
    DURATION_SETTINGS,
    FLAG,
    MOMENT,
    POSITIVE_DURATION,
    POSITIVE_SECONDS,
    PRICE,
    RATE,
    UTF8,
    Checked,
    checked_setting,
    setting,
)
from objq_broker.errors import missing_extra
from objq_broker.model.checks import MAX_ATTEMPTS, MAX_CLAIM, PRIORITY_RANGE
from objq_broker.storage.probe import DEFAULT_ROUNDS, DEFAULT_WRITERS

Handler = Callable[[Context], int]

#: Commands one ``objq worker`` runs at once, and ``objq demo`` worker threads, at most: each
#: is a thread (more workers scale further).
MAX_THREADS = 1024
#: Most jobs ``objq demo`` enqueues: they all live in one state object (100,000 job records
#: are about 28 MB of JSON, rewritten by every commit).
MAX_DEMO_JOBS = 100_000
#: What the top-level help says after the commands.
EPILOG = (
    "--url, $OBJQ_URL: the store (file:///var/lib/objq, s3://bucket/prefix?region=..., "
    "gs://bucket/prefix). Exit status: 0 ok, 1 operational error (storage, missing queue or "
    "job, cancelled), 2 usage error."
)
JOB_STATES = ["ready", "delayed", "in-flight", "dead"]
#: Help of ``--url`` for every command but the demo.
URL_HELP = "store URL (default: $OBJQ_URL)"
#: The demo's ``--url``: it never reads $OBJQ_URL, as it empties its queue before it starts.
DEMO_URL_HELP = (
    "store URL (default: ./objq-data; $OBJQ_URL is not used, so the demo never empties "
    "a real queue by accident)"
)
#: Every command and group: ``-h`` as well as ``--help``, and help text as wide as a terminal.
SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
#: Top-level modules of the spark extra (pyspark[sql] brings pyarrow and pandas), which
#: ``objq report`` needs.
SPARK_MODULES = frozenset({"pyspark", "py4j", "pyarrow", "pandas", "matplotlib"})
#: Host and port to serve on.
LISTEN = Checked("host:port", exporter.listen_address)


@dataclass
class Globals:
    """The options of every command, wherever they were given on the command line."""

    url: str | None = None
    json: bool = False
    debug: bool = False
    yes: bool = False


def _remember(ctx: click.Context, param: click.Parameter, value: Any) -> None:
    # Only a value given counts: an option after the command word overrides one before it,
    # and a command's defaults never reset what was given to the group.
    if value and param.name is not None:
        setattr(ctx.ensure_object(Globals), param.name, value)


def global_options(url_help: str = URL_HELP) -> list[click.Parameter]:
    shared: dict[str, Any] = {"expose_value": False, "callback": _remember}
    return [
        click.Option(["--url"], metavar="URL", help=url_help, **shared),
        click.Option(["--json"], is_flag=True, help="JSON output for scripts", **shared),
        click.Option(["--debug"], is_flag=True, help="tracebacks on errors", **shared),
        click.Option(["-y", "--yes"], is_flag=True, help="confirm destructive commands", **shared),
    ]


def _runs(handler: Handler) -> Callable[..., int]:
    """A click callback that runs ``handler`` with the command's options and the globals."""

    @click.pass_obj
    def run(given: Globals, /, **params: Any) -> int:
        context = Context(SimpleNamespace(**vars(given), **params))
        try:
            return handler(context)
        finally:
            context.close()

    return run


def _group(parent: click.Group, name: str, help_text: str) -> click.Group:
    group = click.Group(
        name,
        params=global_options(),
        help=help_text,
        short_help=help_text,
        no_args_is_help=False,  # a group alone is a usage error (exit 2), not its help
        context_settings=SETTINGS,
    )
    parent.add_command(group)
    return group


def _command(
    group: click.Group,
    name: str,
    handler: Handler,
    help_text: str,
    *params: click.Parameter,
    url_help: str = URL_HELP,
    cls: type[click.Command] = click.Command,
) -> None:
    group.add_command(
        cls(
            name,
            params=[*params, *global_options(url_help)],
            callback=_runs(handler),
            help=help_text,
            short_help=help_text,
            context_settings=SETTINGS,
        )
    )


def _whole(low: int = 1, high: int | None = None) -> click.IntRange:
    whole = click.IntRange(low, high)
    whole.name = "whole number"  # its refusal reads "'1.5' is not a valid whole number"
    return whole


class CommandAfterDashes(click.Command):
    """A command whose words after ``--`` are a command line to run, taken as they are (none
    of them is an option of objq's); the ``--`` is required, so a word meant for the job is
    never read as objq's."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" not in args:
            if set(args) & set(self.get_help_option_names(ctx)):
                return super().parse_args(ctx, args)  # shows the help and exits
            raise click.UsageError(
                f"{self.name}: expected QUEUE [options] -- COMMAND [ARGS...]", ctx
            )
        at = args.index("--")
        rest = super().parse_args(ctx, args[:at])
        ctx.params["argv"] = args[at + 1 :]
        return rest


def build() -> click.Group:
    """The ``objq`` command and all its commands."""
    root = click.Group(
        "objq",
        params=global_options(),
        help="Inspect and operate objq queues, run command jobs, and run the demo.",
        epilog=EPILOG,
        no_args_is_help=False,
        context_settings=SETTINGS,
    )
    click.version_option(__version__, prog_name="objq", message="%(prog)s %(version)s")(root)
    _reading_commands(root)
    _writing_commands(root)
    _running_commands(root)
    return root


def _reading_commands(root: click.Group) -> None:
    _command(
        root,
        "status",
        inspect.cmd_status,
        "a table of every queue",
        click.Option(
            ["--watch"],
            type=DURATION,
            is_flag=False,
            flag_value="2s",
            metavar="EVERY",
            help="refresh every EVERY (2s)",
        ),
    )
    _command(root, "workers", fleet.cmd_workers, "who holds jobs, and who is gone")
    _command(
        root,
        "cost",
        fleet.cmd_cost,
        "measure state writes, price them",
        click.Option(
            ["--over"],
            type=POSITIVE_SECONDS,
            default=10.0,
            metavar="SECONDS",
            help="measure for SECONDS (10)",
        ),
        click.Option(
            ["--readers"],
            type=_whole(0, 100_000),
            default=0,
            help="processes reading each new state (direct-mode consumers; 0 with a broker)",
        ),
        click.Option(["--price-per-1000-puts"], type=PRICE, metavar="USD"),
        click.Option(["--price-per-1000-gets"], type=PRICE, metavar="USD"),
    )
    _command(
        root,
        "check-store",
        checkstore.cmd_check_store,
        "check that the store enforces conditional writes (compare-and-set); URL defaults to --url",
        click.Argument(["store_url"], required=False, metavar="[URL]"),
        click.Option(
            ["--writers"],
            type=_whole(2, 64),
            default=DEFAULT_WRITERS,
            help=f"writers racing each round ({DEFAULT_WRITERS})",
        ),
        click.Option(
            ["--rounds"],
            type=_whole(1, 1000),
            default=DEFAULT_ROUNDS,
            help=f"rounds of the race ({DEFAULT_ROUNDS})",
        ),
    )
    jobs = _group(root, "jobs", "list or show jobs")
    _command(
        jobs,
        "list",
        inspect.cmd_jobs_list,
        "jobs of a queue, in claim order",
        click.Argument(["queue"]),
        click.Option(["--state"], type=click.Choice(JOB_STATES)),
        click.Option(["--limit"], type=_whole(), default=100, help="at most this many (100)"),
    )
    _command(
        jobs, "show", inspect.cmd_jobs_show, "one job, payload included", click.Argument(["id"])
    )

    config = _group(root, "config", "per-queue settings")
    _command(
        config,
        "show",
        inspect.cmd_config_show,
        "settings of one queue or all",
        click.Argument(["queue"], required=False),
    )
    _command(
        config,
        "set",
        operate.cmd_config_set,
        f"set one: QUEUE KEY VALUE. KEY: {', '.join(operate.SETTINGS)}. VALUE: a number; "
        "durations take s/m/h/d; fairness: on or off; group-concurrency: none lifts the cap",
        click.Argument(["queue"]),
        click.Argument(["key"], metavar="KEY"),
        click.Argument(["value"], metavar="VALUE", callback=checked_setting),
    )

    archive = _group(root, "archive", "finished jobs")
    _command(
        archive,
        "list",
        inspect.cmd_archive_list,
        "archive objects in a time range",
        *_time_range(),
    )
    _command(
        archive,
        "cat",
        inspect.cmd_archive_cat,
        "archived jobs in a time range, as JSON lines",
        *_time_range(),
        click.Option(["--queue"]),
    )


def _time_range() -> list[click.Parameter]:
    return [
        click.Option(
            ["--since"], type=MOMENT, metavar="TIME", help="ISO 8601, Unix seconds or an age (2h)"
        ),
        click.Option(["--until"], type=MOMENT, metavar="TIME"),
    ]


def _writing_commands(root: click.Group) -> None:
    _command(
        root,
        "enqueue",
        operate.cmd_enqueue,
        "add jobs: one (PAYLOAD, as text), or a file's",
        click.Argument(["queue"]),
        click.Argument(["payload"], required=False, type=UTF8),
        click.Option(["--file"], metavar="F", help="one payload per line of F ('-': stdin)"),
        click.Option(["--jsonl"], metavar="F", help="one JSON document per line of F"),
        click.Option(
            ["--schema"],
            metavar="MODULE:TYPE",
            help="check every payload against this type before anything is committed",
        ),
        click.Option(
            ["--batch"],
            type=_whole(),
            default=operate.DEFAULT_ENQUEUE_BATCH,
            help=f"jobs per commit ({operate.DEFAULT_ENQUEUE_BATCH})",
        ),
        click.Option(
            ["--group-field"],
            type=UTF8,
            metavar="FIELD",
            help="with --jsonl: each line's top-level FIELD names its job's group",
        ),
        *_job_options(),
    )
    _command(
        root,
        "enqueue-cmd",
        operate.cmd_enqueue_cmd,
        "add a command job: QUEUE [options] -- COMMAND [ARGS...]",
        click.Argument(["queue"]),
        click.Option(["--shell"], is_flag=True, help="run the words with /bin/sh -c"),
        click.Option(
            ["--timeout"],
            type=POSITIVE_DURATION,
            metavar="SECONDS",
            help="kill it after this long",
        ),
        click.Option(["--env"], type=UTF8, multiple=True, metavar="NAME=VALUE"),
        click.Option(["--cwd"], type=UTF8, metavar="DIR"),
        *_job_options(),
        cls=CommandAfterDashes,
    )

    dead = _group(root, "dead", "dead letters")
    _command(
        dead, "list", inspect.cmd_dead_list, "dead letters of a queue", click.Argument(["queue"])
    )
    for name, handler, text in (
        ("retry", operate.cmd_dead_retry, "move dead letters back to their queue"),
        ("purge", operate.cmd_dead_purge, "delete dead letters (asks first)"),
    ):
        _command(
            dead,
            name,
            handler,
            text,
            click.Argument(["queue"]),
            click.Argument(["ids"], nargs=-1, metavar="[ID]..."),
            click.Option(["--all"], is_flag=True, help="all of the queue's dead letters"),
        )

    kept = _group(root, "results", "task results kept beside the queue")
    _command(
        kept,
        "purge",
        results.cmd_results_purge,
        "delete expired results",
        _older_than("also those stored before (7d, 12h)"),
        click.Option(["--prefix"], default="results/", help="where they are (results/)"),
    )
    _command(
        root,
        "gc",
        gc.cmd_gc,
        "delete objects no state refers to",
        _older_than("only those written longer ago (1h; less asks first)"),
        click.Option(["--dry-run"], is_flag=True, help="say what would go; delete nothing"),
    )
    _command(
        root,
        "budget",
        fleet.cmd_budget,
        "show or set the write budget: at most WRITES_PER_SECOND state writes per second for "
        "the namespace; off: no limit",
        click.Argument(
            ["writes_per_second"], required=False, type=RATE, metavar="[WRITES_PER_SECOND]"
        ),
    )
    _command(
        root,
        "purge",
        operate.cmd_purge,
        "delete ready and delayed jobs",
        click.Argument(["queue"]),
    )
    queues = _group(root, "queue", "queues themselves")
    _command(
        queues,
        "delete",
        operate.cmd_queue_delete,
        "delete a queue and all its jobs",
        click.Argument(["queue"]),
    )
    _command(root, "requeue-stale", operate.cmd_requeue_stale, "expire stale leases now")
    _command(
        root,
        "declare",
        operate.cmd_declare,
        "declare a queue",
        click.Argument(["queue"]),
        *(_setting_option(name) for name in operate.SETTINGS),
    )


def _setting_option(name: str) -> click.Option:
    """``declare``'s option for setting ``name``, checked as ``config set`` checks it."""
    if name in DURATION_SETTINGS:
        return click.Option([f"--{name}"], type=POSITIVE_DURATION, metavar="VALUE")
    if name == "group-concurrency":
        return click.Option([f"--{name}"], type=_whole(1, MAX_CLAIM), metavar="N")
    if name == "fairness":
        return click.Option([f"--{name}"], type=FLAG, metavar="on|off")
    # max-attempts: the queue API's refusal names it, as for `config set`
    return click.Option([f"--{name}"], metavar="VALUE")


def _older_than(help_text: str) -> click.Option:
    """``--older-than AGE``: the commands that delete objects choose them by age."""
    return click.Option(["--older-than"], type=DURATION, metavar="AGE", help=help_text)


def _job_options() -> list[click.Parameter]:
    low, high = PRIORITY_RANGE
    return [
        click.Option(
            ["--priority"], type=_whole(low, high), default=0, help="lower runs first (0)"
        ),
        click.Option(
            ["--delay"],
            type=DURATION,
            metavar="SECONDS",
            help="run no earlier than this (30s, 2h)",
        ),
        click.Option(["--max-attempts"], type=_whole(1, MAX_ATTEMPTS)),
        click.Option(
            ["--group"],
            type=UTF8,
            metavar="NAME",
            help="the group (tenant) of the jobs: claims are fair among groups",
        ),
        click.Option(["--key"], type=UTF8, help="idempotency key"),
    ]


def _running_commands(root: click.Group) -> None:
    _command(
        root,
        "worker",
        operate.cmd_worker,
        "run command jobs",
        click.Option(["--queue"], required=True),
        click.Option(
            ["--count"], type=_whole(1, MAX_THREADS), default=1, help="commands run at once (1)"
        ),
        click.Option(
            ["--prefetch"],
            type=_whole(0, MAX_CLAIM - MAX_THREADS),  # one claim asks for --count + --prefetch
            help="jobs claimed ahead (default: --count)",
        ),
        click.Option(
            ["--timeout"],
            type=POSITIVE_DURATION,
            metavar="SECONDS",
            help="for jobs that set none",
        ),
        click.Option(["--burst"], is_flag=True, help="exit once the queue is empty"),
        click.Option(
            ["--declare"], is_flag=True, help="declare the queue if missing (else: an error)"
        ),
        click.Option(
            ["--metrics-listen"],
            type=LISTEN,
            metavar="HOST:PORT",
            help="serve this worker's Prometheus metrics at http://HOST:PORT/metrics",
        ),
        click.Option(
            ["--stop-grace"],
            type=DURATION,
            metavar="SECONDS",
            help="after SIGTERM, how long running commands may go on before they are killed "
            "and their jobs given back (25s)",
        ),
        click.Option(
            ["--allow-env"],
            multiple=True,
            metavar="NAME",
            help="let jobs set NAME in their env although it changes what runs (PATH, LD_*, "
            "PYTHONPATH, ...); repeatable",
        ),
    )
    _command(
        root,
        "broker",
        broker.cmd_broker,
        "commit for other processes (or stand by)",
        click.Option(
            ["--listen"],
            help="host:port to serve on ($OBJQ_BROKER_LISTEN, else 127.0.0.1:7700); beyond "
            "loopback needs $OBJQ_BROKER_TOKEN",
        ),
        click.Option(
            ["--advertise"],
            help="host:port other hosts reach this broker at (default: the address listened on)",
        ),
        click.Option(
            ["--takeover-seconds"],
            type=setting(BrokerOptions, "broker_takeover_seconds"),
            help="how long the broker may be unreachable before a standby takes over (5)",
        ),
        click.Option(
            ["--metrics-listen"],
            type=LISTEN,
            metavar="HOST:PORT",
            help="serve the broker's Prometheus metrics at http://HOST:PORT/metrics",
        ),
    )
    _command(
        root,
        "exporter",
        exporter.cmd_exporter,
        "serve Prometheus metrics of the store",
        click.Option(
            ["--listen"],
            type=LISTEN,
            default=exporter.DEFAULT_LISTEN,
            metavar="HOST:PORT",
            help=f"where to serve /metrics ({exporter.DEFAULT_LISTEN}); other hosts need "
            "0.0.0.0:PORT",
        ),
    )
    _command(
        root,
        "dashboard",
        dashboard.cmd_dashboard,
        "a web UI of the store",
        click.Option(
            ["--listen"],
            type=LISTEN,
            default=dashboard.DEFAULT_LISTEN,
            metavar="HOST:PORT",
            help=f"where to serve ({dashboard.DEFAULT_LISTEN}); other hosts need 0.0.0.0:PORT",
        ),
        click.Option(
            ["--token"],
            help="allow retrying and purging dead letters after logging in with this token "
            "(default: $OBJQ_DASHBOARD_TOKEN; none: read-only)",
        ),
    )
    _command(
        root,
        "demo",
        demo.cmd_demo,
        "a few thousand jobs, start to end",
        click.Option(["--jobs"], type=_whole(1, MAX_DEMO_JOBS), default=demo.DEFAULT_JOBS),
        click.Option(["--workers"], type=_whole(1, MAX_THREADS), default=demo.DEFAULT_WORKERS),
        url_help=DEMO_URL_HELP,
    )
    # Every word after `report` is the report's own, --help included.
    root.add_command(
        click.Command(
            "report",
            params=[click.Argument(["argv"], nargs=-1, type=click.UNPROCESSED)],
            callback=_runs(cmd_report),
            help="reports over the archive (objq-broker[spark])",
            short_help="reports over the archive (objq-broker[spark])",
            add_help_option=False,
            context_settings={"ignore_unknown_options": True},
        )
    )


def cmd_report(ctx: Context) -> int:
    """``objq report ...``: the Spark reports, imported only when asked for."""
    try:
        report = importlib.import_module("objq_broker.report")
        if ctx.args.url:
            os.environ["OBJQ_URL"] = ctx.args.url  # the report reads the store from there
        status: int = report.main(list(ctx.args.argv))
    except SystemExit as exc:  # the report's own parser: --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else 2
    except ModuleNotFoundError as exc:
        # pandas and matplotlib are imported only once the report needs them, so a missing
        # one surfaces from main(), not from the import above.
        missing = _missing_module(exc)
        if missing is None or missing.split(".")[0] not in SPARK_MODULES:
            raise
        found = f"no module named {missing!r}"
        raise missing_extra("objq report", missing.split(".")[0], "spark", found) from exc
    return status


def _missing_module(exc: BaseException) -> str | None:
    """The module a ModuleNotFoundError (or one it was raised from) could not find."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ModuleNotFoundError) and cause.name:
            return cause.name
        cause = cause.__cause__
    return None
