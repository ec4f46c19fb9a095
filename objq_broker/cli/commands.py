"""The ``objq`` command on click: its groups, and what every command shares.

Each command is declared where it runs, by decorators on its function::

    @command(jobs, "list", "jobs of a queue, in claim order")
    @click.argument("queue")
    def cmd_jobs_list(ctx: Context) -> int: ...

The function is left as it is (it takes a :class:`~objq_broker.cli.context.Context`). The
options every command takes (``--url``, ``--json``, ``--debug``, ``--yes``) are declared on
every group and command (:class:`Command`, :class:`Group`), and all of them write to the one
:class:`Globals` of the run, so they are accepted before the command word or after it. Option
values are checked as they are parsed (:mod:`objq_broker.cli.values`), naming their option,
before the store is opened.
"""

from __future__ import annotations

import functools
import importlib
import os
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, TypeVar

import click

from objq_broker import __version__
from objq_broker.cli.context import Context
from objq_broker.errors import missing_extra

Handler = Callable[[Context], int]
#: A command's function, as click's decorators take and give it.
F = TypeVar("F", bound=Callable[..., Any])

#: What the top-level help says after the commands.
EPILOG = (
    "--url, $OBJQ_URL: the store (file:///var/lib/objq, s3://bucket/prefix?region=..., "
    "gs://bucket/prefix). Exit status: 0 ok, 1 operational error (storage, missing queue or "
    "job, cancelled), 2 usage error."
)
#: Help of ``--url`` for every command but the demo.
URL_HELP = "store URL (default: $OBJQ_URL)"
#: Top-level modules of the spark extra (pyspark[sql] brings pyarrow and pandas), which
#: ``objq report`` needs.
SPARK_MODULES = frozenset({"pyspark", "py4j", "pyarrow", "pandas", "matplotlib"})


@dataclass
class Globals:
    """The options of every command, wherever they were given on the command line."""

    url: str | None = None
    json: bool = False
    debug: bool = False
    yes: bool = False


def remember(ctx: click.Context, param: click.Parameter, value: Any) -> None:
    """Keep a global option's value in the run's :class:`Globals` (a click callback)."""
    # Only a value given counts: an option after the command word overrides one before it,
    # and a command's defaults never reset what was given to the group.
    if value and param.name is not None:
        setattr(ctx.ensure_object(Globals), param.name, value)


def global_options() -> list[click.Parameter]:
    shared: dict[str, Any] = {"expose_value": False, "callback": remember}
    return [
        click.Option(["--url"], metavar="URL", help=URL_HELP, **shared),
        click.Option(["--json"], is_flag=True, help="JSON output for scripts", **shared),
        click.Option(["--debug"], is_flag=True, help="tracebacks on errors", **shared),
        click.Option(["-y", "--yes"], is_flag=True, help="confirm destructive commands", **shared),
    ]


class Command(click.Command):
    """An ``objq`` command: it takes the options of every command too (but those it declares
    itself), and its group's help lists its help whole."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("short_help", kwargs.get("help"))
        super().__init__(*args, **kwargs)
        own = {param.name for param in self.params}
        self.params += [param for param in global_options() if param.name not in own]


class Group(click.Group):
    """A group of ``objq`` commands; it takes the options of every command too. Given no
    command, it is a usage error (exit status 2), not its help."""

    command_class = Command
    group_class = type  # its own groups are Groups too

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("short_help", kwargs.get("help"))
        kwargs["no_args_is_help"] = False
        super().__init__(*args, **kwargs)
        self.params += global_options()


class CommandAfterDashes(Command):
    """A command whose words after ``--`` are a command line to run, taken as they are (none
    of them is an option of objq's), as ``argv``; the ``--`` is required, so a word meant for
    the job is never read as objq's."""

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


def command(
    group: click.Group, name: str, help_text: str, *, cls: type[Command] = Command
) -> Callable[[Handler], Handler]:
    """Declare ``handler`` as command ``name`` of ``group``, with the arguments and options
    that click's decorators below this one gave it; ``handler`` itself is left unchanged."""

    def declare(handler: Handler) -> Handler:
        # wraps() carries the parameters click's decorators left on the handler over to the
        # callback, where click.command() looks for them.
        @functools.wraps(handler)
        def run(**options: Any) -> int:
            given = click.get_current_context().find_object(Globals) or Globals()
            context = Context(SimpleNamespace(**vars(given), **options))
            try:
                return handler(context)
            finally:
                context.close()

        group.add_command(click.command(name, cls=cls, help=help_text)(run))
        return handler

    return declare


@click.group(
    "objq",
    cls=Group,
    help="Inspect and operate objq queues, run command jobs, and run the demo.",
    epilog=EPILOG,
    # Every context of the run inherits these.
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, prog_name="objq", message="%(prog)s %(version)s")
def objq() -> None:
    """The ``objq`` command."""


jobs = Group("jobs", help="list or show jobs")
config = Group("config", help="per-queue settings")
archive = Group("archive", help="finished jobs")
dead = Group("dead", help="dead letters")
kept_results = Group("results", help="task results kept beside the queue")
queues = Group("queue", help="queues themselves")
for _group in (jobs, config, archive, dead, kept_results, queues):
    objq.add_command(_group)


def build() -> click.Group:
    """The ``objq`` command with every command: each module of this package declares its own
    as it is imported."""
    package = importlib.import_module("objq_broker.cli")
    for module in pkgutil.iter_modules(package.__path__):
        if not module.name.startswith("_"):  # __main__ runs the command
            importlib.import_module(f"{package.__name__}.{module.name}")
    return objq


# Every word after `report` is the report's own, --help included.
@objq.command(
    "report",
    help="reports over the archive (objq-broker[spark])",
    short_help="reports over the archive (objq-broker[spark])",
    add_help_option=False,
    context_settings={"ignore_unknown_options": True},
    cls=click.Command,
)
@click.argument("argv", nargs=-1, type=click.UNPROCESSED)
@click.pass_obj
def report(given: Globals | None, argv: tuple[str, ...]) -> int:
    """``objq report ...``: the Spark reports, imported only when asked for."""
    try:
        module = importlib.import_module("objq_broker.report")
        if given is not None and given.url:
            os.environ["OBJQ_URL"] = given.url  # the report reads the store from there
        status: int = module.main(list(argv))
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
