"""The ``objq`` command line: every command, its options and its help text.

Option values are checked as they are parsed (the types at the end): a value the store or
the queue API would refuse is refused here, naming its option, before the store is opened.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, NoReturn

from objq_broker.cli import fleet, inspect, operate, values
from objq_broker.model.checks import (
    MAX_ATTEMPTS,
    MAX_CLAIM,
    PRIORITY_RANGE,
)

Handler = Callable[..., int]

#: Global options; accepted before the command or after it.
GLOBAL_HELP = """
--url, $OBJQ_URL: the store (file:///var/lib/objq, s3://bucket/prefix?region=..., gs://bucket/prefix).
exit status: 0 ok, 1 operational error (storage, missing queue or job, cancelled), 2 usage error.
"""
JOB_STATES = ["ready", "delayed", "in-flight", "dead"]
#: Help of ``--url`` for every command but the demo.
URL_HELP = "store URL (default: $OBJQ_URL)"
#: The demo's ``--url``: it never reads $OBJQ_URL, as it empties its queue before it starts.
DEMO_URL_HELP = (
    "store URL (default: ./objq-data; $OBJQ_URL is not used, so the demo never empties "
    "a real queue by accident)"
)


class CommandParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line on stderr, exit status 2.

    argparse prints the usage block and then the error; the ``objq`` promise is one line per
    error, so the line names the help to read instead of repeating the usage.
    """

    def error(self, message: str) -> NoReturn:
        self.refuse(message, self.prog)

    def refuse(self, message: str, command: str) -> NoReturn:
        """Exit 2 with ``message`` on one line, pointing at ``command --help``."""
        root = self.prog.split()[0]
        self.exit(2, f"{root}: error: {' '.join(message.split())}; see {command} --help\n")

    def parse_command(self, argv: list[str]) -> argparse.Namespace:
        """``parse_args``, but an unknown option names the help of the command it was given
        to (argparse reports it from the top-level parser, which only knows ``objq --help``)."""
        args, unknown = self.parse_known_args(argv)
        if unknown:
            command: str = getattr(args, "command_prog", self.prog)
            self.refuse(f"unrecognized arguments: {' '.join(unknown)}", command)
        return args


def _common(url_help: str = URL_HELP) -> argparse.ArgumentParser:
    # SUPPRESS: an option given before the command is not reset by the command's own parser.
    common = argparse.ArgumentParser(add_help=False)
    s = argparse.SUPPRESS
    common.add_argument("--url", default=s, help=url_help)
    common.add_argument("--json", action="store_true", default=s, help="JSON output for scripts")
    common.add_argument("--debug", action="store_true", default=s, help="tracebacks on errors")
    common.add_argument(
        "-y", "--yes", action="store_true", default=s, help="confirm destructive commands"
    )
    return common


def build_parser() -> CommandParser:
    common = _common()
    parser = CommandParser(
        prog="objq",
        description="Inspect and operate objq queues, run command jobs, and run the demo.",
        epilog=GLOBAL_HELP,
        parents=[common],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from objq_broker import __version__

    parser.add_argument("--version", action="version", version=f"objq {__version__}")
    commands = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, parser_class=CommandParser
    )
    _reading_commands(commands, common)
    _writing_commands(commands, common)
    _running_commands(commands, common)
    return parser


def _add(
    group: Any, common: argparse.ArgumentParser, name: str, handler: Handler, help_text: str
) -> argparse.ArgumentParser:
    sub: argparse.ArgumentParser = group.add_parser(
        name, help=help_text, description=help_text, parents=[common]
    )
    # The innermost command's defaults win, so command_prog names the help to point at.
    sub.set_defaults(handler=handler, command_prog=sub.prog)
    return sub


def _group(commands: Any, common: argparse.ArgumentParser, name: str, help_text: str) -> Any:
    return _add(commands, common, name, _missing, help_text).add_subparsers(
        dest="action", metavar="ACTION", required=True, parser_class=CommandParser
    )


def _older_than(sub: argparse.ArgumentParser, help_text: str) -> None:
    """``--older-than AGE``: the commands that delete objects choose them by age."""
    sub.add_argument("--older-than", type=values.duration(), metavar="AGE", help=help_text)


def _reading_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    sub = _add(commands, common, "status", inspect.cmd_status, "a table of every queue")
    sub.add_argument(
        "--watch",
        nargs="?",
        const="2s",
        type=values.duration(),
        metavar="EVERY",
        help="refresh every EVERY (2s)",
    )
    _add(commands, common, "workers", fleet.cmd_workers, "who holds jobs, and who is gone")
    sub = _add(commands, common, "cost", fleet.cmd_cost, "measure state writes, price them")
    sub.add_argument(
        "--over", type=values.seconds_above_zero, default=10.0, help="measure for SECONDS (10)"
    )
    sub.add_argument(
        "--readers",
        type=values.whole(0, 100_000),
        default=0,
        help="processes reading each new state (direct-mode consumers; 0 with a broker)",
    )
    sub.add_argument("--price-per-1000-puts", type=values.price, metavar="USD")
    sub.add_argument("--price-per-1000-gets", type=values.price, metavar="USD")
    from objq_broker.cli import checkstore
    from objq_broker.storage.probe import DEFAULT_ROUNDS, DEFAULT_WRITERS

    sub = _add(
        commands,
        common,
        "check-store",
        checkstore.cmd_check_store,
        "check that the store enforces conditional writes (compare-and-set)",
    )
    sub.add_argument("store_url", nargs="?", metavar="URL", help="the store (default: --url)")
    sub.add_argument(
        "--writers",
        type=values.whole(2, 64),
        default=DEFAULT_WRITERS,
        help=f"writers racing each round ({DEFAULT_WRITERS})",
    )
    sub.add_argument(
        "--rounds",
        type=values.whole(1, 1000),
        default=DEFAULT_ROUNDS,
        help=f"rounds of the race ({DEFAULT_ROUNDS})",
    )
    jobs = _group(commands, common, "jobs", "list or show jobs")
    sub = _add(jobs, common, "list", inspect.cmd_jobs_list, "jobs of a queue, in claim order")
    sub.add_argument("queue")
    sub.add_argument("--state", choices=JOB_STATES)
    sub.add_argument("--limit", type=values.whole(), default=100, help="at most this many (100)")
    sub = _add(jobs, common, "show", inspect.cmd_jobs_show, "one job, payload included")
    sub.add_argument("id")

    config = _group(commands, common, "config", "per-queue settings")
    sub = _add(config, common, "show", inspect.cmd_config_show, "settings of one queue or all")
    sub.add_argument("queue", nargs="?")
    sub = _add(config, common, "set", operate.cmd_config_set, "set one: QUEUE KEY VALUE")
    sub.add_argument("queue")
    sub.add_argument("key", metavar="KEY", help=", ".join(operate.SETTINGS))
    sub.add_argument(
        "value",
        metavar="VALUE",
        action=values.SettingValue,
        help="a number; durations take s/m/h/d; fairness: on or off; group-concurrency: none "
        "lifts the cap",
    )

    archive = _group(commands, common, "archive", "finished jobs")
    for name, handler, text in (
        ("list", inspect.cmd_archive_list, "archive objects in a time range"),
        ("cat", inspect.cmd_archive_cat, "archived jobs in a time range, as JSON lines"),
    ):
        sub = _add(archive, common, name, handler, text)
        sub.add_argument(
            "--since",
            type=values.moment,
            metavar="TIME",
            help="ISO 8601, Unix seconds or an age (2h)",
        )
        sub.add_argument("--until", type=values.moment, metavar="TIME")
        if name == "cat":
            sub.add_argument("--queue")


def _writing_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    sub = _add(commands, common, "enqueue", operate.cmd_enqueue, "add jobs: one, or a file's")
    sub.add_argument("queue")
    sub.add_argument("payload", nargs="?", type=values.utf8_text, help="the payload, as text")
    sub.add_argument("--file", metavar="F", help="one payload per line of F ('-': stdin)")
    sub.add_argument("--jsonl", metavar="F", help="one JSON document per line of F")
    sub.add_argument(
        "--schema",
        metavar="MODULE:TYPE",
        help="check every payload against this type before anything is committed",
    )
    sub.add_argument("--batch", type=values.whole(), default=operate.DEFAULT_ENQUEUE_BATCH)
    sub.add_argument(
        "--group-field",
        metavar="FIELD",
        type=values.utf8_text,
        help="with --jsonl: each line's top-level FIELD names its job's group",
    )
    _job_options(sub)

    sub = _add(
        commands, common, "enqueue-cmd", operate.cmd_enqueue_cmd, "add a command job: Q -- ARGV"
    )
    sub.add_argument("queue")
    sub.add_argument("--shell", action="store_true", help="run the words with /bin/sh -c")
    sub.add_argument(
        "--timeout",
        type=values.duration(above_zero=True),
        metavar="SECONDS",
        help="kill it after this long",
    )
    sub.add_argument("--env", action="append", type=values.utf8_text, metavar="NAME=VALUE")
    sub.add_argument("--cwd", type=values.utf8_text, metavar="DIR")
    _job_options(sub)

    dead = _group(commands, common, "dead", "dead letters")
    sub = _add(dead, common, "list", inspect.cmd_dead_list, "dead letters of a queue")
    sub.add_argument("queue")
    for name, handler, text in (
        ("retry", operate.cmd_dead_retry, "move dead letters back to their queue"),
        ("purge", operate.cmd_dead_purge, "delete dead letters (asks first)"),
    ):
        sub = _add(dead, common, name, handler, text)
        sub.add_argument("queue")
        sub.add_argument("ids", nargs="*", metavar="ID")
        sub.add_argument("--all", action="store_true")

    from objq_broker.cli import results

    kept = _group(commands, common, "results", "task results kept beside the queue")
    sub = _add(kept, common, "purge", results.cmd_results_purge, "delete expired results")
    _older_than(sub, "also those stored before (7d, 12h)")
    sub.add_argument("--prefix", default="results/", help="where they are (results/)")

    from objq_broker.cli import gc

    sub = _add(commands, common, "gc", gc.cmd_gc, "delete objects no state refers to")
    _older_than(sub, "only those written longer ago (1h; less asks first)")
    sub.add_argument("--dry-run", action="store_true", help="say what would go; delete nothing")

    sub = _add(commands, common, "budget", fleet.cmd_budget, "show or set the write budget")
    sub.add_argument(
        "writes_per_second",
        nargs="?",
        type=values.rate,
        metavar="WRITES_PER_SECOND",
        help="at most this many state writes per second for the namespace; off: no limit",
    )
    sub = _add(commands, common, "purge", operate.cmd_purge, "delete ready and delayed jobs")
    sub.add_argument("queue")
    queues = _group(commands, common, "queue", "queues themselves")
    sub = _add(
        queues, common, "delete", operate.cmd_queue_delete, "delete a queue and all its jobs"
    )
    sub.add_argument("queue")
    _add(commands, common, "requeue-stale", operate.cmd_requeue_stale, "expire stale leases now")
    sub = _add(commands, common, "declare", operate.cmd_declare, "declare a queue")
    sub.add_argument("queue")
    for name in operate.SETTINGS:
        if name in values.DURATION_SETTINGS:
            sub.add_argument(f"--{name}", type=values.duration(above_zero=True), metavar="VALUE")
        elif name == "group-concurrency":
            sub.add_argument(f"--{name}", type=values.whole(1, MAX_CLAIM), metavar="N")
        elif name == "fairness":
            sub.add_argument(f"--{name}", type=values.flag, metavar="on|off")
        else:  # max-attempts: the queue API's refusal names it, as for `config set`
            sub.add_argument(f"--{name}", metavar="VALUE")


def _running_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    from objq_broker.cli import broker, dashboard, demo, exporter

    sub = _add(commands, common, "worker", operate.cmd_worker, "run command jobs")
    sub.add_argument("--queue", required=True)
    sub.add_argument(
        "--count", type=values.whole(1, MAX_THREADS), default=1, help="commands run at once (1)"
    )
    sub.add_argument(
        "--prefetch",
        type=values.whole(0, MAX_CLAIM - MAX_THREADS),  # one claim asks for --count + --prefetch
        help="jobs claimed ahead (default: --count)",
    )
    sub.add_argument(
        "--timeout",
        type=values.duration(above_zero=True),
        metavar="SECONDS",
        help="for jobs that set none",
    )
    sub.add_argument("--burst", action="store_true", help="exit once the queue is empty")
    sub.add_argument(
        "--declare", action="store_true", help="declare the queue if missing (else: an error)"
    )
    sub.add_argument(
        "--metrics-listen",
        type=exporter.listen_address,
        metavar="HOST:PORT",
        help="serve this worker's Prometheus metrics at http://HOST:PORT/metrics",
    )
    sub.add_argument(
        "--stop-grace",
        type=values.duration(),
        metavar="SECONDS",
        help="after SIGTERM, how long running commands may go on before they are killed and "
        "their jobs given back (25s)",
    )
    sub.add_argument(
        "--allow-env",
        action="append",
        metavar="NAME",
        help="let jobs set NAME in their env although it changes what runs (PATH, LD_*, "
        "PYTHONPATH, ...); repeatable",
    )

    sub = _add(
        commands, common, "broker", broker.cmd_broker, "commit for other processes (or stand by)"
    )
    sub.add_argument(
        "--listen",
        default=None,
        help="host:port to serve on ($OBJQ_BROKER_LISTEN, else 127.0.0.1:7700); beyond "
        "loopback needs $OBJQ_BROKER_TOKEN",
    )
    sub.add_argument(
        "--advertise",
        default=None,
        help="host:port other hosts reach this broker at (default: the address listened on)",
    )
    from objq_broker.broker.settings import BrokerOptions

    sub.add_argument(
        "--takeover-seconds",
        type=values.setting(BrokerOptions, "broker_takeover_seconds"),
        default=None,
        help="how long the broker may be unreachable before a standby takes over (5)",
    )
    sub.add_argument(
        "--metrics-listen",
        type=exporter.listen_address,
        metavar="HOST:PORT",
        help="serve the broker's Prometheus metrics at http://HOST:PORT/metrics",
    )

    sub = _add(
        commands, common, "exporter", exporter.cmd_exporter, "serve Prometheus metrics of the store"
    )
    sub.add_argument(
        "--listen",
        type=exporter.listen_address,
        default=exporter.DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help=f"where to serve /metrics ({exporter.DEFAULT_LISTEN}); other hosts need 0.0.0.0:PORT",
    )

    sub = _add(commands, common, "dashboard", dashboard.cmd_dashboard, "a web UI of the store")
    sub.add_argument(
        "--listen",
        type=exporter.listen_address,
        default=dashboard.DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help=f"where to serve ({dashboard.DEFAULT_LISTEN}); other hosts need 0.0.0.0:PORT",
    )
    sub.add_argument(
        "--token",
        default=None,
        help="allow retrying and purging dead letters after logging in with this token "
        "(default: $OBJQ_DASHBOARD_TOKEN; none: read-only)",
    )

    # The demo's own --url help: it defaults to ./objq-data, never to $OBJQ_URL.
    demo_common = _common(DEMO_URL_HELP)
    sub = _add(commands, demo_common, "demo", demo.cmd_demo, "a few thousand jobs, start to end")
    sub.add_argument("--jobs", type=values.whole(1, MAX_DEMO_JOBS), default=demo.DEFAULT_JOBS)
    sub.add_argument("--workers", type=values.whole(1, MAX_THREADS), default=demo.DEFAULT_WORKERS)
    _add(commands, common, "report", _missing, "reports over the archive (objq-broker[spark])")


def _job_options(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "--priority", type=values.whole(*PRIORITY_RANGE), default=0, help="lower runs first (0)"
    )
    sub.add_argument(
        "--delay",
        type=values.duration(),
        metavar="SECONDS",
        help="run no earlier than this (30s, 2h)",
    )
    sub.add_argument("--max-attempts", type=values.whole(1, MAX_ATTEMPTS))
    sub.add_argument(
        "--group",
        type=values.utf8_text,
        metavar="NAME",
        help="the group (tenant) of the jobs: claims are fair among groups",
    )
    sub.add_argument("--key", type=values.utf8_text, help="idempotency key")


# --- option values, checked as they are parsed ------------------------------------------------

#: Commands one ``objq worker`` runs at once, and ``objq demo`` worker threads, at most: each
#: is a thread (more workers scale further).
MAX_THREADS = 1024
#: Most jobs ``objq demo`` enqueues: they all live in one state object (100,000 job records
#: are about 28 MB of JSON, rewritten by every commit).
MAX_DEMO_JOBS = 100_000


def _missing(*args: Any) -> int:  # groups always have a required action
    raise AssertionError("a command group was run without its action")
