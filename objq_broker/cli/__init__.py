"""``objq``: inspect and operate queues, run command jobs, and run the demo.

Every command takes ``--url`` (or ``$OBJQ_URL``), ``--json`` and ``--debug``. Exit status: 0
ok; 1 an operational error (storage unreachable, bucket missing, state corrupt, no such queue
or job, a declined confirmation, a missing optional install); 2 a usage error (bad option, bad
URL, bad input). Errors are one line on stderr; ``--debug`` adds the traceback. See
``docs/cli.md``.
"""

from __future__ import annotations

import os
import sys
import traceback

import click

from objq_broker.errors import ConfigurationError, ObjqError, redacted

#: Exit statuses.
EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


def main(argv: list[str] | None = None) -> int:
    """Run one ``objq`` command; returns its exit status."""
    args_in = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args_in
    try:
        return _run(args_in)
    except click.exceptions.Exit as exc:  # --help or --version, already printed
        return exc.exit_code
    except BrokenPipeError:  # `objq archive cat | head`: the reader has what it wanted
        _silence_stdout()
        return EXIT_OK
    except BaseException as exc:
        return _report(exc, debug)


def _run(argv: list[str]) -> int:
    from objq_broker.cli.commands import Globals, build

    objq = build()
    with objq.make_context("objq", argv, obj=Globals()) as ctx:
        status = objq.invoke(ctx)
    return status if isinstance(status, int) else EXIT_OK


def usage_line(exc: click.UsageError) -> str:
    """A usage error as one line, naming the help to read instead of repeating the usage."""
    if isinstance(exc, click.BadParameter) and not isinstance(exc, click.MissingParameter):
        param = exc.param
        if isinstance(param, click.Option):
            message = f"argument {max(param.opts, key=len)}: {exc.message}"
        elif param is not None:
            shown = (param.metavar or "").strip("[].") or param.name  # "[ID]...": "ID"
            message = f"argument {shown}: {exc.message}"
        else:
            message = exc.message
    else:
        message = exc.format_message()
    command = exc.ctx.command_path if exc.ctx is not None else "objq"
    return f"{message.rstrip('.')}; see {command} --help"


def _report(exc: BaseException, debug: bool) -> int:
    from objq_broker.cli.output import Cancelled, UsageError

    if debug:
        # An SDK's own messages in the chain quote endpoints as given, user:password@ too.
        sys.stderr.write(redacted("".join(traceback.format_exception(exc))))
    if isinstance(exc, click.UsageError):
        sys.stderr.write(f"objq: error: {_one_line_text(usage_line(exc))}\n")
        return EXIT_USAGE
    if isinstance(exc, KeyboardInterrupt | click.Abort):
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
    return _one_line_text(str(exc) or type(exc).__name__)


def _one_line_text(text: str) -> str:
    from objq_broker.cli.output import printable

    text = redacted(text)  # not every error is objq's, redacted
    return printable(" ".join(text.split()))  # a message may quote what the store holds


def _silence_stdout() -> None:
    # Python flushes stdout again at exit; point it at /dev/null so that does not fail too.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
