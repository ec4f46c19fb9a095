"""Command jobs: the payload format, and running one command with a timeout.

A command job's payload is one JSON object::

    {"argv": ["convert", "in.png", "out.jpg"], "timeout": 120, "env": {"LANG": "C"}, "cwd": "/srv"}
    {"argv": ["gzip -9 /var/log/app/*.log"], "shell": true}

``argv`` (required) is run as is, without a shell, unless ``shell`` is true: then it holds one
string, run by ``/bin/sh -c``. ``timeout`` (seconds) overrides the worker's ``--timeout``.
``env`` is added to the worker's environment; ``cwd`` is the directory to run in. Unknown
fields are refused, so a misspelt option is never silently ignored.

``env`` may not set a variable that changes which program runs or what code it loads
(:func:`loader_variable`: ``PATH``, ``LD_PRELOAD``, ``PYTHONPATH``, ``BASH_ENV``, ...) unless the
worker allows that name (``objq worker --allow-env NAME``): env is often filled in from data (a
locale, a file name), and these variables would turn such data into code run on the worker.

Each command runs in a process group of its own. On timeout the whole group gets SIGTERM, then
SIGKILL after :data:`KILL_GRACE_SECONDS`, so children a command started cannot outlive it.

A failed command's error is the end of its stderr, with the worker's secrets taken out
(:mod:`objq_broker.cli.redact`): it is stored where whoever reads the bucket reads it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Set
from dataclasses import dataclass
from typing import IO

import msgspec

from objq_broker.cli.redact import Redactor, keep_tail
from objq_broker.errors import ConfigurationError

#: Seconds a timed-out command's process group gets between SIGTERM and SIGKILL.
KILL_GRACE_SECONDS = 3.0
#: Characters of a failed command's stderr kept as the job's error (its end).
STDERR_TAIL_CHARS = 2000
#: Bytes read from the end of stderr to find them: more than kept, so that a secret the cut
#: would split is still whole when it is redacted.
STDERR_WINDOW_BYTES = 64 * 1024
#: How often a running command is checked for its deadline and for a forced stop.
POLL_SECONDS = 0.05
#: Environment variables a job may set only with the worker's leave (``--allow-env``): they
#: choose the program that runs, or code that the program, its shell or its runtime loads.
LOADER_VARIABLES = frozenset(
    {
        "PATH",
        "GCONV_PATH",
        "GETCONF_DIR",
        "LOCPATH",
        "NLSPATH",
        "BASH_ENV",
        "ENV",
        "IFS",
        "SHELLOPTS",
        "BASHOPTS",
        "PS4",
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONSTARTUP",
        "PYTHONUSERBASE",
        "PYTHONPLATLIBDIR",
        "PYTHONBREAKPOINT",
        "PERL5LIB",
        "PERLLIB",
        "PERL5OPT",
        "PERL5DB",
        "RUBYOPT",
        "RUBYLIB",
        "NODE_OPTIONS",
        "NODE_PATH",
        "CLASSPATH",
        "JAVA_TOOL_OPTIONS",
        "JDK_JAVA_OPTIONS",
        "_JAVA_OPTIONS",
    }
)
#: Prefixes of such variables: the dynamic loaders' own and bash's exported functions.
LOADER_PREFIXES = ("LD_", "DYLD_", "BASH_FUNC_")


class CommandJob(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """The payload of a command job (see the module docstring)."""

    argv: list[str]
    shell: bool = False
    timeout: float | None = None
    env: dict[str, str] = msgspec.field(default_factory=dict)
    cwd: str | None = None

    def encode(self) -> bytes:
        check(self)
        return msgspec.json.encode(self)

    def command(self) -> list[str]:
        return ["/bin/sh", "-c", self.argv[0]] if self.shell else list(self.argv)


_decoder = msgspec.json.Decoder(CommandJob)


def check(job: CommandJob) -> CommandJob:
    if not job.argv:
        raise ConfigurationError("command job: expected a non-empty argv, found []")
    for name in job.env:
        if not name or "=" in name or "\0" in name:
            raise ConfigurationError(
                f"command job: expected env names without '=' or NUL, found {name!r}"
            )
    texts = [*job.argv, *job.env.values(), job.cwd or ""]
    if any("\0" in text for text in texts):
        raise ConfigurationError("command job: expected argv, env and cwd without NUL characters")
    if job.shell and len(job.argv) != 1:
        raise ConfigurationError(
            f"command job: with shell, expected argv to hold one script, found {len(job.argv)} "
            "strings"
        )
    if job.timeout is not None and job.timeout <= 0:
        raise ConfigurationError(f"command job: expected a positive timeout, found {job.timeout}")
    return job


def loader_variable(name: str) -> bool:
    """Whether setting ``name`` changes which program a command runs or what code it loads."""
    upper = name.upper()  # the names are case-sensitive, but look-alikes are refused as well
    return upper in LOADER_VARIABLES or upper.startswith(LOADER_PREFIXES)


def check_env(job: CommandJob, allowed: Set[str]) -> CommandJob:
    """``job``, or :class:`ConfigurationError` naming the loader variables (see
    :func:`loader_variable`) its ``env`` sets that are not ``allowed``."""
    refused = sorted(name for name in job.env if loader_variable(name) and name not in allowed)
    if refused:
        names = ", ".join(repr(name) for name in refused)
        raise ConfigurationError(
            f"command job: env sets {names}, which changes what program runs or what code it "
            f"loads; refused (a worker started with --allow-env {refused[0]} accepts it)"
        )
    return job


def decode(payload: bytes) -> CommandJob:
    """The command job in ``payload``, or :class:`ConfigurationError` saying what is wrong."""
    try:
        return check(_decoder.decode(payload))
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ConfigurationError(
            f'command job: expected a JSON object like {{"argv": ["cmd", "arg"]}}, found '
            f"{payload[:60]!r} ({exc})"
        ) from exc


@dataclass(frozen=True)
class Outcome:
    """How one run of a command ended."""

    exit_code: int | None  # None when it could not start
    seconds: float
    error: str | None  # None on success
    stopped: bool = False  # killed because the worker is stopping: the job's fault it is not

    @property
    def ok(self) -> bool:
        return self.error is None


class ProcessGroups:
    """The process groups of the commands running now (thread-safe), so that a worker that must
    exit at once can kill them first rather than leave them orphaned."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._leaders: set[int] = set()

    def __len__(self) -> int:
        with self._lock:
            return len(self._leaders)

    def add(self, pid: int) -> None:
        with self._lock:
            self._leaders.add(pid)

    def discard(self, pid: int) -> None:
        with self._lock:
            self._leaders.discard(pid)

    def kill(self) -> int:
        """SIGKILL every group; returns how many there were."""
        with self._lock:
            leaders = list(self._leaders)
        for pid in leaders:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        return len(leaders)


def run(
    job: CommandJob,
    *,
    default_timeout: float | None,
    stdout: int | IO[bytes] | None,
    abort: threading.Event,
    redactor: Redactor,
    groups: ProcessGroups | None = None,
) -> Outcome:
    """Run ``job`` to its end, its timeout, or ``abort`` (which kills it like a timeout). Its
    process group is in ``groups`` while it runs; ``redactor`` takes the secrets out of the
    stderr that the error quotes."""
    timeout = job.timeout if job.timeout is not None else default_timeout
    env = {**os.environ, **job.env} if job.env else None
    started = time.monotonic()
    with tempfile.TemporaryFile() as stderr:
        try:
            process = subprocess.Popen(
                job.command(),
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                env=env,
                cwd=job.cwd,
                start_new_session=True,  # its own process group: a timeout kills all of it
            )
        except (OSError, ValueError) as exc:
            return Outcome(
                None, time.monotonic() - started, f"could not start {job.argv[0]}: {exc}"
            )
        if groups is not None:
            groups.add(process.pid)
        try:
            reason = _wait(process, None if timeout is None else started + timeout, abort)
            if reason is not None:
                _kill_group(process)
        finally:
            if groups is not None:
                groups.discard(process.pid)
        seconds = time.monotonic() - started
        code = process.returncode
        if reason is None and code == 0:
            return Outcome(0, seconds, None)
        tail = _tail(stderr, redactor)
        if reason == "timeout":
            what = f"timed out after {timeout:g} s; its process group was killed"
        elif reason == "abort":
            what = "stopped by the worker's shutdown; its process group was killed"
        elif code < 0:
            what = f"killed by {signal.Signals(-code).name}"
        else:
            what = f"exit code {code}"
        return Outcome(code, seconds, f"{what}: {tail}" if tail else what, reason == "abort")


def _wait(
    process: subprocess.Popen[bytes], deadline: float | None, abort: threading.Event
) -> str | None:
    while True:
        try:
            process.wait(POLL_SECONDS)
            return None
        except subprocess.TimeoutExpired:
            pass
        if abort.is_set():
            return "abort"
        if deadline is not None and time.monotonic() >= deadline:
            return "timeout"


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    for sig, grace in ((signal.SIGTERM, KILL_GRACE_SECONDS), (signal.SIGKILL, None)):
        with contextlib.suppress(ProcessLookupError):  # the group may be gone already
            os.killpg(process.pid, sig)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            continue
        if sig is signal.SIGTERM:
            # The leader is gone, but members of its group may linger: finish them too.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        return


def _tail(stream: IO[bytes], redactor: Redactor) -> str:
    """The end of a command's stderr, secrets redacted, saying so when it was cut."""
    stream.seek(0, os.SEEK_END)
    length = stream.tell()
    start = max(length - STDERR_WINDOW_BYTES, 0)
    stream.seek(start)
    text = stream.read().decode("utf-8", errors="replace")
    if start and "\n" in text:
        # The window began inside a line, maybe inside a secret that no pattern knows by half.
        text = text.partition("\n")[2]
    text = redactor.redact(text).strip()
    total = f"{length:,} bytes" if start or len(text) > STDERR_TAIL_CHARS else None
    return keep_tail(text, STDERR_TAIL_CHARS, what="stderr", total=total)
