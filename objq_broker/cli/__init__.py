"""``objq``: inspect and operate queues, run command jobs, and run the demo.

Every command takes ``--url`` (or ``$OBJQ_URL``), ``--json`` and ``--debug``. Exit status: 0
ok; 1 an operational error (storage unreachable, bucket missing, state corrupt, no such queue
or job, a declined confirmation, a missing optional install); 2 a usage error (bad option, bad
URL, bad input). Errors are one line on stderr; ``--debug`` adds the traceback. See
``docs/cli.md``.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback

from objq_broker.errors import ConfigurationError, ObjqError, missing_extra, redacted

#: Exit statuses.
EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
#: Global options that take a value (needed to find the command word before parsing).
_VALUED_GLOBALS = ("--url",)
#: Top-level modules of the spark extra (pyspark[sql] brings pyarrow and pandas), which
#: ``objq report`` needs.
_SPARK_MODULES = frozenset({"pyspark", "py4j", "pyarrow", "pandas", "matplotlib"})


def main(argv: list[str] | None = None) -> int:
    """Run one ``objq`` command; returns its exit status."""
    args_in = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args_in
    try:
        return _run(args_in)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2), already printed
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    except BrokenPipeError:  # `objq archive cat | head`: the reader has what it wanted
        _silence_stdout()
        return EXIT_OK
    except BaseException as exc:
        return _report(exc, debug)


def _run(argv: list[str]) -> int:
    from objq_broker.cli.context import Context
    from objq_broker.cli.output import UsageError
    from objq_broker.cli.parser import build_parser

    command, at = _command_word(argv)
    tail: list[str] = []
    if command == "report":
        argv, tail = argv[: at + 1], argv[at + 1 :]
    elif command == "enqueue-cmd":
        if "--" not in argv:
            raise UsageError("enqueue-cmd: expected QUEUE [options] -- COMMAND [ARGS...]")
        split = argv.index("--")
        argv, tail = argv[:split], argv[split + 1 :]
    args = build_parser().parse_command(argv)
    args.argv = tail
    if command == "report":
        return _report_command(args.__dict__.get("url"), tail)
    context = Context(args)
    try:
        status: int = args.handler(context)
        return status
    finally:
        context.close()


def _command_word(argv: list[str]) -> tuple[str | None, int]:
    """The command (first word that is not a global option or its value), and where it is."""
    skip = False
    for index, word in enumerate(argv):
        if skip:
            skip = False
            continue
        if word in _VALUED_GLOBALS:
            skip = True
            continue
        if not word.startswith("-"):
            return word, index
    return None, len(argv)


def _report_command(url: str | None, rest: list[str]) -> int:
    """``objq report ...``: the Spark reports, imported only when asked for."""
    try:
        report = importlib.import_module("objq_broker.report")
        if url:
            os.environ["OBJQ_URL"] = url  # the report reads the store from the environment
        status: int = report.main(rest)
    except ModuleNotFoundError as exc:
        # pandas and matplotlib are imported only once the report needs them, so a missing
        # one surfaces from main(), not from the import above.
        missing = _missing_module(exc)
        if missing is None or missing.split(".")[0] not in _SPARK_MODULES:
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


def _report(exc: BaseException, debug: bool) -> int:
    from objq_broker.cli.output import Cancelled, UsageError

    if debug:
        # An SDK's own messages in the chain quote endpoints as given, user:password@ too.
        sys.stderr.write(redacted("".join(traceback.format_exception(exc))))
    if isinstance(exc, KeyboardInterrupt):
        sys.stderr.write("objq: interrupted\n")
        return EXIT_ERROR
    if isinstance(exc, ConfigurationError) and isinstance(exc.__cause__, ModuleNotFoundError):
        # An optional install is missing: the command line was right, this host is not.
        sys.stderr.write(f"objq: {_one_line(exc)}\n")
        return EXIT_ERROR
    if isinstance(exc, UsageError | ConfigurationError):
        sys.stderr.write(f"objq: error: {_one_line(exc)}\n")
        return EXIT_USAGE
    if isinstance(exc, Cancelled | ObjqError):
        sys.stderr.write(f"objq: {_one_line(exc)}\n")
        return EXIT_ERROR
    if isinstance(exc, OSError):
        sys.stderr.write(f"objq: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": ") + "\n")
        return EXIT_ERROR
    sys.stderr.write(
        f"objq: unexpected {type(exc).__name__}: {_one_line(exc)} (run with --debug for the "
        "traceback, and please report it)\n"
    )
    return EXIT_ERROR


def _one_line(exc: BaseException) -> str:
    from objq_broker.cli.output import printable

    text = redacted(str(exc) or type(exc).__name__)  # not every error is objq's, redacted
    return printable(" ".join(text.split()))  # a message may quote what the store holds


def _silence_stdout() -> None:
    # Python flushes stdout again at exit; point it at /dev/null so that does not fail too.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
