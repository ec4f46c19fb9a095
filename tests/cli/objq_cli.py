"""Running the real ``objq`` executable of this environment as a subprocess."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from objq_broker.cli.commands import Globals, build
from tests.support.processes import Children, kill

#: Seconds any one ``objq`` command may take before the test fails.
COMMAND_TIMEOUT_SECONDS = 60.0


def objq_command() -> list[str]:
    """The ``objq`` script installed next to this interpreter, else the module it runs."""
    script = Path(sys.executable).parent / "objq"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "objq_broker.cli"]


@dataclass
class Result:
    code: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)

    def json_lines(self) -> list[Any]:
        return [json.loads(line) for line in self.stdout.splitlines() if line.strip()]


def environment(url: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "OBJQ_URL"}
    if url is not None:
        env["OBJQ_URL"] = url
    return env


def run_objq(
    *args: str,
    url: str | None,
    stdin: str | None = None,
    cwd: Path | None = None,
    tty_answer: str | None = None,
) -> Result:
    """Run ``objq ARGS`` against ``url`` (as $OBJQ_URL). ``tty_answer`` gives the command a
    terminal on stdin and types that line into it."""
    command = [*objq_command(), *args]
    if tty_answer is None:
        done = subprocess.run(
            command,
            check=False,
            input=stdin if stdin is not None else "",
            capture_output=True,
            text=True,
            env=environment(url),
            cwd=cwd,
            timeout=COMMAND_TIMEOUT_SECONDS,
        )
        return Result(done.returncode, done.stdout, done.stderr)
    leader, follower = pty.openpty()
    try:
        process = subprocess.Popen(
            command,
            stdin=follower,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=environment(url),
            cwd=cwd,
        )
        os.close(follower)
        follower = -1
        os.write(leader, tty_answer.encode() + b"\n")
        try:
            out, err = process.communicate(timeout=COMMAND_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            kill(process)  # as subprocess.run does on a timeout
            raise
        return Result(process.returncode, out, err)
    finally:
        if follower >= 0:
            os.close(follower)
        os.close(leader)


def one_line_error(result: Result, status: int, *fragments: str) -> None:
    """Assert that ``result`` failed with ``status`` and one ``objq: ...`` line on stderr
    holding every fragment."""
    assert result.code == status, (result.code, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("objq: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def parse_command(argv: list[str]) -> dict[str, Any]:
    """The arguments and options ``objq ARGV`` gives its command, as parsed, without running
    it (ARGV starts with the command's words); a refused value raises click's
    ``BadParameter``, which names its option."""
    words = list(argv)
    command: click.Command = build()
    name = "objq"
    while isinstance(command, click.Group):
        name = words.pop(0)
        command = command.commands[name]
    return command.make_context(name, words, obj=Globals()).params


#: The ``objq`` fixture: ``objq(*args, url=..., stdin=None, cwd=None, tty_answer=None)``.
Objq = Callable[..., Result]


class Workers:
    """``objq worker --json`` processes on one store, children of the test (stopped at its end)."""

    def __init__(self, url: str, children: Children) -> None:
        self.url = url
        self.children = children

    def start(self, *args: str) -> subprocess.Popen[str]:
        return self.children.adopt(
            subprocess.Popen(
                [*objq_command(), "worker", "--json", *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=environment(self.url),
            )
        )
